"""The package's folders are its architecture; imports flow one way through them.

    errors -> keying (pure) -> adapters (store/, backend/, execute/, config, sources, ...)
           -> build -> project / launch -> cli

Keying touches no disk, clock or compiler, so it imports only itself and `errors`.
numba's internals are used only behind `backend/`, the seam a second backend plugs into.
Checked by reading imports with ast.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kbuild"
TOP = {"build", "project", "cli", "launch"}
ADAPTER_PACKAGES = ("store", "backend", "execute")
TOP_ADAPTERS = ("config", "sources", "discover", "graph")


def _modules(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).glob("*.py"))


def _kbuild_imports(path: Path) -> set[str]:
    """The kbuild modules `path` imports, as dotted names relative to the package."""
    here = path.relative_to(PACKAGE).parent.parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
            prefix = ".".join(base + tuple((node.module or "").split("."))).strip(".")
            if node.module:
                found.add(prefix)
            else:
                found.update(f"{prefix}.{a.name}".strip(".") for a in node.names)
    return found


def _numba_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from numba.core import types` uses numba.core.types; `from numba import cuda`
            # the package itself.
            found.update(f"{node.module}.{a.name}" if node.module != "numba" else node.module
                         for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.split(".")[0] in ("numba", "cuda")}


@pytest.mark.parametrize("path", _modules("keying"), ids=lambda p: p.name)
def test_keying_imports_only_itself_and_errors(path):
    extra = {m for m in _kbuild_imports(path)
             if not (m == "errors" or m.startswith("keying"))}
    assert not extra, f"{path.relative_to(PACKAGE)} imports {sorted(extra)}"


@pytest.mark.parametrize("path", [p for f in ADAPTER_PACKAGES for p in _modules(f)]
                         + [PACKAGE / f"{m}.py" for m in TOP_ADAPTERS], ids=lambda p: str(p))
def test_adapters_do_not_import_the_layers_above(path):
    # execute runs build's compile step in its workers: the one way back up, and lazily.
    above = {m for m in _kbuild_imports(path) if m.split(".")[0] in TOP}
    if path.parent.name == "execute":
        above -= {"build"}
    assert not above, f"{path.relative_to(PACKAGE)} imports {sorted(above)}"


# Public numba names that keying and the CLI-side modules may use: numba's type objects
# (the vocabulary of signatures and keys). Everything else of numba is the backend's.
PUBLIC_NUMBA = {"numba", "numba.core.types", "numba.core.sigutils",
                "numba.from_dtype", "numba.typeof"}


@pytest.mark.parametrize("path", [p for p in PACKAGE.rglob("*.py")
                                  if p.parent.name != "backend"], ids=lambda p: str(p))
def test_numba_internals_stay_behind_the_backend(path):
    extra = _numba_imports(path) - PUBLIC_NUMBA
    assert not extra, f"{path.relative_to(PACKAGE)} imports {sorted(extra)}; move it to backend/"


# -- the backend seam: keying names none of numba's object shapes --------------------------

KEYING = sorted((Path(__file__).resolve().parents[1] / "kbuild" / "keying").glob("*.py"))
# What backend/objectmodel.py reads of numba's objects so that keying never does.
NUMBA_SHAPES = ("ExternFunction", "FakeCUDAKernel", "Dispatcher", "LinkableCode",
                "targetoptions", "nopython_signatures", "._device", "._defn", "_can_compile")
PUBLIC_PRIVATE = {"_fields"}  # namedtuple's public API (and ast nodes')


def _private_reads(source: str) -> list[str]:
    """`x._attr` and `getattr(x, "_attr")` on anything but `self`/`cls`, dunders aside."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            name = node.attr
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr") and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            name = node.args[1].value
        else:
            continue
        if name.startswith("_") and not name.endswith("__") and name not in PUBLIC_PRIVATE:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", KEYING, ids=lambda p: p.name)
def test_keying_reads_no_compiler_object_shapes(path):
    # Keying asks a `keying.interfaces.ObjectModel` what a compiler's objects are;
    # numba-cuda's answers live in backend/objectmodel.py.
    source = path.read_text()
    named = [shape for shape in NUMBA_SHAPES if shape in source]
    assert not named, f"keying/{path.name} names numba's objects: {named}"
    private = _private_reads(source)
    assert not private, f"keying/{path.name} reads private attributes: {private}"
