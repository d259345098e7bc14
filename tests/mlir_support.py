"""The numba-cuda-mlir side of the tests: whether it is installed, and projects ported to it.

A project is ported as a user migrating from numba-cuda ports it: the imports change
(`from numba import cuda` -> `from numba_cuda_mlir import cuda`; numba's extension API,
types and `from_dtype` -> the copies numba-cuda-mlir vendors), kbuild.toml names the
backend, and the kernels numba-cuda-mlir 0.6.0 cannot compile are left out of it
(`UNSUPPORTED`, each with the compiler's reason). The sources are otherwise the same
files, so an edit of the numba-cuda project applies to its port too (`port` runs after it).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

MLIR = "numba-cuda-mlir"
INSTALLED = importlib.util.find_spec("numba_cuda_mlir") is not None
NOT_INSTALLED = 'numba-cuda-mlir is not installed (pip install "kbuild[mlir]")'
needs_mlir = pytest.mark.skipif(not INSTALLED, reason=NOT_INSTALLED)

# The import lines a migration changes, as regular expressions over whole lines.
IMPORTS = (
    (r"^from numba import cuda$", "from numba_cuda_mlir import cuda"),
    (r"^from numba\.cuda\.extending import", "from numba_cuda_mlir.numba_cuda.extending import"),
    (r"^from numba\.core import types$", "from numba_cuda_mlir.numba_cuda import types"),
    (r"^import numba$", "from numba_cuda_mlir.numba_cuda.np import numpy_support as numba"),
)

# Targets numba-cuda-mlir 0.6.0 does not compile (found by building them; the README's
# Backends section lists them too).
UNSUPPORTED = {
    "examples.elementwise:mode_select": "comparing an int64 with an IntEnum member: "
                                        "NotImplemented lowering binop eq (compiler bug)",
    "examples.reductions:mirror_sum": "min() of three values, and of array sizes "
                                      "(lower_min: not implemented for type index)",
    "examples.reductions:count_nonzero": "counter[..., np.newaxis]: NotImplemented lowering "
                                         "const(ellipsis)",
    "lab.kernels:k_mode": "comparing an int64 with an IntEnum member (compiler bug)",
    "lab.records:k_origin": "cuda.local.array of a record type (compiler bug)",
    "ob.kernels:k_attr": "its vendored @overload_attribute types but does not lower",
}


def port_sources(root: Path) -> None:
    """Rewrite the imports of every Python file under `root` for numba-cuda-mlir."""
    for path in sorted(Path(root).rglob("*.py")):
        text = path.read_text()
        ported = text
        for pattern, replacement in IMPORTS:
            ported = re.sub(pattern, replacement, ported, flags=re.MULTILINE)
        if ported != text:
            path.write_text(ported)


def port_config(config: Path, drop=(), name_backend: bool = True) -> None:
    """kbuild.toml for numba-cuda-mlir: the backend named (unless not `name_backend`), the
    tables of `drop` removed."""
    text = original = config.read_text()
    for name in drop:
        text = re.sub(rf'\n\[kernels\."{re.escape(name)}"\]\n(?:(?!\n\[).)*', "\n", text,
                      flags=re.DOTALL)
        assert f'"{name}"' not in text, f"{name} still declared in {config}"
    if name_backend and not re.search(r"^backend\s*=", text, flags=re.MULTILINE):
        text = re.sub(r"^\[project\]\n", f'[project]\nbackend = "{MLIR}"\n', text, count=1,
                      flags=re.MULTILINE)
    if text != original:  # ported twice (before and after an edit): written once
        config.write_text(text)


def port(root: Path, config: Path | None = None) -> Path:
    """Port the project at `root` (its sources; `config`, default root/kbuild.toml) in place,
    leaving out the targets numba-cuda-mlir cannot compile."""
    port_sources(root)
    port_config(config or root / "kbuild.toml", UNSUPPORTED)
    return root


def short(name: str) -> str:
    return name.rpartition(":")[2]


UNSUPPORTED_SHORT = {short(name): reason for name, reason in UNSUPPORTED.items()}
