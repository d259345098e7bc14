"""The compiler adapter: numba-cuda + NVVM + nvJitLink, for an architecture we name.

numba-cuda asks the current device for its compute capability when it types a
call to a device function and when it compiles eagerly (`@cuda.jit("sig")`);
without a driver both fail. `targeting(cc)` answers those questions with the
architecture being built, never the machine's, so ordinary user code builds on
a CPU-only CI runner. The kernel is then compiled exactly as numba's own
dispatcher would (`_Kernel` with the decorator's options) and its PTX and
linked cubin are taken from the code library.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

_lock = threading.RLock()
_state = {"cc": None, "depth": 0, "saved": None}


@dataclass(frozen=True)
class Artifacts:
    """What one compiled target produced."""

    ptx: bytes
    cubin: bytes
    entry: str
    cooperative: bool


class _TargetDevice:
    """Stands in for the current device: only its compute capability is asked."""

    def __init__(self, cc):
        self.compute_capability = cc[:2]


@contextlib.contextmanager
def targeting(cc: tuple):
    """Within this block numba-cuda compiles for `cc` instead of asking a driver."""
    if simulating():
        yield  # the simulator compiles nothing
        return
    from numba.cuda import codegen, compiler, dispatcher

    with _lock:
        previous = _state["cc"]
        if _state["depth"] == 0:
            _state["saved"] = (dispatcher.get_current_device, compiler.get_current_device,
                               codegen.CUDACodeLibrary._ensure_cc, dispatcher._Kernel.bind)
            dispatcher.get_current_device = compiler.get_current_device = \
                lambda: _TargetDevice(_state["cc"])
            codegen.CUDACodeLibrary._ensure_cc = \
                lambda self, want: want if want is not None else _state["cc"]
            # An eager @cuda.jit("sig") binds its kernel to a context right after
            # compiling it at import; there is no context to bind to while building.
            dispatcher._Kernel.bind = lambda self: None
        _state["cc"] = tuple(cc)
        _state["depth"] += 1
        try:
            yield
        finally:
            _state["depth"] -= 1
            _state["cc"] = previous
            if _state["depth"] == 0:
                (dispatcher.get_current_device, compiler.get_current_device,
                 codegen.CUDACodeLibrary._ensure_cc, dispatcher._Kernel.bind) = _state["saved"]


def simulating() -> bool:
    """Whether numba-cuda runs its simulator (NUMBA_ENABLE_CUDASIM=1) in this process."""
    from numba.cuda import config

    return bool(config.ENABLE_CUDASIM)


def compile_kernel(kernel, argtypes, cc: tuple, device_functions=()) -> Artifacts:
    """Compile `kernel` (a CUDADispatcher) for `argtypes` and `cc` into PTX and a cubin.

    `device_functions` are the lazily compiled device dispatchers it reaches.
    Each kernel compiles from a clean slate - their cached overloads dropped,
    numba's function numbering restarted - so its PTX and cubin do not depend
    on what the process compiled before (numba mangles a per-process counter
    into symbol names) nor on the architecture of an earlier compile.
    """
    from numba.cuda.dispatcher import _Kernel

    with targeting(cc):
        _clean_slate(device_functions)
        compiled = _Kernel(kernel.py_func, tuple(argtypes), **kernel.targetoptions)
        library = compiled._codelibrary
        ptx = library.get_asm_str(cc=tuple(cc))
        cubin = library.get_cubin(cc=tuple(cc))
    return Artifacts(
        ptx=ptx.encode(),
        cubin=bytes(getattr(cubin, "code", cubin)),
        entry=compiled.entry_name,
        cooperative=bool(compiled.cooperative),
    )


def _clean_slate(device_functions) -> None:
    import itertools

    from numba.core import bytecode as core_bytecode
    from numba.cuda.core import bytecode as cuda_bytecode

    for module in (core_bytecode, cuda_bytecode):
        module.FunctionIdentity._unique_ids = itertools.count(1)
    for disp in device_functions:
        if getattr(disp, "_can_compile", False):  # eager ones keep their only overloads
            disp.overloads.clear()
