"""Compiling with numba-cuda-mlir for an arch we name, on a machine with no driver.

The one workaround for upstream behaviour lives here, and removes itself.

numba-cuda-mlir 0.6.0 resolves a compile's target in `tools.resolve_gpu_target`,
which asks the driver for the *host* GPU's compute capability
(`get_gpu_compute_capability`) even when the target arch (`chip`/`cc`) is given. On a
machine without a driver every compile then fails with `CudaSupportError`; on a GPU
machine whose GPU is newer than the arch asked for, the cubin it links is made for the
host's arch instead (`linker_cc = host_cc` when `cc < host_cc`). `pinned_target(cc)`
answers that question with the arch being built, through the cache the lookup itself
consults first (`tools._cached_cc`; the function was imported by name elsewhere, so
replacing it would miss callers), and restores it afterwards.

It is applied only while upstream needs it: `upstream_asks_the_host()` resolves a
target whose arch is given with the driver look-up made to fail, once per process; an
upstream that no longer asks the host when the arch is given gets no pin at all.

Also here, for a compile whose bytes depend on its inputs alone:
- `stable_callee_names()`: 0.6.0 names a device function it does not inline after the
  memory address of its dispatcher (`f"{qualname}_{id(fn)}"`, `mlir_lowering.py`), so
  the PTX of a kernel calling one differs from process to process; the address is
  replaced by the callee's number in order of first appearance within the compile.
- `record_names()`: a record type is mangled into symbol names by its per-process
  creation number (`Record._code`), so a kernel taking one had an entry name that
  depends on what else the process typed; it is mangled by its layout's digest instead;
- `fork_safe()`: numba-cuda-mlir lowers every compile in one process-wide MLIR context,
  whose verifier runs on the context's thread pool; a worker forked from a process that
  made that context (a kernel compiled at import) inherits a pool whose threads do not
  exist there, and its first compile waits for them forever. kbuild forks its compile
  workers, so the context runs its work on the calling thread;
- `retarget(device_functions, arch)`: a device function is compiled for its caller with
  its *own* options and kept per argument types only, across archs; before a compile
  for `arch` every reachable one is set to that arch, its compiled forms dropped when
  they were made for another.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from functools import lru_cache

_lock = threading.RLock()


class _AskedTheDriver(Exception):
    """Raised by the stand-in for the driver look-up while probing upstream."""


@lru_cache(maxsize=1)
def upstream_asks_the_host() -> bool:
    """Whether numba-cuda-mlir's target resolution asks the driver for the host GPU's
    compute capability although the target arch is given (0.6.0 does)."""
    from numba_cuda_mlir import tools
    from numba_cuda_mlir.numba_cuda.cudadrv import devices

    def asked(*args, **kwargs):
        raise _AskedTheDriver

    with _lock:
        saved = tools._cached_cc, devices.get_context
        tools._cached_cc, devices.get_context = None, asked
        try:
            tools.resolve_gpu_target({"chip": "sm_80"})
        except _AskedTheDriver:
            return True
        finally:
            tools._cached_cc, devices.get_context = saved
    return False


def fork_safe() -> None:
    """Make numba-cuda-mlir's shared MLIR context single-threaded (see the docstring): done
    before anything of it compiles in a process that may fork compile workers."""
    from numba_cuda_mlir.lowering_utilities.context import get_context

    get_context().enable_multithreading(False)


@contextlib.contextmanager
def pinned_target(cc: tuple):
    """Within the block numba-cuda-mlir takes `cc` for the host's compute capability,
    while upstream asks for it when it need not (see the module's docstring)."""
    fork_safe()
    if not upstream_asks_the_host():
        yield
        return
    from numba_cuda_mlir import tools

    with _lock:
        saved = tools._cached_cc
        tools._cached_cc = tuple(cc[:2])
        try:
            yield
        finally:
            tools._cached_cc = saved


@contextlib.contextmanager
def stable_callee_names():
    """Within the block, a device function that is not inlined is named after its order
    of first appearance in the compile instead of its dispatcher's memory address."""
    from numba_cuda_mlir import mlir_lowering

    original = mlir_lowering.generate_mangled_name
    numbered: dict = {}  # id -> (number, object): kept alive, so no id is reused meanwhile

    def stable(name, argtypes):
        # The two upstream call sites name the object `fn` and `overload_disp`.
        caller = sys._getframe(1).f_locals
        for local in ("fn", "overload_disp"):
            obj = caller.get(local)
            suffix = f"_{id(obj)}"
            if obj is not None and isinstance(name, str) and name.endswith(suffix):
                number, _ = numbered.setdefault(id(obj), (len(numbered) + 1, obj))
                name = f"{name[:-len(suffix)]}_{number}"
                break
        return original(name, argtypes)

    with _lock:
        mlir_lowering.generate_mangled_name = stable
        try:
            yield
        finally:
            mlir_lowering.generate_mangled_name = original


@contextlib.contextmanager
def record_names():
    """Within the block, record types are mangled by their layout (see the docstring)."""
    from numba_cuda_mlir.numba_cuda.types import npytypes

    from ...keying.encode import digest_of
    from ...keying.values import type_canonical

    def mangling_args(self):
        return type(self).__name__, (int(digest_of(type_canonical(self))[:12], 16),)

    with _lock:
        own = npytypes.Record.__dict__["mangling_args"]
        npytypes.Record.mangling_args = property(mangling_args)
        try:
            yield
        finally:
            npytypes.Record.mangling_args = own


def retarget(device_functions, arch: str) -> None:
    """Set every reachable lazily compiled device function to compile for `arch`, dropping
    what it compiled for another arch (an eagerly compiled one keeps its only overloads)."""
    from numba_cuda_mlir.descriptor import MLIRDispatcher

    for disp in device_functions:
        if not isinstance(disp, MLIRDispatcher) or not disp._can_compile:
            continue
        if disp.targetoptions.get("chip") != arch:
            disp.overloads.clear()
            disp.__dict__.pop("_device_dispatcher", None)
            disp.targetoptions["chip"] = arch
