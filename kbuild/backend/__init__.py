"""The backend: every use of numba-cuda, NVVM and nvJitLink internals lives here.

Outside `backend/`, kbuild imports only its interface: this package, `base` (what a
backend is: `Backend`, `Artifacts`) and `backends` (which exist; `get(name)` one). What
every backend shares and needs no compiler is named here, each imported when called:

- `located(binary, roots)`: a stored debug binary with this checkout's source folders
  written over its placeholders (`debugpaths`);
- `resources(cubin)`, `disassemble(cubin)`: a cubin's registers and memory per function
  (read from its ELF) and its SASS (`cubin`, for `kbuild show`);
- `versions()`, `supported_ccs()`, `cuda_release()`: the toolchain's parts and their
  versions (`kbuild --version`), the compute capabilities its NVRTC compiles for and
  its CUDA release (checking kbuild.toml's archs) (`toolchain`);
- `is_library(module_name)`: whether a module is the toolchain's or the language's, not
  the project's (`libraries`: asked before numba is imported, so imported here).
"""

from __future__ import annotations

from .libraries import is_library  # noqa: F401 - re-exported: no numba, asked per module


def located(binary: bytes, roots) -> tuple[bytes, str]:
    """`binary` as a checkout whose import roots are `roots` loads it, and what it was
    located to ("" for the stored bytes); see `debugpaths.located`."""
    from .debugpaths import located

    return located(binary, roots)


def resources(cubin: bytes) -> dict:
    """Function symbol -> {registers, local_bytes, stack_bytes, shared_bytes}; see
    `cubin.resources`."""
    from .cubin import resources

    return resources(cubin)


def disassemble(cubin: bytes) -> str:
    """The SASS of a cubin (RuntimeError without nvdisasm); see `cubin.disassemble`."""
    from .cubin import disassemble

    return disassemble(cubin)


def versions() -> dict:
    """What `kbuild --version` reports, by name; see `toolchain.versions`."""
    from .toolchain import versions

    return versions()


def supported_ccs() -> tuple | None:
    """The compute capabilities the toolchain compiles for, ascending, or None when it
    cannot be asked; see `toolchain.supported_ccs`."""
    from .toolchain import supported_ccs

    return supported_ccs()


def cuda_release() -> str | None:
    """The CUDA release of the toolchain's NVRTC ("13.0"), or None."""
    from .toolchain import cuda_release

    return cuda_release()
