"""numba-cuda-mlir: kbuild's second backend, imported only when a project or a kernel asks.

| module | what |
|---|---|
| `backend` | `BACKEND`, the `base.Backend` the rest of kbuild asks |
| `nodriver` | compiling for a named arch without a driver (the one upstream workaround) |
| `compiler` | one target to PTX and a cubin |
| `objects` | its objects as keying sees them (`ObjectModel`) |
| `toolchain` | its versions and code-changing knobs, for the key |
| `packing`, `launching` | its kernel ABI and launches from the store; `install()` |
| `dispatch` | its dispatchers served from the store under `kbuild.enable()` |

Installed with `pip install "kbuild[mlir]"`; without it, importing this says so.
"""

from ..backends import MLIR_NAME, MissingBackend, missing_message

try:
    import numba_cuda_mlir  # noqa: F401
except ImportError as exc:  # pragma: no cover - the suite runs both with and without it
    raise MissingBackend(missing_message(MLIR_NAME, "kbuild.backend.mlir")) from exc

from .backend import BACKEND  # noqa: E402

__all__ = ["BACKEND"]
