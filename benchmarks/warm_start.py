"""A warm start: every declared kernel made launch-ready from a warm store, no compiling.

    python benchmarks/warm_start.py PROJECT_DIR STORE_DIR [--one-plan]

What a program using kbuild pays at start-up on a machine without a GPU:
`Project.load()`, then for each (kernel, signature) recompute its key from the
current sources (`_fresh_manifest`), read the verified cubin and rebuild
numba-cuda's `_Kernel` around it (`kbuild.backend.loader.rebuild_kernel`), as a
launcher does before its first launch. On a GPU, `launcher.prepare(signature)`
does the same plus the driver's module load. Calls into numba's compiler and
NVVM are counted: a warm start must make none. Prints one JSON line.

--one-plan keys every target in one `proj.plan()` and looks the keys up in the
store instead: what a warm start would cost if launchers shared one plan (and
its memo of device-function keys) rather than keying each kernel in plans of
its own.
"""

import time

START = time.perf_counter()

import json  # noqa: E402 - the imports are part of what is timed
import sys  # noqa: E402

import numba.cuda.compiler as _compiler  # noqa: E402
import numba.cuda.cudadrv.nvvm as _nvvm  # noqa: E402

CALLS = []


def count_calls(module, name):
    original = getattr(module, name)
    setattr(module, name, lambda *a, **k: CALLS.append(name) or original(*a, **k))


count_calls(_compiler, "compile_cuda")
count_calls(_nvvm, "compile_ir")

from kbuild import Project  # noqa: E402
from kbuild.discover import Target  # noqa: E402
from kbuild.backend.loader import rebuild_kernel  # noqa: E402

ARCH, CC = "sm_90", (9, 0)


def per_launcher(proj):
    """(manifest, argtypes, kernel) per target, the way a launcher finds them."""
    for spec in proj.config.kernels:
        launcher = proj.kernel(spec.name)
        for signature, argtypes in launcher.resolved.argtypes.items():
            manifest = launcher._fresh_manifest(Target(spec.name, signature, ARCH))
            yield manifest, argtypes, launcher.resolved.kernel, f"{spec.name} {signature}"


def one_plan(proj):
    """The same from one plan of every target."""
    the_plan = proj.plan(None, [ARCH])
    for target in the_plan.targets:
        resolved = the_plan.kernels[target.name]
        manifest = proj.store.lookup(the_plan.keys[target].digest)
        yield manifest, resolved.argtypes[target.signature], resolved.kernel, target.label


def load_all(root: str, store: str, find) -> dict:
    imported = time.perf_counter()
    proj = Project.load(f"{root}/kbuild.toml", store=store, on_miss="error")
    kernels = []
    for manifest, argtypes, kernel, label in find(proj):
        if manifest is None:
            raise SystemExit(f"{label}: not in the store (stale?)")
        cubin = proj.store.read_blob(manifest["artifacts"]["cubin"])
        kernels.append(rebuild_kernel(manifest, argtypes, cubin, "cubin", CC,
                                      kernel.targetoptions))
    done = time.perf_counter()
    return {"kernels": len(kernels), "compiles": len(CALLS),
            "import_s": round(imported - START, 4), "load_s": round(done - imported, 4)}


if __name__ == "__main__":
    find = one_plan if "--one-plan" in sys.argv[3:] else per_launcher
    print(json.dumps(load_all(sys.argv[1], sys.argv[2], find)))
