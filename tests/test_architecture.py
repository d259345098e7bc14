"""Imports flow one way: errors -> pure core -> adapters -> build -> project -> cli.

The core (encoding, normalizing, keying, explaining) touches no disk, clock or
compiler, so it may import only itself and `errors`. Checked by reading imports with ast.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kbuild"
CORE = {"encode", "normalize", "values", "keys", "explain", "objects"}
# keys asks simopts (which reads a decorator's source) only for numba's simulator kernels,
# whose options exist nowhere else.
ALLOWED = {name: CORE | {"errors"} for name in CORE}
ALLOWED["keys"] = ALLOWED["keys"] | {"simopts"}
ADAPTERS_MAY_NOT_IMPORT = {"build", "project", "cli", "launch"}


def _kbuild_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("module", sorted(CORE))
def test_the_core_imports_no_adapter(module):
    extra = _kbuild_imports(PACKAGE / f"{module}.py") - ALLOWED[module]
    assert not extra, f"kbuild/{module}.py imports {sorted(extra)}"


@pytest.mark.parametrize("module", ["store", "config", "compiler", "loader", "archive",
                                    "maintenance", "locks", "sources", "toolchain", "graph",
                                    "lto", "remote"])
def test_adapters_do_not_import_the_layers_above(module):
    extra = _kbuild_imports(PACKAGE / f"{module}.py") & ADAPTERS_MAY_NOT_IMPORT
    assert not extra, f"kbuild/{module}.py imports {sorted(extra)}"
