"""The backend: every use of numba-cuda, NVVM and nvJitLink internals lives here.

Outside `backend/`, kbuild imports only its interface: this package, `base` (what a
backend is: `Backend`, `Artifacts`) and `backends` (which exist; `get(name)` one). What
every backend shares and needs no compiler is named here, each imported when called:

- `located(binary, roots)`: a stored debug binary with this checkout's source folders
  written over its placeholders (`debugpaths`);
- `resources(cubin)`, `disassemble(cubin)`: a cubin's registers and memory per function
  (read from its ELF) and its SASS (`cubin`, for `kbuild show`);
"""

from __future__ import annotations


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
