"""The compiler adapter: numba-cuda + NVVM + nvJitLink, one kernel to PTX and a cubin.

The kernel is compiled exactly as numba's own dispatcher would (`_Kernel` with the
decorator's options), for the arch being built (`targeting`) and under the patches
that make its bytes depend on the kernel alone (`reproducible`, `numbering`):
`_kbuild_patches` lists them all. Its PTX and linked cubin are taken from the code library, or its
kernel and device functions are linked as LTO-IR objects of their own (`lto`).
"""

from __future__ import annotations

import contextlib
import warnings

from .base import Artifacts  # noqa: F401 - where the build has always imported it from
from .numbering import numbering
from .reproducible import (const_bytes_names, debug_paths, dispatcher_names, flag_names,
                           internal_functions, record_names, shared_memory_names)
from .targeting import arch_as_asked, simulating, targeting


def prepare() -> None:
    """Do numba's one-time set-up of a process's first compile now (loading its typing and
    lowering registries and the modules that fill them: most of a second), import what a
    first compile imports, index the registries when they hold the project's
    registrations (`registrations.prepare`) and find libdevice. A process about to fork
    compile workers calls it first, so each worker starts with all of it done instead of
    paying it again (nothing here starts a thread or touches a driver), and a compile's
    time limit measures the compile; `kbuild watch` calls it while it waits for a save.
    Again, it costs milliseconds."""
    if simulating():
        return
    try:
        from numba.cuda.descriptor import cuda_target

        cuda_target.typing_context.refresh()
        cuda_target.target_context.refresh()
        _first_compile_imports()
        from . import registrations

        registrations.prepare()
        from numba.cuda.cudadrv import libs

        libs.get_libdevice()  # where libdevice is: searched for once per process
    except Exception:  # noqa: BLE001 - only a head start: the first compile does it anyway
        pass


def _first_compile_imports() -> None:
    # The modules a first compile imports: numba's that the observer hooks and that
    # `typeof` reaches for (a data model manager and cffi_utils hold registries, so the
    # index made next would be stale in every worker without them), the types the
    # reproducibility patches patch, separate compilation's own.
    from numba.cuda.types import cuda_functions, cuda_npytypes  # noqa: F401
    try:  # numba's own `typeof`, where numba is installed beside numba-cuda
        from numba.core.typing import bufproto, cffi_utils  # noqa: F401
    except ImportError:
        pass

    from . import debugpaths, lto  # noqa: F401
    from .observe.hooks import load_hooked

    load_hooked()


def compile_kernel(kernel, argtypes, cc: tuple, device_functions=(), stable_ids=None,
                   apart=None, observer=None, outputs=None, source_roots=()) -> Artifacts:
    """Compile `kernel` (a CUDADispatcher) for `argtypes` and `cc` into PTX and a cubin.

    `device_functions` are the lazily compiled dispatchers it reaches: numba
    caches their compiled form per argument types only, so a cache made for
    another architecture is dropped first. numba mangles a per-process function
    number into symbol names; `stable_ids` (py_func -> number, from identity)
    replaces it for keyed functions and the counter restarts for each kernel, so
    a kernel's PTX and cubin do not depend on what the process compiled before.

    With `apart` = (function trees by dispatcher, the target's key tree), the
    kernel and each device function become LTO-IR objects of their own, linked
    with link-time optimisation (see `lto`); a kernel that cannot be split is
    built as one program, as numba builds it, and the reason is recorded.

    An `observe.Observer` records what numba consulted meanwhile (see `observe`).

    `outputs` (the build's `cutoff.Outputs`, or None) offers what earlier builds made
    from the same bytes: stored objects' LTO-IR, links' and assemblies' outputs (early
    cutoff: see `lto.link`). What it gave is said in the artifacts' `cutoff`.
    `source_roots` (the project's import roots) are where a debug binary's source paths
    are written relative to (see `debugpaths`).
    """
    stable_ids = stable_ids or {}
    with _as_kbuild_compiles(cc, stable_ids, source_roots), _driver_explained():
        if observer is None:
            return _compile(kernel, argtypes, cc, device_functions, apart, outputs)[0]
        from .observe import link_files, observing

        with observing(observer):
            artifacts, library = _compile(kernel, argtypes, cc, device_functions, apart,
                                          outputs)
        link_files(observer, library)
        return artifacts


class NeedsDriver(OSError):
    """numba-cuda asked for the NVIDIA driver during a compile (a build needs none). An
    OSError: what this machine lacks, so never recorded as the key's failure."""


@contextlib.contextmanager
def _driver_explained():
    """numba-cuda's own compile reaches for the driver in one case a user can write: CUDA C
    linked to a kernel whose `lto` is off, whose PTX NVRTC makes for the driver's version.
    Said so, with what to do, instead of the library loader's message alone."""
    try:
        yield
    except Exception as exc:
        if type(exc).__name__ != "DynamicLibNotFoundError" or "driver" not in str(exc):
            raise
        raise NeedsDriver(
            f"this compile needs the NVIDIA driver ({exc}). numba-cuda compiles CUDA C "
            "linked to a kernel with lto=False (link=[...] .cu files, declare_device "
            "sources) to PTX for the driver's version: build it where the driver is "
            "installed, or leave the kernel's lto on (numba-cuda's default), under "
            "which the CUDA C becomes LTO-IR and no driver is asked") from exc


def _kbuild_patches(cc: tuple, stable_ids: dict, source_roots) -> list:
    """numba-cuda as a kbuild compile needs it, one named patch each (a context manager,
    entered in this order and left in reverse)."""
    return [
        targeting(cc),                 # the arch asked for, and no device
        arch_as_asked(),               # NVVM's arch option too, whatever NUMBA_FORCE_CUDA_CC says
        numbering(stable_ids),         # function numbers from identity or content, not order
        record_names(),                # records mangled by their layout
        dispatcher_names(stable_ids),  # functions passed as arguments: by name and number
        internal_functions(),          # lowering helpers kept per kernel and inherited flags
        flag_names(),                  # flags' sets and dicts spelled sorted
        const_bytes_names(),           # string constants named by their bytes, not hash()
        shared_memory_names(),         # shared arrays named by their function, not a count
        debug_paths(source_roots),     # debug binaries' source paths against placeholders
    ]


@contextlib.contextmanager
def _as_kbuild_compiles(cc: tuple, stable_ids: dict, source_roots):
    """Within the block, every patch of `_kbuild_patches` holds, under numba's compiler
    lock: the patches are process-wide, so another thread's numba compile (a program's
    own JIT beside an in-process build) never runs under them, and two kbuild compiles
    never save each other's patch as the original. A reentrant lock: a zero-config
    compile already holds it (numba's dispatcher took it)."""
    from numba.cuda.core.compiler_lock import global_compiler_lock

    with contextlib.ExitStack() as patches:
        patches.enter_context(global_compiler_lock)
        for patch in _kbuild_patches(cc, stable_ids, source_roots):
            patches.enter_context(patch)
        yield


def _compile(kernel, argtypes, cc, device_functions, apart, outputs=None):
    """(Artifacts, the kernel's code library) of one compile."""
    from numba.cuda.dispatcher import _Kernel

    _forget_other_arch(device_functions, tuple(cc))
    with _ptx_deferred() if apart else contextlib.nullcontext():
        compiled = _Kernel(kernel.py_func, tuple(argtypes), **kernel.targetoptions)
    library = compiled._codelibrary
    try:
        made = _split(compiled, cc, device_functions, apart, outputs)
        if isinstance(made, tuple):
            return _linked(compiled, cc, made, kernel.targetoptions, outputs), library
    except Exception as exc:  # noqa: BLE001 - numba's own way still works
        made = f"separate compilation failed ({type(exc).__name__}: {exc})"
    reused, keys = _stored_cubin(library, tuple(cc), compiled.entry_name, outputs)
    ptx = _launched_ptx(library, tuple(cc))
    cubin = library.get_cubin(cc=tuple(cc))
    return Artifacts(
        ptx=ptx.encode(),
        cubin=bytes(getattr(cubin, "code", cubin)),
        entry=compiled.entry_name,
        cooperative=bool(compiled.cooperative),
        link={"mode": "whole", "reason": made or "separate compilation not asked for"},
        cutoff=reused, outputs=keys,
    ), library


def _launched_ptx(library, cc: tuple) -> str:
    """The PTX of the program numba's `get_cubin` assembles: under the kernel's `lto`
    option (numba-cuda's default), the link-time-optimised PTX of its LTO-IR, whose float
    semantics are nvJitLink's defaults, not the `.ftz` of NVVM's PTX before the link (see
    `lto.link_flags`); else NVVM's PTX. So too for a program that links files or
    cudadevrt: its LTO PTX holds what of them is LTO-IR (a `.cu` file's code, inlined),
    and a PTX fallback links the rest as it links them to NVVM's PTX (`loader.link_ptx`);
    NVVM's PTX would give a newer device a fastmath kernel's `.ftz`, which numba's
    binary for that device does not have."""
    if getattr(library, "_lto", False):
        with warnings.catch_warnings():
            # numba says so of each file its LTO PTX leaves out (not LTO-IR: cudadevrt,
            # a .ptx or .o file): the fallback links those.
            warnings.filterwarnings("ignore", "Not adding ", UserWarning)
            return library.get_lto_ptx(cc=cc)
    return library.get_asm_str(cc=cc)


def _stored_cubin(library, cc: tuple, entry: str, outputs):
    """(cutoff, cutoff keys) of a whole program's cubin: when `outputs` holds the cubin an
    earlier build made from the same bytes (the program's LTO-IR, which numba links with
    nvJitLink when it can, else its PTX), the library is given it and numba's
    `get_cubin` makes nothing. Only for a cubin made from the program alone: linked
    files and cudadevrt put other bytes into it."""
    if outputs is None or library._linking_files or library.needs_cudadevrt:
        return None, ()
    from ..keying.cutoff import step_options

    lto = bool(getattr(library, "_lto", False))
    # What get_cubin will hand to the linker; made (and cached by numba) here instead.
    inputs = [bytes(library.get_ltoir(cc=cc))] if lto else \
        [p.encode() for p in library.get_asm_strs(cc=cc)]
    options = step_options(cc, getattr(library, "_max_registers", None)) + (("lto", lto),)
    key, cubin = outputs.cubin(inputs, options, entry)
    if cubin is None:
        return None, (key,)
    library._cubin_cache[cc] = cubin
    return "cubin", (key,)


def _split(compiled, cc, device_functions, apart, outputs=None):
    if not apart:
        return None
    from .lto import split

    return split(compiled, cc, device_functions, *apart, outputs=outputs)


def _linked(compiled, cc, made, options, outputs=None) -> Artifacts:
    from .lto import link

    linked = link([o.ltoir for o in made], cc, max_registers=options.get("max_registers"),
                  outputs=outputs, entry=compiled.entry_name,
                  flags=made[0].manifest["link_flags"], lto=made[0].manifest["lto"])
    return Artifacts(ptx=linked.ptx, cubin=linked.cubin, entry=compiled.entry_name,
                     cooperative=bool(compiled.cooperative),
                     link={"mode": "lto", "objects": [o.key for o in made]}, objects=made,
                     cutoff=linked.cutoff, outputs=linked.keys)


@contextlib.contextmanager
def _ptx_deferred():
    """numba's `_Kernel` makes the whole program's PTX only to search it for the names of
    two helper libraries (reshape functions, NRT); a separately compiled kernel never uses
    that PTX. Let the search read the LLVM IR, where the same names appear, instead.
    NRT's search needs PTX syntax, so with NRT enabled nothing is deferred."""
    from numba.cuda import codegen
    from numba.cuda.core import config

    if getattr(config, "CUDA_ENABLE_NRT", False):
        yield
        return
    original = codegen.CUDACodeLibrary.get_asm_str
    codegen.CUDACodeLibrary.get_asm_str = lambda self, cc=None: self.get_llvm_str()
    try:
        yield
    finally:
        codegen.CUDACodeLibrary.get_asm_str = original


def _forget_other_arch(device_functions, cc) -> None:
    for disp in device_functions:
        if getattr(disp, "_can_compile", False) and getattr(disp, "_kbuild_cc", cc) != cc:
            disp.overloads.clear()  # eager ones keep their only overloads
        disp._kbuild_cc = cc
