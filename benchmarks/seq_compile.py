"""The baseline: compile every target of a kbuild.toml with plain numba-cuda, in one process.

    python benchmarks/seq_compile.py PROJECT_DIR

What a user without kbuild pays on every program start: import numba-cuda and
the project, then compile each declared (kernel, signature) for sm_90 the way
numba's dispatcher does (`_Kernel` with the decorator's options), taking the
PTX and the linked cubin, one after the other. The only kbuild code used is
numba-cuda's `targeting` (its backend's), which lets numba-cuda compile with no driver.
Prints one JSON line: the target count, artifact sizes and in-process phases.
"""

import time

START = time.perf_counter()

import importlib  # noqa: E402 - the imports are part of what is timed
import json  # noqa: E402
import sys  # noqa: E402
import tomllib  # noqa: E402
from pathlib import Path  # noqa: E402

import numba.cuda  # noqa: E402, F401
from numba.core import types  # noqa: E402
from numba.cuda.dispatcher import _Kernel  # noqa: E402

from kbuild.backend.backends import DEFAULT, get  # noqa: E402

CC = (9, 0)


def declared_targets(root: Path):
    """(module, attr path, signature text) for every signature in ROOT/kbuild.toml."""
    config = tomllib.loads((root / "kbuild.toml").read_text())
    for name, spec in config["kernels"].items():
        module, _, attr = name.partition(":")
        for signature in spec["signatures"]:
            yield module, attr, signature


def argtypes(module, signature: str) -> tuple:
    """numba's signature string, with the module's globals (e.g. `Point`) in scope."""
    sig = eval(signature, {"__builtins__": {}}, {**vars(module), **vars(types)})  # noqa: S307
    return tuple(sig.args)


def resolve(module_name: str, attr: str):
    module = importlib.import_module(module_name)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return module, obj


def compile_all(root: Path) -> dict:
    sys.path.insert(0, str(root))
    imported = time.perf_counter()
    ptx_bytes = cubin_bytes = count = 0
    with get(DEFAULT).targeting(CC):
        for module_name, attr, signature in declared_targets(root):
            module, kernel = resolve(module_name, attr)
            compiled = _Kernel(kernel.py_func, argtypes(module, signature),
                               **kernel.targetoptions)
            ptx_bytes += len(compiled.library.get_asm_str(cc=CC))
            cubin_bytes += len(compiled.library.get_cubin(cc=CC).code)
            count += 1
    done = time.perf_counter()
    return {"targets": count, "ptx_bytes": ptx_bytes, "cubin_bytes": cubin_bytes,
            "import_s": round(imported - START, 4), "compile_s": round(done - imported, 4)}


if __name__ == "__main__":
    print(json.dumps(compile_all(Path(sys.argv[1]).resolve())))
