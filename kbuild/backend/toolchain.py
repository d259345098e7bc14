"""Versions of everything that turns Python into a cubin, and the config knobs that matter.

Read once per process and cheaply: package metadata and the NVVM / nvJitLink
version calls, without loading NVRTC or touching a driver.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from importlib import metadata

from ..keying.tree import KEY_SCHEMA

# numba config values that change generated code: `compiletime` says which and when.
from .compiletime import CODEGEN_CONFIG, codegen_config  # noqa: F401 - re-exported


# Installed distributions whose version can change what numba-cuda compiles: the compiler
# (numba-cuda, numba, llvmlite); numpy, whose version decides which of numba's overloads
# are registered and how they type (`np.row_stack` went in numpy 2.5); the bindings that
# call NVVM, NVRTC and nvJitLink; and the toolkit wheels that hold those libraries, the
# device runtime (cudadevrt) and the headers NVRTC reads. A CUDA 12 wheel carries a
# `-cu12` suffix and is keyed under the name without it.
DISTRIBUTIONS = ("numba-cuda", "numba", "llvmlite", "numpy", "cuda-bindings", "cuda-core")
CUDA_WHEELS = ("nvidia-nvvm", "nvidia-cuda-nvcc", "nvidia-nvjitlink", "nvidia-cuda-nvrtc",
               "nvidia-cuda-runtime", "nvidia-cuda-cccl", "nvidia-cuda-crt")


def is_toolchain_distribution(name: str) -> bool:
    """Whether the installed distribution `name` is the toolchain's, whose files its
    version pins: one keyed above (a CUDA 12 wheel under its name without `-cu12`), or
    one of CUDA's own the toolkit and its bindings bring (`nvidia-*`, `cuda-*`)."""
    name = "-".join(name.replace("_", "-").replace(".", "-").lower().split("-"))
    name = name.removesuffix("-cu12").removesuffix("-cu13")
    return name in DISTRIBUTIONS + CUDA_WHEELS or name.startswith(("nvidia-", "cuda-"))


@lru_cache(maxsize=1)
def toolchain() -> dict:
    """Name -> version string for every component of the toolchain."""
    return {
        "kbuild key schema": str(KEY_SCHEMA),
        "python": python_version(),
        **distribution_versions(DISTRIBUTIONS + CUDA_WHEELS),
        "nvvm": _nvvm_version(),
        "nvjitlink": _nvjitlink_version(),
    }


def python_version() -> str:
    """The interpreter as keys name it: implementation and major.minor ("cpython 3.12")."""
    return f"{sys.implementation.name} {sys.version_info[0]}.{sys.version_info[1]}"


def distribution_versions(names, version_of=None) -> dict:
    """Name -> installed version ("absent" when not installed) of each distribution in
    `names`, in that order; a CUDA 12 wheel (`NAME-cu12`) answers for `NAME`.
    `version_of(name)` reads one distribution's version (default: its installed
    metadata, `importlib.metadata.version`) and raises PackageNotFoundError for none."""
    version_of = version_of or metadata.version
    out = {}
    for name in names:
        out[name] = _version_or_absent(version_of, name)
        if out[name] == "absent" and name.startswith("nvidia-"):
            out[name] = _version_or_absent(version_of, f"{name}-cu12")
    return out


def _version_or_absent(version_of, name: str) -> str:
    try:
        return version_of(name)
    except metadata.PackageNotFoundError:
        return "absent"


def _dist_version(name: str) -> str:
    return _version_or_absent(metadata.version, name)


def _nvvm_version() -> str:
    try:
        from cuda.bindings import nvvm

        return ".".join(map(str, nvvm.version() + nvvm.ir_version()))
    except Exception as exc:  # noqa: BLE001 - a missing NVVM is reported at compile time
        return f"unavailable ({type(exc).__name__})"


def _nvjitlink_version() -> str:
    try:
        from cuda.bindings import nvjitlink

        return ".".join(map(str, nvjitlink.version()))
    except Exception as exc:  # noqa: BLE001
        return f"unavailable ({type(exc).__name__})"


@lru_cache(maxsize=1)
def supported_ccs() -> tuple | None:
    """The compute capabilities this toolchain compiles for, as ascending (major, minor)
    pairs; None when it cannot be asked (then an arch is only checked for its spelling).

    Asked of NVRTC: libNVVM has no such call, NVRTC ships in the same CUDA release, and
    numba-cuda picks its NVVM arch from the same list (`nvrtc.get_arch_option`).
    """
    try:
        from cuda.bindings import nvrtc

        code, archs = nvrtc.nvrtcGetSupportedArchs()
        if code != nvrtc.nvrtcResult.NVRTC_SUCCESS or not archs:
            return None
        return tuple(sorted((a // 10, a % 10) for a in archs))
    except Exception:  # noqa: BLE001 - no NVRTC: compile time will say what is wrong
        return None


@lru_cache(maxsize=1)
def cuda_release() -> str | None:
    """The CUDA release of the toolchain's NVRTC ("13.0"), or None."""
    try:
        from cuda.bindings import nvrtc

        code, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}" if code == nvrtc.nvrtcResult.NVRTC_SUCCESS else None
    except Exception:  # noqa: BLE001
        return None


def driver_version() -> str:
    """The CUDA driver's version ("13.0"), or why there is none; never raises."""
    try:
        from cuda.bindings import driver

        code, version = driver.cuDriverGetVersion()
        if code != driver.CUresult.CUDA_SUCCESS:
            return f"unavailable ({code.name})"
        return f"{version // 1000}.{version % 1000 // 10}"
    except Exception as exc:  # noqa: BLE001 - no driver on a build machine is normal
        return f"none ({type(exc).__name__})"


def versions() -> dict:
    """What `kbuild --version` reports: the toolchain and the driver, by name."""
    chain = toolchain()
    found = {"numba-cuda": chain["numba-cuda"], "numba": chain["numba"],
             "llvmlite": chain["llvmlite"], "NVVM": _nvvm_display(),
             "nvJitLink": chain["nvjitlink"], "CUDA (NVRTC)": cuda_release() or "unavailable",
             "CUDA driver": driver_version(), "Python": sys.version.split()[0]}
    mlir = _dist_version("numba-cuda-mlir")  # the second backend, when installed (kbuild[mlir])
    return found if mlir == "absent" else dict(found, **{"numba-cuda-mlir": mlir})


def _nvvm_display() -> str:
    try:
        from cuda.bindings import nvvm

        return (f"{'.'.join(map(str, nvvm.version()))} "
                f"(IR {'.'.join(map(str, nvvm.ir_version()))})")
    except Exception as exc:  # noqa: BLE001
        return f"unavailable ({type(exc).__name__})"
