"""numba-cuda pinned to an architecture we name, with no driver and no device.

numba-cuda asks the current device for its compute capability when it types a
call to a device function and when it compiles eagerly (`@cuda.jit("sig")`);
without a driver both fail. `targeting(cc)` answers those questions with the
architecture being built, never the machine's, so ordinary user code builds on
a CPU-only CI runner; importing a project's modules (`discover`), rebuilding a
stored kernel's numba object (`loader`) and every compile run within it. While
it holds, a code library also links its libraries and files in the order they
were added, not in set order (`_ordered_init`), and `arch_as_asked` keeps NVVM's
arch option on the arch being built for the length of a compile.
"""

from __future__ import annotations

import contextlib
import threading

_lock = threading.RLock()
_state = {"cc": None, "binds": False, "depth": 0, "saved": None}


class _TargetDevice:
    """Stands in for the current device: only its compute capability is asked."""

    def __init__(self, cc):
        self.compute_capability = cc[:2]


@contextlib.contextmanager
def targeting(cc: tuple, binds: bool = False):
    """Within this block numba-cuda compiles for `cc` instead of asking a driver.
    `binds`: a (stand-in) driver is there, so a compiled kernel is loaded as on a GPU
    (numba binds a kernel before `cache=True` saves it); otherwise binding does nothing."""
    if simulating():
        yield  # the simulator compiles nothing
        return
    with _lock:
        previous = _state["cc"], _state["binds"]
        if _state["depth"] == 0:
            patches = _target_patches()
            _state["saved"] = [(holder, name, getattr(holder, name))
                               for holder, name, _ in patches]
            for holder, name, replacement in patches:
                setattr(holder, name, replacement)
        _state["cc"], _state["binds"] = tuple(cc), binds
        _state["depth"] += 1
        try:
            yield
        finally:
            _state["depth"] -= 1
            _state["cc"], _state["binds"] = previous
            if _state["depth"] == 0:
                for holder, name, original in _state["saved"]:
                    setattr(holder, name, original)


def _target_patches() -> list:
    """(holder, attribute, replacement) of each part of numba-cuda that `targeting`
    replaces: where it asks the device for its capability, and what a build needs
    instead of a device."""
    from numba.cuda import codegen, compiler, dispatcher

    return [(dispatcher, "get_current_device", _target_device),
            (compiler, "get_current_device", _target_device),
            (codegen.CUDACodeLibrary, "_ensure_cc", _ensure_target_cc),
            (dispatcher._Kernel, "bind", _bind_to_target),
            (codegen.CUDACodeLibrary, "__init__", _ordered_init(codegen.CUDACodeLibrary.__init__))]


def _target_device():
    """The "current device" typing asks for: the arch being built."""
    return _TargetDevice(_state["cc"])


def _ensure_target_cc(self, want):
    """A code library's arch: the one asked for, else the arch being built; under a
    stand-in driver (`binds`), what numba-cuda's JIT asks of a device of its cc."""
    if want is not None:
        return want
    cc = _state["cc"]
    return library_cc(cc) if _state["binds"] and len(cc) == 2 else cc


def library_cc(device_cc: tuple) -> tuple:
    """The cc numba-cuda's code library compiles for on a device of `device_cc`, the key
    of its binary caches (`CUDACodeLibrary._ensure_cc`): the arch-specific target from
    9.0 on, (9, 0) -> (9, 0, 'a'); (8, 6) -> (8, 6, '')."""
    cc = tuple(device_cc[:2])
    return cc + ("a" if cc >= (9, 0) else "",)


def jit_cc(device_cc: tuple) -> tuple:
    """The cc numba-cuda's JIT compiles for on a device of `device_cc` (NUMBA_FORCE_CUDA_CC
    aside), as kbuild names a target's arch: `library_cc` without an empty suffix. On a
    device newer than the toolchain numba cannot compile the arch-specific target
    (`nvrtc.get_arch_option` refuses to lower an 'a' arch to an older cc), so the
    device's plain cc is kept, as before: its compile fails to link and numba, compiling
    it instead, says why."""
    from .toolchain import supported_ccs

    cc = library_cc(device_cc)
    supported = supported_ccs()
    if not cc[2] or (supported is not None and cc[:2] not in supported):
        return cc[:2]
    return cc


def _bind_to_target(self):
    """An eager @cuda.jit("sig") binds its kernel to a context right after compiling it
    at import, and `cache=True` binds before it saves: while building there is no
    context to bind to; under a stand-in driver the kernel is loaded, as on a GPU."""
    if _state["binds"]:
        self._codelibrary.get_cufunc()



@contextlib.contextmanager
def arch_as_asked():
    """The arch a target is compiled for is the arch its code is made for. numba's NVVM
    arch option follows NUMBA_FORCE_CUDA_CC whatever it is asked; that variable chooses
    the arch of a device's targets instead (`launcher.compile_arch`), never another
    arch's code under this one's name."""
    from numba.cuda import config

    forced, config.FORCE_CUDA_CC = config.FORCE_CUDA_CC, None
    try:
        yield
    finally:
        config.FORCE_CUDA_CC = forced


class _OrderedSet(dict):
    """A set that iterates in insertion order (a dict's keys), never in hash order."""

    def add(self, item):
        self[item] = None

    def update(self, items):
        for item in items:
            self[item] = None


def _ordered_init(original):
    """numba-cuda links a kernel's libraries and files in `set` order, which follows
    memory addresses and PYTHONHASHSEED; link them in the order they were added."""

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._linking_libraries = _OrderedSet.fromkeys(self._linking_libraries)
        self._linking_files = _OrderedSet.fromkeys(self._linking_files)

    return __init__


def simulating() -> bool:
    """Whether numba-cuda runs its simulator (NUMBA_ENABLE_CUDASIM=1) in this process."""
    from numba.cuda import config

    return bool(config.ENABLE_CUDASIM)
