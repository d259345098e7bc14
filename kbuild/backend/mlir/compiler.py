"""The compiler adapter for numba-cuda-mlir: one target to PTX and a cubin, for an arch we name.

The kernel is compiled by a fresh `MLIRDispatcher` of its Python function with every
one of the decorator's options and the target's arch (never `cuda.compile(dispatcher,
cc=...)`: that keeps the arch the dispatcher's first compile pinned, and drops most
options), and asked for no `output` (`output="ptx"` turns the kernel's `lto` off). Its
compile lowers to MLIR, through NVVM to PTX (or LTO-IR where the kernel's link plan is
LTO: `lto=True`, or LTO-IR among its link files) and links a cubin with nvJitLink for
that arch (with `max_registers`, its link files and, for a grid sync, cudadevrt): the
cubin is taken as it made it, which is the one its launcher loads (`_compile_impl`
returns `metadata["cubin"]`), and the PTX is that program's (`program_ptx`). No driver
is asked (`nodriver`). tests/test_mlir_equivalence.py holds both to its JIT's.

Device functions are always compiled into their callers: upstream inlines small ones
in numba IR and clones the MLIR of the others into the caller's module; it has no
option that makes an ordinary device function an object of its own. So every target
is built as one program, and a `link=` file or `declare_device` code is linked by the
compile itself.
"""

from __future__ import annotations

import contextlib
import os

from ...store.manifest import built_problem
from ..base import Artifacts
from ..observe import FrontEnd, linked_paths, observing
from .nodriver import pinned_target, record_names, retarget, stable_callee_names
from .symbols import content_names

# Where numba-cuda-mlir's vendored copy of numba's front end lives (its observation hooks).
FRONT_END = FrontEnd(cores=("numba_cuda_mlir.numba_cuda.core",),
                     typings=("numba_cuda_mlir.numba_cuda.typing",),
                     bases=("numba_cuda_mlir.numba_cuda.core",),
                     models=("numba_cuda_mlir.numba_cuda.datamodel.manager",),
                     nvrtc="numba_cuda_mlir.numba_cuda.cudadrv.nvrtc",
                     # A device function called from a kernel is compiled (and kept per
                     # argument types) by `_compile_device_callee`; an eager one at its
                     # import by `compile_device`, without its return type; a call to
                     # either is typed by `get_call_template`.
                     device_compiles=(("numba_cuda_mlir.descriptor", "MLIRDispatcher",
                                       "_compile_device_callee"),
                                      ("numba_cuda_mlir.descriptor", "MLIRDispatcher",
                                       "compile_device")),
                     device_calls=(("numba_cuda_mlir.descriptor", "MLIRDispatcher",
                                    "get_call_template"),),
                     eager_compile=("compile_device", False))
WHOLE_PROGRAM = ("numba-cuda-mlir compiles device functions into their callers "
                 "(no separately compiled objects)")


def arch_name(cc: tuple) -> str:
    """(9, 0) -> 'sm_90'; (9, 0, 'a') -> 'sm_90a'."""
    return f"sm_{cc[0]}{cc[1]}{cc[2] if len(cc) > 2 else ''}"


def compile_kernel(kernel, argtypes, cc: tuple, device_functions=(), observer=None) -> Artifacts:
    """Compile `kernel` (an MLIRDispatcher) for `argtypes` and `cc` into PTX and a cubin,
    recording what its front end consulted in `observer` (an `observe.Observer`)."""
    from numba_cuda_mlir.descriptor import MLIRDispatcher

    arch = arch_name(cc)
    options = dict(kernel.targetoptions, chip=arch, cc=tuple(cc[:2]))
    watching = observing(observer, FRONT_END) if observer is not None \
        else contextlib.nullcontext()
    with pinned_target(cc), stable_callee_names(), record_names(), content_names(), \
            watching:
        retarget(device_functions, arch)
        try:
            # No `output=`: `compile(output="ptx")` sets the kernel's `lto` to False,
            # and the cubin would not be the one its launcher loads (see `program_ptx`).
            result = MLIRDispatcher(kernel.py_func, targetoptions=options).compile(
                tuple(argtypes))
            ptx = program_ptx(result)
        except Exception as exc:  # noqa: BLE001 - reworded when it is upstream's ICE
            raise _explained(exc) from exc
    metadata = result.metadata
    if observer is not None:
        linked_paths(observer, metadata.get("linked_external_link_items") or ())
    made = {"ptx": (ptx.encode() if isinstance(ptx, str) else bytes(ptx)).rstrip(b"\x00"),
            "cubin": bytes(metadata["cubin"])}
    problem = built_problem(arch, metadata["func_name"], made)
    if problem:  # never commit what the store would refuse to serve
        raise RuntimeError(f"numba-cuda-mlir made artifacts kbuild cannot use: {problem}")
    return Artifacts(
        ptx=made["ptx"],
        cubin=made["cubin"],
        entry=metadata["func_name"],
        cooperative=bool(metadata.get("use_cooperative")),
        # No "reason": that is a note on a target kbuild could have split; here it is the
        # backend's way with every target (README: Backends).
        link={"mode": "whole", "backend": WHOLE_PROGRAM},
    )


def program_ptx(result) -> str:
    """The PTX of the program whose cubin a compile made, as numba-cuda-mlir's launcher
    would load it: a kernel whose link plan is LTO (`lto=True`, or LTO-IR among its link
    files) is compiled to LTO-IR and linked by nvJitLink's LTO, whose own float defaults
    decide (no `.ftz` under `fastmath`): that link's PTX (`get_lto_ptx`); else NVVM's
    PTX, which nvJitLink assembles. Made on request: called where the arch is pinned."""
    plan = result.metadata.get("link_plan")
    if plan is not None and plan.compile_new_inputs_as_ltoir:
        from numba_cuda_mlir.mlir_optimization import get_lto_ptx

        return get_lto_ptx(result.cres)
    return result.ptx


class CompilerBug(Exception):
    """numba-cuda-mlir reported an internal compiler error: what it is, where."""


def _explained(exc: Exception) -> Exception:
    """numba-cuda-mlir reports an internal error as `UserFacingInternalCompilerError`,
    whose message names only the line and a log file under /tmp (written per failure),
    and whose context is the error itself: say that error, and remove the log."""
    if type(exc).__name__ != "UserFacingInternalCompilerError":
        return exc
    cause = exc.__context__
    lines = str(exc).splitlines()
    log = next((line.strip() for line in lines if "numba_cuda_mlir_error_" in line), None)
    if log and os.path.isfile(log):
        os.unlink(log)
    what = f"{type(cause).__name__}: {str(cause).strip().splitlines()[0]}" \
        if cause is not None and str(cause).strip() else lines[0]
    return CompilerBug(f"numba-cuda-mlir cannot compile it: {what}")


def set_up_again() -> None:
    """numba-cuda-mlir loads its registries' entries at a process's first compile only
    (`ensure_initialized`), not at every compile as numba-cuda does: a kernel of a
    project imported again (`kbuild watch`) using an overload its new import registered
    failed to type ("Untyped global name"), where a fresh process compiles it. Its next
    compile loads them again, as a first compile does (and with the same timing: a
    registration made after that compile is unseen, in a fresh process too)."""
    import sys

    # Its own target, and the vendored numba-cuda target its device functions type with.
    for module, name in (("numba_cuda_mlir.descriptor", "mlir_target"),
                         ("numba_cuda_mlir.numba_cuda.descriptor", "cuda_target")):
        target = getattr(sys.modules.get(module), name, None)
        if target is not None and hasattr(target, "_typingctx_initialized"):
            target._typingctx_initialized = target._targetctx_initialized = False


def prepare() -> None:
    """Load its typing and lowering registries now (about a second), and index them when
    they hold the project's registrations (see `compiler.prepare`)."""
    try:
        from numba_cuda_mlir.descriptor import mlir_target

        mlir_target.ensure_initialized()
        from .. import registrations

        registrations.prepare()
    except Exception:  # noqa: BLE001 - only a head start: the first compile does it anyway
        pass
