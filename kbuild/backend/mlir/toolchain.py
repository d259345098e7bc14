"""numba-cuda-mlir's toolchain facts for the key, read once per process and cheaply.

The backend's name and version, the exact shared libraries it ships (its MLIR build,
the LLVM 7 bridge, its C++ extensions: by the hashes pip recorded, so no 200 MB file
is read), and the NVVM and nvJitLink it compiles and links with. Its config knobs that
change code, from its vendored numba config and the environment it reads at compile
time.
"""

from __future__ import annotations

import os
from functools import lru_cache
from importlib import metadata

from ...keying.encode import digest, digest_of
from ...keying.tree import KEY_SCHEMA
from ..backends import MLIR_NAME
from ..toolchain import (CUDA_WHEELS, _nvjitlink_version, _nvvm_version, distribution_versions,
                         python_version)

DISTRIBUTION = "numba-cuda-mlir"
# How kbuild's own patches of this backend's compile name what upstream names per process:
# raised when they change a compile's bytes, so that one key keeps one set of bytes
# (1: shared arrays, string and array constants named by content, `symbols.py`; 2: a
# kernel's `lto` option kept, no longer turned off by `compile(output="ptx")`, and an LTO
# kernel's PTX that of its link, `compiler.program_ptx`).
PATCHES = "2"
# What it compiles with besides itself (it vendors numba): numpy, whose version decides
# which overloads are registered, and the CUDA bindings and toolkit wheels (numba-cuda's).
DISTRIBUTIONS = ("numpy", "cuda-bindings", "cuda-core")
# numba config values that change code (read at import from NUMBA_* variables).
CODEGEN_CONFIG = ("OPT", "CUDA_DEBUGINFO_DEFAULT", "CUDA_DISABLE_LTO_OPT", "BOUNDSCHECK",
                  "FORCE_CUDA_CC")
# Environment variables it reads while compiling (its own reads are not observed: a
# library's reads are pinned by its version, except these, which change code).
CODEGEN_ENV = ("NUMBA_CUDA_ENABLE_NRT", "NUMBA_CUDA_NRT_STATS")


@lru_cache(maxsize=1)
def toolchain() -> dict:
    """Name -> version string for every component of the toolchain."""
    return {
        "kbuild key schema": str(KEY_SCHEMA),
        "kbuild mlir patches": PATCHES,
        "python": python_version(),
        "backend": MLIR_NAME,
        DISTRIBUTION: version(),
        f"{DISTRIBUTION} libraries": _libraries_digest(),
        **distribution_versions(DISTRIBUTIONS + CUDA_WHEELS),
        "nvvm": _nvvm_version(),
        "nvjitlink": _nvjitlink_version(),
    }


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "absent"


def _libraries_digest() -> str:
    """One digest of the hashes pip recorded for every shared library of the package."""
    try:
        files = metadata.files(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return "absent"
    rows = sorted((str(f), f.hash.value) for f in files
                  if f.hash is not None and (str(f).endswith(".so") or ".so." in str(f)))
    return digest_of(("libraries", tuple(rows)))


def codegen_config() -> dict:
    """Config knobs that change code, by name (`LIBLLVM7`, a library replacing the bundled
    LLVM 7 bridge, by its bytes' digest: never a path)."""
    from numba_cuda_mlir.numba_cuda.core import config

    out = {}
    for name in CODEGEN_CONFIG:
        value = getattr(config, name, None)
        out[name] = tuple(value) if isinstance(value, list) else value
    for name in CODEGEN_ENV:
        out[name] = os.environ.get(name)
    out["LIBLLVM7"] = _file_digest(os.environ.get("LIBLLVM7"))
    return out


@lru_cache(maxsize=4)
def _file_digest(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            return digest(fh.read())
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
