"""The package's folders are its architecture; imports flow one way through them.

The import graph of every module of `kbuild/` is read with `ast`: every `import` and
`from ... import` statement, at the top of a module or inside a function (a lazy import is
still an arrow), absolute or relative (`from . import x` names the module `x` when there is
one), and `importlib.import_module("kbuild...")` with a constant name. Then:

- no module imports itself back through others (no cycle between modules), and no part
  (a top-level module or subpackage: `store`, `backend`, `cli`, ...) does either, even
  through different modules (`store.local -> backend.binaries`, `backend.lto -> store.local`);
- every arrow goes down (or sideways within one tier) this order, lowest first:

      errors, model                                  the words every layer uses
      keying                                         pure: imports only itself, errors, model
      adapters, in tiers:
          artifacts                                  what kinds of artifact the store holds
          store                                      blobs, entries, facts, archives, remotes
          backend                                    numba-cuda, NVVM, nvJitLink, the driver
          cells                                      text kept in memory (notebook cells)
          sources                                    source files and keying facts
          config                                     kbuild.toml
          discover, graph, scaffold, bundle          importing kernels, the graph, init, bundles
          targets                                    which targets a command line names
          execute                                    where compiles run (not what a build is)
          direct                                     the journal: a no-op answered without keying
      build                                          plan, run, commit
      api, in tiers:
          launch, watch                              launchers, waiting for a save
          packaged                                   loading a bundle from an installed package
          project                                    Project.load(), the API
          kbuild (its __init__), setuptools_hook     the package's face, the wheel hook
      cli, then __main__                             the command line

  so `store` never imports `backend` or `sources`, `execute` never imports `build`, and
  `packaged` never imports `project`;
- no module uses another part's private attribute (`x._name`, or `getattr(x, "_name")`):
  neither through a name imported from another part nor one that only another part defines;
- numba's internals (its modules beyond the public type vocabulary, and private attributes
  of its objects) are used only behind `backend/`, the seam a second backend plugs into;
  so is all of numba-cuda-mlir (`backend/mlir/`, that second backend).

A new top-level module or subpackage must be placed in LAYERS before this test passes.
"""

from __future__ import annotations

import ast
import shutil
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kbuild"

# The one table: layers lowest first; each a list of tiers (lowest first) of parts. A part
# may import its own tier and every tier below; nothing above. "__init__" is the package's
# own kbuild/__init__.py, "__main__" kbuild/__main__.py.
LAYERS = (
    ("core", [{"errors", "model", "environ"}]),
    ("keying", [{"keying"}]),
    ("adapters", [{"artifacts"}, {"store"}, {"backend"}, {"cells"}, {"sources"}, {"config"},
                  {"installed"}, {"discover", "graph", "scaffold", "bundle"}, {"targets"},
                  {"execute"}, {"direct"}]),
    ("build", [{"build"}]),
    ("api", [{"launch", "watch"}, {"packaged"}, {"project"}, {"zeroconf"},
             {"__init__", "hooks", "setuptools_hook", "hatch_hook", "pytest_plugin"}]),
    ("cli", [{"cli"}, {"__main__"}]),
)

# Arrows that once made cycles; the table must keep forbidding them.
ONCE_CYCLES = [("store", "backend"), ("store", "sources"), ("execute", "build"),
               ("packaged", "project")]

# Public numba names that code outside the backend may use: numba's type objects (the
# vocabulary of signatures and keys). Everything else of numba is the backend's.
PUBLIC_NUMBA = {"numba", "numba.core.types", "numba.core.sigutils",
                "numba.from_dtype", "numba.typeof"}

# Underscored names that are public API of ast nodes and named tuples, not private state.
PUBLIC_UNDERSCORED = {"_fields", "_replace", "_asdict", "_make", "_field_defaults"}


# -- reading the package --------------------------------------------------------------------

@dataclass(frozen=True)
class Arrow:
    """One import: `source` imports `target` at `line` (`lazy`: inside a function)."""

    source: str
    target: str
    line: int
    lazy: bool

    def where(self, graph: "Graph") -> str:
        how = " (inside a function)" if self.lazy else ""
        return f"{graph.relpath(self.source)}:{self.line} imports {self.target}{how}"


@dataclass
class Graph:
    """Every module of a package (dotted names) and the imports between them."""

    root: Path
    name: str
    files: dict = field(default_factory=dict)  # module -> path
    arrows: list = field(default_factory=list)
    bindings: dict = field(default_factory=dict)  # module -> {local name: (module, is_module)}

    def relpath(self, module: str) -> str:
        return str(self.files[module].relative_to(self.root.parent))

    def part(self, module: str) -> str:
        """`store` for kbuild.store.local, `build` for kbuild.build, `__init__` for kbuild."""
        rest = module.split(".")[1:]
        return rest[0] if rest else "__init__"

    def edges(self) -> dict:
        out = defaultdict(set)
        for arrow in self.arrows:
            if arrow.target != arrow.source:
                out[arrow.source].add(arrow.target)
        return out


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_graph(root: Path) -> Graph:
    """The import graph of the package in folder `root`."""
    graph = Graph(root, root.name)
    graph.files = {_module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    for module, path in graph.files.items():
        _read_module(graph, module, path)
    # `from x import a, b` is one import of x; sorted by file and line.
    graph.arrows = sorted(set(graph.arrows), key=lambda a: (a.source, a.line, a.target))
    return graph


def _owner(graph: Graph, dotted: str) -> str:
    """The package module that holds `dotted` (a module, or a name inside one)."""
    while dotted not in graph.files and "." in dotted:
        dotted = dotted.rpartition(".")[0]
    return dotted


def _read_module(graph: Graph, module: str, path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    bindings = graph.bindings.setdefault(module, {})
    for node, lazy in _walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != graph.name:
                    bindings[(alias.asname or alias.name).split(".")[0]] = (alias.name, None)
                    continue
                target = _owner(graph, alias.name)
                graph.arrows.append(Arrow(module, target, node.lineno, lazy))
                if alias.asname:
                    bindings[alias.asname] = (target, True)
                else:
                    bindings[graph.name] = (graph.name, True)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level - 1 >= len(base):
                    raise ValueError(f"{path}:{node.lineno}: relative import beyond {graph.name}")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != graph.name:
                for alias in node.names:
                    bindings[alias.asname or alias.name] = (f"{source}.{alias.name}", None)
                continue
            for alias in node.names:
                name = f"{source}.{alias.name}"
                is_module = name in graph.files
                target = name if is_module else _owner(graph, source)
                graph.arrows.append(Arrow(module, target, node.lineno, lazy))
                bindings[alias.asname or alias.name] = (target, is_module)
        elif isinstance(node, ast.Call) and _is_import_module(node):
            name = node.args[0].value
            if name.split(".")[0] == graph.name:
                graph.arrows.append(Arrow(module, _owner(graph, name), node.lineno, lazy))


def _is_import_module(node: ast.Call) -> bool:
    func = node.func
    named = (isinstance(func, ast.Attribute) and func.attr == "import_module") or \
        (isinstance(func, ast.Name) and func.id in ("import_module", "__import__"))
    return named and bool(node.args) and isinstance(node.args[0], ast.Constant) \
        and isinstance(node.args[0].value, str)


def _walk(tree: ast.AST):
    """Every node with whether it sits inside a function (or lambda)."""
    todo = deque([(tree, False)])
    while todo:
        node, lazy = todo.popleft()
        yield node, lazy
        inside = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        todo.extend((child, inside) for child in ast.iter_child_nodes(node))


# -- cycles ---------------------------------------------------------------------------------

def strongly_connected(edges: dict) -> list[list[str]]:
    """The strongly connected components of more than one node, or with a self-loop."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    nodes = sorted(set(edges) | {t for ts in edges.values() for t in ts})

    def visit(start):
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in edges.get(node, ()):
                        found.append(sorted(component))

    for node in nodes:
        if node not in index:
            visit(node)
    return sorted(found)


def shortest_cycle(edges: dict, component: list[str]) -> list[str]:
    """A shortest cycle through the component's first node: [a, b, ..., a]."""
    start, members = component[0], set(component)
    parents, todo = {start: None}, deque([start])
    while todo:
        node = todo.popleft()
        for child in sorted(edges.get(node, ())):
            if child == start:
                path = [node]
                while parents[path[-1]] is not None:
                    path.append(parents[path[-1]])
                return path[::-1] + [start]
            if child in members and child not in parents:
                parents[child] = node
                todo.append(child)
    raise AssertionError(f"no cycle through {start}")


def module_cycles(graph: Graph) -> list[str]:
    """One message per import cycle between modules: the cycle and the imports making it."""
    edges = graph.edges()
    messages = []
    for component in strongly_connected(edges):
        cycle = shortest_cycle(edges, component)
        lines = [f"cycle {' -> '.join(cycle)}"]
        if len(component) > len(cycle) - 1:
            lines.append(f"  (one of the cycles among {', '.join(component)})")
        lines += [f"  {a.where(graph)}" for a in graph.arrows
                  if a.source in component and a.target in component and a.target != a.source]
        messages.append("\n".join(lines))
    return messages


def part_cycles(graph: Graph) -> list[str]:
    """One message per cycle between parts (top-level modules and subpackages)."""
    edges, by_pair = defaultdict(set), defaultdict(list)
    for arrow in graph.arrows:
        source, target = graph.part(arrow.source), graph.part(arrow.target)
        if source != target:
            edges[source].add(target)
            by_pair[source, target].append(arrow)
    messages = []
    for component in strongly_connected(edges):
        cycle = shortest_cycle(edges, component)
        lines = [f"cycle between parts {' -> '.join(cycle)}"]
        if len(component) > len(cycle) - 1:
            lines.append(f"  (one of the cycles among {', '.join(component)})")
        for source, target in sorted(by_pair):
            if source in component and target in component:
                lines.append(f"  {source} -> {target}:")
                lines += [f"    {a.where(graph)}" for a in by_pair[source, target]]
        messages.append("\n".join(lines))
    return messages


# -- layers ---------------------------------------------------------------------------------

def tiers(layers=LAYERS) -> dict:
    """part -> (rank, "layer tier n"), rank increasing upwards."""
    ranks, rank = {}, 0
    for layer, layer_tiers in layers:
        for number, parts in enumerate(layer_tiers, 1):
            label = layer if len(layer_tiers) == 1 else f"{layer} tier {number}"
            ranks.update({p: (rank, label) for p in parts})
            rank += 1
    return ranks


def unplaced_parts(graph: Graph, layers=LAYERS) -> list[str]:
    placed = tiers(layers)
    return sorted({f"{graph.part(m)} ({graph.relpath(m)})" for m in graph.files
                   if graph.part(m) not in placed})


def upward_arrows(graph: Graph, layers=LAYERS) -> list[str]:
    """Every import of a part placed above the importing one."""
    ranks, found = tiers(layers), []
    for arrow in graph.arrows:
        source, target = graph.part(arrow.source), graph.part(arrow.target)
        if source in ranks and target in ranks and ranks[target][0] > ranks[source][0]:
            found.append(f"{arrow.where(graph)}: {source} ({ranks[source][1]}) may not import "
                         f"{target} ({ranks[target][1]})")
    return found


# -- private attributes ---------------------------------------------------------------------

def _private(name) -> bool:
    return isinstance(name, str) and name.startswith("_") and not name.endswith("__") \
        and name not in PUBLIC_UNDERSCORED


def _private_uses(tree: ast.AST, reads_only: bool = False):
    """`_private_uses_unsorted`, in line order."""
    return sorted(_private_uses_unsorted(tree, reads_only), key=lambda use: use[2])


def _private_uses_unsorted(tree: ast.AST, reads_only: bool):
    """(object expression, attribute name, line) of every `x._name` and every
    getattr/hasattr/setattr/delattr(x, "_name", ...); `reads_only`: the name constants of
    getattr/hasattr/delattr calls instead of the objects."""
    calls = ("getattr", "hasattr", "delattr") if reads_only else \
        ("getattr", "hasattr", "setattr", "delattr")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not reads_only:
            yield node.value, node.attr, node.lineno
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in calls \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and _private(node.args[1].value):
            yield (node.args[1] if reads_only else node.args[0]), node.args[1].value, \
                node.lineno


def _own_object(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Name) and expr.id in ("self", "cls") or \
        isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "super"


def private_names_defined(graph: Graph) -> dict:
    """part -> the private names its modules define: functions, classes, assigned names and
    attributes, and string constants (an argparse `dest`, a setattr)."""
    defined = defaultdict(set)
    for module, path in graph.files.items():
        names = defined[graph.part(module)]
        tree = ast.parse(path.read_text(), str(path))
        asked = {id(expr) for expr, _, _ in _private_uses(tree, reads_only=True)}
        for node in ast.walk(tree):
            if id(node) in asked:  # getattr(x, "_name") reads the name, it does not define it
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return {part: {n for n in names if _private(n)} for part, names in defined.items()}


def _bound_to(graph: Graph, module: str, expr: ast.AST):
    """(package module, is_module) a bare name in `module` was imported as, else None."""
    if isinstance(expr, ast.Name):
        found = graph.bindings[module].get(expr.id)
        if found and found[1] is not None:
            return found
    return None


def _bound_outside(graph: Graph, module: str, expr: ast.AST) -> str | None:
    """The dotted name a bare name was imported as from outside the package, else None."""
    if isinstance(expr, ast.Name):
        found = graph.bindings[module].get(expr.id)
        if found and found[1] is None:
            return found[0]
    return None


def private_reads_across_parts(graph: Graph) -> list[str]:
    """Uses of another part's private attribute: through a name imported from that part, or
    of a name no module of this part defines and another part's does."""
    defined, found = private_names_defined(graph), []
    for module, path in graph.files.items():
        part = graph.part(module)
        for expr, name, line in _private_uses(ast.parse(path.read_text(), str(path))):
            if _own_object(expr) or _bound_outside(graph, module, expr):
                continue  # its own, or the standard library's (os._exit)
            bound = _bound_to(graph, module, expr)
            where = f"{graph.relpath(module)}:{line}"
            if bound and graph.part(bound[0]) != part:
                what = "module" if bound[1] else "object from"
                found.append(f"{where} uses {name} of {what} {bound[0]} "
                             f"(part {graph.part(bound[0])})")
            elif name not in defined[part]:
                owners = sorted(p for p, names in defined.items() if name in names)
                if owners:
                    found.append(f"{where} uses {name}, private to {', '.join(owners)}")
    return found


def numba_private_reads(graph: Graph) -> list[str]:
    """Outside backend/: uses of a private attribute no kbuild module defines (so numba's,
    on a dispatcher, type or module) on anything but a module imported from outside numba
    (`os._exit`, `sys._getframe` are the standard library's)."""
    defined = set().union(*private_names_defined(graph).values())
    found = []
    for module, path in graph.files.items():
        if graph.part(module) == "backend":
            continue
        for expr, name, line in _private_uses(ast.parse(path.read_text(), str(path))):
            outside = _bound_outside(graph, module, expr)
            if _own_object(expr) or name in defined or _bound_to(graph, module, expr) or \
                    (outside and outside.split(".")[0] != "numba"):
                continue
            found.append(f"{graph.relpath(module)}:{line} uses {name} of "
                         f"{ast.unparse(expr)}; move it behind backend/")
    return found


# -- the checks on kbuild -------------------------------------------------------------------

@pytest.fixture(scope="module")
def graph() -> Graph:
    return read_graph(PACKAGE)


def _report(what: str, found: list[str]) -> str:
    return f"{len(found)} {what}:\n" + "\n".join(found)


def test_the_graph_holds_every_module_and_its_lazy_imports(graph):
    assert set(graph.files) == {_module_name(PACKAGE, p) for p in PACKAGE.rglob("*.py")}
    assert "kbuild.__main__" in graph.files and "kbuild" in graph.files
    assert any(a.lazy for a in graph.arrows), "imports inside functions were not read"


def test_every_part_has_a_place_in_the_layers(graph):
    missing = unplaced_parts(graph)
    assert not missing, _report("parts in no layer of LAYERS (place each one)", missing)


def test_no_import_cycle_between_modules(graph):
    cycles = module_cycles(graph)
    assert not cycles, _report("import cycles between modules", cycles)


def test_no_import_cycle_between_parts(graph):
    cycles = part_cycles(graph)
    assert not cycles, _report("import cycles between parts", cycles)


def test_imports_flow_down_the_layers(graph):
    upward = upward_arrows(graph)
    assert not upward, _report("imports against the layers", upward)


def test_no_module_uses_another_parts_private_attributes(graph):
    found = private_reads_across_parts(graph)
    assert not found, _report("uses of another part's private attributes", found)


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
    return {m for m in found if m.split(".")[0] in ("numba", "cuda", "numba_cuda_mlir")}


@pytest.mark.parametrize("path", [p for p in PACKAGE.rglob("*.py")
                                  if "backend" not in p.relative_to(PACKAGE).parts[:-1]],
                         ids=lambda p: str(p))
def test_numba_internals_stay_behind_the_backend(path):
    extra = _numba_imports(path) - PUBLIC_NUMBA
    assert not extra, f"{path.relative_to(PACKAGE)} imports {sorted(extra)}; move it to backend/"


def test_numba_private_attributes_stay_behind_the_backend(graph):
    found = numba_private_reads(graph)
    assert not found, _report("uses of numba's private attributes outside backend/", found)


def test_the_layers_forbid_the_arrows_that_once_made_cycles():
    ranks = tiers()
    assert {part for _, layer_tiers in LAYERS for t in layer_tiers for part in t} == set(ranks)
    for source, target in ONCE_CYCLES:
        assert ranks[target][0] > ranks[source][0], (source, target)
    assert all(ranks["keying"][0] > ranks[p][0] for p in ("errors", "model", "environ"))
    assert all(ranks["keying"][0] < rank for part, (rank, _) in ranks.items()
               if part not in ("errors", "model", "environ", "keying"))


# -- the checker itself, on packages made here ------------------------------------------------

def _package(root: Path, files: dict) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


SMALL = {
    "kbuild/__init__.py": "",
    "kbuild/errors.py": "class KbuildError(Exception):\n    pass\n",
    "kbuild/keying/__init__.py": "",
    "kbuild/keying/encode.py": "from ..errors import KbuildError\n",
    "kbuild/keying/keys.py": "from . import encode\n",
    "kbuild/store/__init__.py": "from .local import Store\n",
    "kbuild/store/local.py": "import kbuild.keying.encode as enc\n\n\nclass Store:\n"
                             "    def _remove(self):\n        pass\n",
    "kbuild/backend/__init__.py": "",
    "kbuild/backend/lto.py": "from kbuild.store import local\n",
    "kbuild/build.py": "from .store import Store\nfrom .backend import lto\n",
    "kbuild/cli.py": "def main():\n    from . import build\n",
}


def test_a_clean_package_passes_every_check(tmp_path):
    graph = read_graph(_package(tmp_path, SMALL) / "kbuild")
    assert (unplaced_parts(graph), module_cycles(graph), part_cycles(graph),
            upward_arrows(graph), private_reads_across_parts(graph)) == ([], [], [], [], [])
    arrows = {(a.source, a.target, a.lazy) for a in graph.arrows}
    assert arrows == {
        ("kbuild.keying.encode", "kbuild.errors", False),
        ("kbuild.keying.keys", "kbuild.keying.encode", False),  # from . import encode
        ("kbuild.store", "kbuild.store.local", False),
        ("kbuild.store.local", "kbuild.keying.encode", False),  # import a.b.c as x
        ("kbuild.backend.lto", "kbuild.store.local", False),  # from pkg import module
        ("kbuild.build", "kbuild.store", False),  # a name the package re-exports
        ("kbuild.build", "kbuild.backend.lto", False),
        ("kbuild.cli", "kbuild.build", True),  # from . import x, inside a function
    }


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path):
    files = dict(SMALL)
    files["kbuild/keying/encode.py"] += "\n\ndef late():\n    from .keys import nothing\n"
    graph = read_graph(_package(tmp_path, files) / "kbuild")
    (message,) = module_cycles(graph)
    assert message.splitlines()[0] == \
        "cycle kbuild.keying.encode -> kbuild.keying.keys -> kbuild.keying.encode"
    assert "kbuild/keying/encode.py:5 imports kbuild.keying.keys (inside a function)" in message
    assert "kbuild/keying/keys.py:1 imports kbuild.keying.encode" in message
    assert part_cycles(graph) == []  # one part: not a cycle between parts


def test_a_cycle_between_parts_through_different_modules_is_found(tmp_path):
    files = dict(SMALL)
    files["kbuild/backend/binaries.py"] = "MAGIC = b'\\x7fELF'\n"
    files["kbuild/store/manifest.py"] = "from ..backend.binaries import MAGIC\n"
    graph = read_graph(_package(tmp_path, files) / "kbuild")
    assert module_cycles(graph) == []
    (message,) = part_cycles(graph)
    assert message.splitlines()[0] == "cycle between parts backend -> store -> backend"
    assert message.splitlines()[1:] == [
        "  backend -> store:", "    kbuild/backend/lto.py:1 imports kbuild.store.local",
        "  store -> backend:", "    kbuild/store/manifest.py:1 imports kbuild.backend.binaries"]
    assert upward_arrows(graph) == [
        "kbuild/store/manifest.py:1 imports kbuild.backend.binaries: store (adapters tier 2) "
        "may not import backend (adapters tier 3)"]


def test_private_attributes_of_another_part_are_found(tmp_path):
    files = dict(SMALL)
    files["kbuild/build.py"] += ("\n\ndef f(store):\n    store._remove()\n"
                                 "    return getattr(lto, '_cache', None), lto.ok\n")
    files["kbuild/keying/keys.py"] += "\n\ndef g(dispatcher):\n    return dispatcher._defn\n"
    graph = read_graph(_package(tmp_path, files) / "kbuild")
    assert private_reads_across_parts(graph) == [
        "kbuild/build.py:6 uses _remove, private to store",
        "kbuild/build.py:7 uses _cache of module kbuild.backend.lto (part backend)"]
    assert numba_private_reads(graph) == [
        "kbuild/keying/keys.py:5 uses _defn of dispatcher; move it behind backend/"]


def test_a_cycle_added_to_kbuild_itself_fails_the_checks(tmp_path):
    """The real package, copied, with keying importing the CLI lazily."""
    copy = tmp_path / "kbuild"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = read_graph(copy)
    encode = copy / "keying" / "encode.py"
    lines = encode.read_text().count("\n")
    encode.write_text(encode.read_text() + "\n\ndef _late():\n    from ..cli import main\n")
    after = read_graph(copy)
    added = f"kbuild/keying/encode.py:{lines + 4} imports kbuild.cli (inside a function)"
    new_cycles = set(module_cycles(after)) - set(module_cycles(before))
    assert new_cycles and all(added in m for m in new_cycles)
    assert any(m.startswith("cycle kbuild.cli -> ") or " -> kbuild.cli -> " in m
               for m in new_cycles)
    assert [m for m in upward_arrows(after) if m not in upward_arrows(before)] == [
        f"{added}: keying (keying) may not import cli (cli tier 1)"]
    assert any(added in m for m in part_cycles(after))


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
