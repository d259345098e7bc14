"""The package's folders are its architecture; imports flow one way through them.

The import graph of every module of `kbuild/` is read with `ast`: every `import` and
`from ... import` statement, at the top of a module or inside a function (a lazy import is
still an arrow), absolute or relative (`from . import x` names the module `x` when there is
one), and every module named by a constant in an import call (`importlib.import_module`,
`__import__`, under any name, relative to `__package__` too) or a `sys.modules` key. What
no import statement shows is reported, each unless a short list below says why it must be:
an import call on a computed name (`import_module("kbuild." + "cli")`, a package's
`__getattr__` loading `f"{__name__}.{x}"`), and a read of `sys.modules` (but of an object's
own module, `sys.modules.get(f.__module__)`, which reaches nothing new). Then:

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
      builder                                        plan, the build service, run, commit
      api, in tiers:
          launch, watch                              launchers, waiting for a save
          packaged                                   loading a bundle from an installed package
          project                                    Project.load(), the API
          kbuild (its __init__), setuptools_hook     the package's face, the wheel hook,
          testing                                    a fake device for users' tests
      cli, then __main__                             the command line

  so `store` never imports `backend` or `sources`, `execute` never imports `builder`, and
  `packaged` never imports `project`;
- no module uses another part's private attribute (`x._name`, or `getattr(x, "_name")`):
  neither through a name imported from another part nor one that only another part defines;
- numba's internals (its modules beyond the public type vocabulary, and private attributes
  of its objects) are used only behind `backend/`, the seam a second backend plugs into;
  so is all of numba-cuda-mlir (`backend/mlir/`, that second backend), llvmlite and
  cuda-python. "Used" is any form: an import statement (at the top or inside a function),
  an import call or `sys.modules` key naming it, an attribute chain (`numba.cuda.x`),
  `getattr(numba, "cuda")`, or the module passed on as a value;
- outside `backend/`, only the backend's interface (`backend`, `backend.base`,
  `backend.backends`) is imported; every other arrow into `backend/` is listed in
  BACKEND_REACH with why, and the list only shrinks (a stale entry fails a test).

A new top-level module or subpackage must be placed in LAYERS before this test passes.
"""

from __future__ import annotations

import ast
import re
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
    ("builder", [{"builder"}]),
    ("api", [{"launch", "watch"}, {"packaged"}, {"project"}, {"zeroconf"},
             {"__init__", "hooks", "setuptools_hook", "hatch_hook", "pytest_plugin",
              "testing"}]),
    ("cli", [{"cli"}, {"__main__"}]),
)

# Arrows that once made cycles; the table must keep forbidding them.
ONCE_CYCLES = [("store", "backend"), ("store", "sources"), ("execute", "builder"),
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


@dataclass(frozen=True)
class Use:
    """Something in `module` at `line`, inside function `scope` ("" at module level), that an
    import statement does not show: `what` is the source text or the name reached."""

    module: str
    line: int
    scope: str
    what: str

    def where(self, graph: "Graph") -> str:
        inside = f" (in {self.scope})" if self.scope else ""
        return f"{graph.relpath(self.module)}:{self.line}{inside}"


@dataclass
class Graph:
    """Every module of a package (dotted names) and the imports between them."""

    root: Path
    name: str
    files: dict = field(default_factory=dict)  # module -> path
    arrows: list = field(default_factory=list)
    bindings: dict = field(default_factory=dict)  # module -> {local name: (module, is_module)}
    computed: list = field(default_factory=list)  # Use: import calls on a computed name
    sys_modules: list = field(default_factory=list)  # Use: reads of sys.modules
    compilers: list = field(default_factory=list)  # Use: numba (cuda, llvmlite...) reached

    def relpath(self, module: str) -> str:
        return str(self.files[module].relative_to(self.root.parent))

    def part(self, module: str) -> str:
        """`store` for kbuild.store.local, `builder` for kbuild.builder, `__init__` for kbuild."""
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
    reader = _Reader(graph, module, package, tree)
    for node, lazy, scope in _walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != graph.name:
                    bindings[(alias.asname or alias.name).split(".")[0]] = (alias.name, None)
                    reader.outside_import(alias, node.lineno, scope)
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
                    reader.outside_from(source, alias, node.lineno, scope)
                continue
            for alias in node.names:
                name = f"{source}.{alias.name}"
                is_module = name in graph.files
                target = name if is_module else _owner(graph, source)
                graph.arrows.append(Arrow(module, target, node.lineno, lazy))
                bindings[alias.asname or alias.name] = (target, is_module)
        elif isinstance(node, ast.Call) and reader.is_import_call(node):
            reader.import_call(node, lazy, scope)
        elif reader.is_sys_modules(node):
            reader.sys_modules(node, lazy, scope)
        elif isinstance(node, (ast.Attribute, ast.Name)):
            reader.compiler_use(node, scope)


# The packages of the compilers and the CUDA driver: reached only behind backend/.
COMPILERS = frozenset({"numba", "numba_cuda", "numba_cuda_mlir", "llvmlite", "cuda"})
IMPORT_CALLS = frozenset({"import_module", "__import__"})


class _Reader:
    """What one module reaches without an import statement showing it: import calls
    (`importlib.import_module`, `__import__`), reads of `sys.modules`, and the compilers'
    modules and names (by an import of any form, an attribute chain, `getattr`)."""

    def __init__(self, graph: Graph, module: str, package: str, tree: ast.AST):
        self.graph, self.module, self.package = graph, module, package
        self.parents = {id(child): node for node in ast.walk(tree)
                        for child in ast.iter_child_nodes(node)}
        self.sys_names, self.modules_names, self.import_names = set(), set(), set(IMPORT_CALLS)
        self.compiler_names = {}  # local name -> the compiler's dotted name it is bound to
        for node in ast.walk(tree):  # bindings first: a use may come before its import
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "sys":
                        self.sys_names.add(alias.asname or "sys")
                    elif alias.name.split(".")[0] in COMPILERS:
                        local = alias.asname or alias.name.split(".")[0]
                        self.compiler_names[local] = alias.name if alias.asname else local
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                for alias in node.names:
                    local = alias.asname or alias.name
                    if node.module == "sys" and alias.name == "modules":
                        self.modules_names.add(local)
                    elif node.module in ("importlib", "builtins") and alias.name in IMPORT_CALLS:
                        self.import_names.add(local)
                    elif node.module.split(".")[0] in COMPILERS:
                        self.compiler_names[local] = f"{node.module}.{alias.name}"

    def _use(self, line: int, scope: str, what: str) -> Use:
        return Use(self.module, line, scope, what)

    def _reached(self, name: str, line: int, lazy: bool, scope: str) -> None:
        """A module named by a constant string: an arrow, or a compiler reached."""
        root = name.split(".")[0]
        if root == self.graph.name:
            self.graph.arrows.append(Arrow(self.module, _owner(self.graph, name), line, lazy))
        elif root in COMPILERS:
            self.graph.compilers.append(self._use(line, scope, name))

    # -- import statements of the compilers -----------------------------------------------

    def outside_import(self, alias: ast.alias, line: int, scope: str) -> None:
        # `import numba` (or `as nb`) only binds a name, whose every use is read below;
        # `import numba.cuda` imports numba.cuda.
        if alias.name.split(".")[0] in COMPILERS and "." in alias.name:
            self.graph.compilers.append(self._use(line, scope, alias.name))

    def outside_from(self, source: str, alias: ast.alias, line: int, scope: str) -> None:
        if source.split(".")[0] in COMPILERS:
            self.graph.compilers.append(self._use(line, scope, f"{source}.{alias.name}"))

    # -- import calls ---------------------------------------------------------------------

    def is_import_call(self, node: ast.Call) -> bool:
        func = node.func
        return (isinstance(func, ast.Attribute) and func.attr in IMPORT_CALLS) or \
            (isinstance(func, ast.Name) and func.id in self.import_names)

    def import_call(self, node: ast.Call, lazy: bool, scope: str) -> None:
        name = _constant(node.args[0]) if node.args else None
        if name is not None and name.startswith("."):  # import_module(".x", __package__)
            package = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "package"), None)
            name = self._relative(name, package)
        if name is None:
            self.graph.computed.append(self._use(node.lineno, scope, ast.unparse(node)))
        else:
            self._reached(name, node.lineno, lazy, scope)

    def _relative(self, name: str, package) -> str | None:
        """`.x` against `__package__` (or a package's `__name__`), else None (computed)."""
        if not (isinstance(package, ast.Name) and (package.id == "__package__" or (
                package.id == "__name__" and self.module == self.package))):
            return None
        dots = len(name) - len(name.lstrip("."))
        base = self.package.split(".")
        base = base[:len(base) - (dots - 1)]
        rest = name.lstrip(".")
        return ".".join(base + ([rest] if rest else []))

    # -- sys.modules ----------------------------------------------------------------------

    def is_sys_modules(self, node: ast.AST) -> bool:
        """`sys.modules` (sys under any name), `modules` from `from sys import modules`,
        `getattr(sys, "modules")`."""
        if isinstance(node, ast.Attribute):
            return node.attr == "modules" and isinstance(node.value, ast.Name) \
                and node.value.id in self.sys_names
        if isinstance(node, ast.Name):
            return node.id in self.modules_names and isinstance(node.ctx, ast.Load)
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id == "getattr" and len(node.args) >= 2 \
            and isinstance(node.args[0], ast.Name) and node.args[0].id in self.sys_names \
            and _constant(node.args[1]) == "modules"

    def sys_modules(self, node: ast.AST, lazy: bool, scope: str) -> None:
        """A read of sys.modules. `sys.modules[k]`, `sys.modules.get(k)`, `k in sys.modules`
        with a constant k reach module k (an arrow); with `obj.__module__` the module of an
        object already in hand (no arrow, not reported); anything else is reported."""
        parent = self.parents.get(id(node))
        expr, key = node, None
        if isinstance(parent, ast.Subscript) and parent.value is node:
            expr, key = parent, parent.slice
        elif isinstance(parent, ast.Attribute) and parent.value is node:
            call = self.parents.get(id(parent))
            if isinstance(call, ast.Call) and call.func is parent and call.args:
                expr, key = call, call.args[0]
        elif isinstance(parent, ast.Compare) and node in parent.comparators \
                and len(parent.comparators) == 1:
            expr, key = parent, parent.left
        if key is not None and _is_module_of(key):
            return
        if key is not None and _constant(key) is not None:
            self._reached(_constant(key), node.lineno, lazy, scope)
        self.graph.sys_modules.append(self._use(node.lineno, scope, ast.unparse(expr)))

    # -- the compilers' names -------------------------------------------------------------

    def compiler_use(self, node: ast.AST, scope: str) -> None:
        """`numba.cuda.x` (an attribute chain on a name bound to a compiler's module),
        `getattr(numba, "cuda")`, or such a name passed on as a value."""
        parent = self.parents.get(id(node))
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return  # the outermost attribute of the chain reads it
        chain = []
        base = node
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if not (isinstance(base, ast.Name) and base.id in self.compiler_names):
            return
        if isinstance(base.ctx, ast.Store) and base is node:
            return
        dotted = ".".join([self.compiler_names[base.id], *reversed(chain)])
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) \
                and parent.func.id in ("getattr", "hasattr") and parent.args \
                and parent.args[0] is node:
            attr = _constant(parent.args[1]) if len(parent.args) > 1 else None
            dotted += f".{attr}" if attr else ".<computed>"
        elif base is node:
            dotted += " (as a value)"  # passed on: whoever gets it can reach anything
        self.graph.compilers.append(self._use(node.lineno, scope, dotted))


def _constant(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) \
        else None


def _is_module_of(key: ast.AST) -> bool:
    """`obj.__module__` or `getattr(obj, "__module__", ...)`: the module of an object."""
    return (isinstance(key, ast.Attribute) and key.attr == "__module__") or (
        isinstance(key, ast.Call) and isinstance(key.func, ast.Name)
        and key.func.id == "getattr" and len(key.args) >= 2
        and _constant(key.args[1]) == "__module__")


def _walk(tree: ast.AST):
    """Every node with whether it sits inside a function (or lambda) and the qualified name
    of the function or class it sits in ("" at module level)."""
    todo = deque([(tree, False, "")])
    while todo:
        node, lazy, scope = todo.popleft()
        yield node, lazy, scope
        inside = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = f"{scope}.{node.name}" if scope else node.name
        todo.extend((child, inside, scope) for child in ast.iter_child_nodes(node))


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


# -- what no import statement shows ---------------------------------------------------------
#
# An import call on a computed name, a read of sys.modules and a compiler reached through an
# attribute chain are arrows the import statements do not show; each is reported unless it is
# (a) an arrow after all: a constant name (`import_module("kbuild.store")`,
# `sys.modules.get("kbuild.backend.mlir.dispatch")`) is read as an import, checked as one;
# (b) the module of an object already in hand (`sys.modules.get(f.__module__)`); or
# (c) listed below, with why it cannot be an import statement. Each list only shrinks: an
# entry that no longer matches anything fails `test_the_allow_lists_have_no_stale_entries`.

# (file, function) -> why its import call's name is computed.
COMPUTED_IMPORTS = {
    ("kbuild/discover.py", "_import"):
        "the project's own module, named by a target in kbuild.toml",
    ("kbuild/execute/distributed.py", "from_data"):
        "a kbuild dataclass named in a dask worker's result (checked to be kbuild's)",
    ("kbuild/backend/backends.py", "get"):
        "a backend's module, named in KNOWN, loaded when a project or kernel asks for it",
    ("kbuild/backend/reproducible.py", "flag_names"):
        "numba's option classes, whose module moved between numba-cuda releases",
    ("kbuild/backend/observe/hooks.py", "_hooks"):
        "a front end's interpreter and base modules, under its own package (FrontEnd)",
    ("kbuild/backend/observe/hooks.py", "_hooks.typing"):
        "a front end's typing modules, under its own package (FrontEnd)",
    ("kbuild/backend/observe/hooks.py", "_nvrtc_headers"):
        "the front end's NVRTC module (FrontEnd.nvrtc)",
    ("kbuild/backend/observe/current.py", "_module"):
        "the module an observed global was found in, named in a stored observation",
    ("kbuild/backend/observe/current.py", "_submodule"):
        "a package's submodule an observed read named, imported as the compile did",
    ("kbuild/store/remotes/plugin.py", "_import"):
        "a remote backend the user names (`module:Class` in the remote URL or setting)",
}

# (file, function) -> why it reads sys.modules. backend/ reads numba's module table by
# design (observe, registrations) and is not listed; its constant keys are still arrows.
SYS_MODULES = {
    ("kbuild/direct/inputs.py", "_input_files"):
        "the journal records the source file of every module the run imported",
    ("kbuild/direct/recorder.py", "ReadRecorder.start"):
        "a run can be journaled only if nothing of numba was imported before it started",
    ("kbuild/discover.py", "forget_project_modules"):
        "drops the project's modules so that the next discovery imports its edits",
    ("kbuild/execute/distributed.py", "_forget_modules_under"):
        "a dask worker drops the previous job's project modules",
    ("kbuild/sources.py", "ProjectSources._in_roots"):
        "whether an already imported module (by name, from a code object) is the project's",
    ("kbuild/zeroconf/naming.py", "import_path"):
        "the module of a kernel's Python function (`getattr(f, '__module__')` first)",
    ("kbuild/zeroconf/afterimport.py", "after_import"):
        "waits for a module to be imported, and must not import it",
    ("kbuild/zeroconf/startup.py", "stand_down"):
        "a session exists only if its module was imported; must not import it",
    ("kbuild/cells.py", "in_ipython"):
        "whether the program runs under IPython; must not import it",
    ("kbuild/zeroconf/cellwatch.py", "_notebook_namespace"):
        "the running program's namespace (`__main__`), whose cells' globals are watched",
    ("kbuild/zeroconf/cellwatch.py", "_listening"):
        "IPython's shell, if the program runs under it; must not import it",
    ("kbuild/zeroconf/journal.py", "program_identity"):
        "the running program (`__main__`): its script or -m module names its journal",
}

# The backend's interface: what the rest of kbuild may import of backend/ (base: what a
# backend is; backends: which exist, `get(name)` one, its objects; the package itself).
BACKEND_INTERFACE = {"kbuild.backend", "kbuild.backend.base", "kbuild.backend.backends"}

# (importer, backend module) -> why it goes past the interface; the list only shrinks
# (issue 33 moved the others behind `Backend` and the `backend` package).
BACKEND_REACH = {
    ("kbuild.testing", "kbuild.backend.testing.fakedriver"):
        "the fake device for users' tests is the fake driver's public face",
}

# The compilers' names that code outside backend/ may reach: numba's type objects (the
# vocabulary of signatures and keys), by any import form or attribute chain.
PUBLIC_NUMBA = {"numba.core.types", "numba.core.sigutils", "numba.from_dtype", "numba.typeof"}
PUBLIC_NUMBA_MODULES = {"numba.core.types"}  # and every name inside these


def _entry(graph: Graph, use: Use) -> tuple:
    return graph.relpath(use.module), use.scope


def computed_imports(graph: Graph, allowed=None) -> list[str]:
    """Every import call whose module name is not a constant, unless `allowed` lists it."""
    allowed = COMPUTED_IMPORTS if allowed is None else allowed
    return [f"{use.where(graph)}: {use.what} imports a computed name; import it by name, "
            f"or list it in COMPUTED_IMPORTS with why" for use in _sorted(graph.computed)
            if _entry(graph, use) not in allowed]


def sys_modules_reads(graph: Graph, allowed=None) -> list[str]:
    """Every read of sys.modules outside backend/ (but of an object's own module), unless
    `allowed` lists it."""
    allowed = SYS_MODULES if allowed is None else allowed
    return [f"{use.where(graph)}: {use.what} reads sys.modules; import the module, or list "
            f"it in SYS_MODULES with why" for use in _sorted(graph.sys_modules)
            if graph.part(use.module) != "backend" and _entry(graph, use) not in allowed]


def _past_the_interface(graph: Graph):
    for arrow in graph.arrows:
        if graph.part(arrow.source) != "backend" and graph.part(arrow.target) == "backend" \
                and arrow.target not in BACKEND_INTERFACE:
            yield arrow


def backend_reach(graph: Graph, allowed=None) -> list[str]:
    """Every import from outside backend/ of a backend module that is not its interface,
    unless `allowed` lists the (importer, module) pair."""
    allowed = BACKEND_REACH if allowed is None else allowed
    return [f"{arrow.where(graph)}: only {', '.join(sorted(BACKEND_INTERFACE))} may be "
            f"imported outside backend/" for arrow in _past_the_interface(graph)
            if (arrow.source, arrow.target) not in allowed]


# The test doubles (the fake driver) are not the product: nothing kbuild runs imports them.
# Their one door is `kbuild.testing`, the fake device for users' tests, which nothing of
# kbuild imports either.
TEST_DOUBLES = "kbuild.backend.testing"
TEST_DOUBLES_DOOR = "kbuild.testing"


def _is_test_double(module: str) -> bool:
    return module == TEST_DOUBLES or module.startswith(f"{TEST_DOUBLES}.")


def doubles_imported(graph: Graph) -> list[str]:
    """Every arrow into the test doubles (`backend/testing/`) but from their door and from
    themselves, and every arrow into the door."""
    return [f"{arrow.where(graph)}: the product never imports the test doubles; use them "
            f"through {TEST_DOUBLES_DOOR} in tests" for arrow in graph.arrows
            if (arrow.target == TEST_DOUBLES_DOOR and arrow.source != TEST_DOUBLES_DOOR)
            or (_is_test_double(arrow.target) and not _is_test_double(arrow.source)
                and arrow.source != TEST_DOUBLES_DOOR)]


def _public_numba(name: str) -> bool:
    return name in PUBLIC_NUMBA or any(name.startswith(f"{m}.") for m in PUBLIC_NUMBA_MODULES)


def compilers_reached(graph: Graph) -> list[str]:
    """Outside backend/: every compiler's module or name reached (an import of any form, an
    import call or sys.modules key naming it, an attribute chain, getattr, the module passed
    on as a value) that is not numba's public type vocabulary."""
    return [f"{use.where(graph)} reaches {use.what}; move it behind backend/"
            for use in _sorted(graph.compilers) if graph.part(use.module) != "backend"
            and not _public_numba(use.what.removesuffix(" (as a value)"))]


def stale_entries(graph: Graph, computed=None, sys_modules=None, reach=None) -> list[str]:
    """Allow-list entries (default: this file's) that match nothing in the package."""
    tables = {"COMPUTED_IMPORTS": (COMPUTED_IMPORTS if computed is None else computed,
                                   {_entry(graph, u) for u in graph.computed}),
              "SYS_MODULES": (SYS_MODULES if sys_modules is None else sys_modules,
                              {_entry(graph, u) for u in graph.sys_modules}),
              "BACKEND_REACH": (BACKEND_REACH if reach is None else reach,
                                {(a.source, a.target) for a in _past_the_interface(graph)})}
    return sorted(f"{name} {entry}" for name, (table, seen) in tables.items()
                  for entry in table if entry not in seen)


def _sorted(uses: list) -> list:
    return sorted(set(uses), key=lambda u: (u.module, u.line, u.what))


# -- one builder ----------------------------------------------------------------------------
# The steps of turning a target into a committed entry, by the module that defines each: only
# the build service takes them (issue 33: one builder, not three). Reached by importing the
# name (from its module or from the `kbuild.builder` package) or by an attribute of either.
ONE_BUILDER = "kbuild.builder.service"
BUILDER_STEPS = {
    "kbuild.builder.entries": {"commit", "fresh_entry", "fresh_match", "matched_at"},
    "kbuild.builder.compile": {"compile_target", "link_target"},
    "kbuild.store.locks": {"KeyLock"},
}
BUILDER_STEPS_ALLOWED = {
    ("kbuild.builder.cluster", "compile_target"):
        "a cluster worker's compile (`cluster.run_job`): the job the service hands an executor",
}


def _step(graph: Graph, source: str, name: str) -> str | None:
    """The defining module of `name` when `source.name` is one of the builder's steps."""
    for defining, names in BUILDER_STEPS.items():
        if name in names and source in (defining, defining.rpartition(".")[0]):
            return defining
    return None


def builder_steps(graph: Graph, allowed=None) -> list[str]:
    """Every module but the build service (and the steps' own modules) that reaches a step
    of the one builder, unless `allowed` lists the (module, step) pair."""
    allowed = BUILDER_STEPS_ALLOWED if allowed is None else allowed
    found = []
    for module, path in graph.files.items():
        if module == ONE_BUILDER or module in BUILDER_STEPS:
            continue
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        bound = graph.bindings.get(module, {})
        for node, _, _ in _walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                pairs = [(".".join(base + ([node.module] if node.module else [])), a.name)
                         for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                pairs = [(node.module or "", a.name) for a in node.names]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and bound.get(node.value.id, (None, False))[1]:
                pairs = [(bound[node.value.id][0], node.attr)]
            else:
                continue
            for source, name in pairs:
                if _step(graph, source, name) and (module, name) not in allowed:
                    found.append(f"{graph.relpath(module)}:{node.lineno} takes {name}, a step "
                                 f"of the one builder; go through {ONE_BUILDER}")
    return sorted(set(found))


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
    # the lazy package and the lazy command table import by name: their arrows show
    arrows = {(a.source, a.target) for a in graph.arrows}
    assert {("kbuild.builder", f"kbuild.builder.{m}") for m in ("compile", "planning", "run")} \
        | {("kbuild.cli.commands", "kbuild.cli.project_cmds")} <= arrows


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


def test_numba_internals_stay_behind_the_backend(graph):
    found = compilers_reached(graph)
    assert not found, _report("compilers' names reached outside backend/", found)


def test_no_import_call_on_a_computed_name(graph):
    found = computed_imports(graph)
    assert not found, _report("import calls on computed names", found)


def test_sys_modules_is_read_only_where_listed(graph):
    found = sys_modules_reads(graph)
    assert not found, _report("reads of sys.modules", found)


def test_outside_the_backend_only_its_interface_is_imported(graph):
    found = backend_reach(graph)
    assert not found, _report("imports past the backend's interface", found)


def test_only_the_build_service_takes_the_builders_steps(graph):
    found = builder_steps(graph)
    assert not found, _report("builder steps taken outside the build service", found)
    # every allowed pair still happens (a stale entry fails)
    for module, name in BUILDER_STEPS_ALLOWED:
        assert any(f"takes {name}," in f and graph.relpath(module) in f
                   for f in builder_steps(graph, allowed={})), (module, name)


def test_the_product_never_imports_the_test_doubles(graph):
    found = doubles_imported(graph)
    assert not found, _report("imports of the test doubles", found)
    assert any(a.source == TEST_DOUBLES_DOOR and _is_test_double(a.target)
               for a in graph.arrows), "kbuild.testing no longer uses backend/testing/"


# What kbuild's own tests must not reach past `kbuild.testing` for: the fake driver, and
# the compiler's arch pinning (a fake device pins it; a compile-only test asks the backend).
_PAST_THE_TESTING_API = re.compile(
    r"backend\.testing|backend import (?:compiler|targeting)\b"
    r"|backend\.(?:compiler|targeting) import[^\n]*\btargeting")


def test_kbuilds_own_tests_use_the_testing_api():
    """The fake device's users in tests/ go through `kbuild.testing` (in their programs'
    text too), so the API is what the suite exercises."""
    here = Path(__file__).resolve()
    found = [f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
             for path in sorted(here.parent.glob("*.py")) if path != here
             for text in [path.read_text()] for m in _PAST_THE_TESTING_API.finditer(text)]
    assert not found, "use kbuild.testing instead:\n" + "\n".join(found)


def test_the_allow_lists_have_no_stale_entries(graph):
    stale = stale_entries(graph)
    assert not stale, _report("allow-list entries that match nothing (delete them)", stale)


def test_every_allow_list_entry_says_why():
    for table in (COMPUTED_IMPORTS, SYS_MODULES, BACKEND_REACH, BUILDER_STEPS_ALLOWED):
        assert all(isinstance(why, str) and len(why) > 20 for why in table.values()), table
    assert all(m.split(".")[:2] == ["kbuild", "backend"] for m in BACKEND_INTERFACE)


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
    "kbuild/builder.py": "from .store import Store\nfrom .backend import lto\n",
    "kbuild/cli.py": "def main():\n    from . import builder\n",
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
        ("kbuild.builder", "kbuild.store", False),  # a name the package re-exports
        ("kbuild.builder", "kbuild.backend.lto", False),
        ("kbuild.cli", "kbuild.builder", True),  # from . import x, inside a function
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
    files["kbuild/builder.py"] += ("\n\ndef f(store):\n    store._remove()\n"
                                 "    return getattr(lto, '_cache', None), lto.ok\n")
    files["kbuild/keying/keys.py"] += "\n\ndef g(dispatcher):\n    return dispatcher._defn\n"
    graph = read_graph(_package(tmp_path, files) / "kbuild")
    assert private_reads_across_parts(graph) == [
        "kbuild/builder.py:6 uses _remove, private to store",
        "kbuild/builder.py:7 uses _cache of module kbuild.backend.lto (part backend)"]
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


# -- the checker is not fooled: what no import statement shows --------------------------------

def _small(tmp_path: Path, path: str, text: str) -> Graph:
    """SMALL with backend's interface modules, and `text` added to the module at `path`."""
    files = dict(SMALL)
    files["kbuild/backend/base.py"] = "class Backend:\n    pass\n"
    files["kbuild/backend/backends.py"] = "from .base import Backend\n"
    files[path] = files.get(path, "") + text
    return read_graph(_package(tmp_path, files) / "kbuild")


@pytest.mark.parametrize("text", [
    "import importlib\n\n\ndef f():\n    return importlib.import_module('kbuild.' + 'cli')\n",
    "import importlib\n\nNAME = 'cli'\nM = importlib.import_module(f'kbuild.{NAME}')\n",
    "def f(name):\n    return __import__(name)\n",
    "from importlib import import_module as load\n\n\ndef f(name):\n    return load(name)\n",
    "import importlib\n\n\ndef f():\n    return importlib.import_module('.cli', 'kbuild')\n",
], ids=["concatenated", "f-string", "__import__", "renamed", "relative-to-a-name"])
def test_an_import_call_on_a_computed_name_is_found(tmp_path, text):
    graph = _small(tmp_path, "kbuild/keying/probe.py", text)
    (found,) = computed_imports(graph, allowed={})
    assert found.startswith("kbuild/keying/probe.py:") and "imports a computed name" in found
    # listed with why, it passes; the list entry is the file and function
    (use,) = graph.computed
    assert computed_imports(graph, allowed={_entry(graph, use): "why"}) == []


def test_a_lazy_package_that_imports_its_modules_through_importlib_is_found(tmp_path):
    """What kbuild/builder/__init__.py did: its arrows were invisible."""
    text = ("import importlib\n\n\ndef __getattr__(name):\n"
            "    return getattr(importlib.import_module(f'{__name__}.store'), name)\n")
    graph = _small(tmp_path, "kbuild/keying/__init__.py", text)
    assert computed_imports(graph, allowed={}) == [
        "kbuild/keying/__init__.py:5 (in __getattr__): "
        "importlib.import_module(f'{__name__}.store') imports a computed name; import it by "
        "name, or list it in COMPUTED_IMPORTS with why"]


@pytest.mark.parametrize("text", [
    "import importlib\n\n\ndef f():\n    return importlib.import_module('kbuild.cli')\n",
    "def f():\n    return __import__('kbuild.cli')\n",
    "import importlib\n\n\ndef f():\n    return importlib.import_module('..cli', __package__)\n",
    "import importlib\n\n\ndef f():\n"
    "    return importlib.import_module('..cli', package=__package__)\n",
    "import sys\n\n\ndef f():\n    return sys.modules['kbuild.cli']\n",
    "import sys\n\n\ndef f():\n    return sys.modules.get('kbuild.cli')\n",
], ids=["import_module", "__import__", "relative", "relative-package=", "sys.modules[]",
        "sys.modules.get"])
def test_a_constant_module_name_is_an_arrow_the_layers_check(tmp_path, text):
    graph = _small(tmp_path, "kbuild/keying/probe.py", text)
    assert computed_imports(graph, allowed={}) == []
    (upward,) = upward_arrows(graph)
    assert upward.startswith("kbuild/keying/probe.py:")
    assert " imports kbuild.cli (inside a function): " in upward
    assert upward.endswith("keying (keying) may not import cli (cli tier 1)")


@pytest.mark.parametrize("text,read", [
    ("import sys\n\n\ndef f(name):\n    return sys.modules[name]\n", "sys.modules[name]"),
    ("import sys\n\n\ndef f(name):\n    return sys.modules.get(name)\n",
     "sys.modules.get(name)"),
    ("import sys as system\n\n\ndef f():\n    return list(system.modules)\n", "system.modules"),
    ("from sys import modules\n\n\ndef f(name):\n    return modules.get(name)\n",
     "modules.get(name)"),
    ("import sys\n\n\ndef f(name):\n    return getattr(sys, 'modules')[name]\n",
     "getattr(sys, 'modules')[name]"),
    ("import sys\n\n\ndef f(name):\n    return name in sys.modules\n", "name in sys.modules"),
    ("import sys\n\n\ndef f():\n    return sys.modules['kbuild.errors']\n",
     "sys.modules['kbuild.errors']"),
], ids=["subscript", "get", "renamed-sys", "from-sys", "getattr", "in", "constant"])
def test_a_read_of_sys_modules_is_found(tmp_path, text, read):
    graph = _small(tmp_path, "kbuild/keying/probe.py", text)
    (found,) = sys_modules_reads(graph, allowed={})
    assert found.startswith("kbuild/keying/probe.py:") and found.endswith(
        f" (in f): {read} reads sys.modules; import the module, or list it in SYS_MODULES "
        f"with why")
    assert sys_modules_reads(graph, allowed={("kbuild/keying/probe.py", "f"): "why"}) == []


def test_the_module_of_an_object_in_hand_is_not_a_read_of_sys_modules(tmp_path):
    text = ("import sys\n\n\ndef f(func, cls):\n"
            "    return sys.modules.get(func.__module__), sys.modules[cls.__module__], "
            "sys.modules.get(getattr(func, '__module__', None))\n")
    graph = _small(tmp_path, "kbuild/keying/probe.py", text)
    assert graph.sys_modules == [] and sys_modules_reads(graph, allowed={}) == []


@pytest.mark.parametrize("text,reached", [
    ("import numba\n\n\ndef f():\n    return numba.cuda.compile_ptx\n",
     "numba.cuda.compile_ptx"),
    ("def f():\n    from numba import cuda\n", "numba.cuda"),
    ("import numba.cuda.cudadrv.driver as drv\n", "numba.cuda.cudadrv.driver"),
    ("import numba\n\n\ndef f():\n    return getattr(numba, 'cuda')\n", "numba.cuda"),
    ("import numba\n\n\ndef f(g):\n    return g(numba)\n", "numba (as a value)"),
    ("import importlib\n\n\ndef f():\n    return importlib.import_module('numba.cuda')\n",
     "numba.cuda"),
    ("import sys\n\n\ndef f():\n    return sys.modules['numba.cuda']\n", "numba.cuda"),
    ("from numba.core import types\n\nT = types.misc\n", None),  # public: not reported
    ("import llvmlite.binding\n", "llvmlite.binding"),
    ("def f():\n    from cuda.core import launch\n", "cuda.core.launch"),
    ("from numba_cuda_mlir import cuda\n", "numba_cuda_mlir.cuda"),
], ids=["attribute-chain", "from-numba-import-cuda-lazily", "import-as", "getattr",
        "as-a-value", "import_module", "sys.modules", "public-types", "llvmlite", "cuda.core",
        "mlir"])
def test_a_compiler_reached_outside_the_backend_is_found(tmp_path, text, reached):
    graph = _small(tmp_path, "kbuild/keying/probe.py", text)
    found = compilers_reached(graph)
    if reached is None:
        assert found == []
        return
    assert [f.partition(" reaches ")[2] for f in found] == [
        f"{reached}; move it behind backend/"]
    # the same text in backend/ is the backend's business
    assert compilers_reached(_small(tmp_path / "b", "kbuild/backend/lto.py", text)) == []


def test_numbas_type_vocabulary_may_be_used_outside_the_backend(tmp_path):
    text = ("import numba\nfrom numba import from_dtype\nfrom numba.core import types as nbt\n"
            "from numba.core.types import float32\n\n\ndef f(x):\n"
            "    return numba.typeof(x), from_dtype(x), nbt.float64, nbt, float32\n")
    assert compilers_reached(_small(tmp_path, "kbuild/keying/probe.py", text)) == []


@pytest.mark.parametrize("text,ok", [
    ("from .backend import lto\n", False),
    ("def f():\n    from kbuild.backend.lto import link\n", False),
    ("import importlib\n\n\ndef f():\n    return importlib.import_module('kbuild.backend.lto')\n",
     False),
    ("from .backend import backends\n", True),
    ("from .backend.base import Backend\n", True),
    ("import kbuild.backend\n", True),
], ids=["from-package-import", "lazy", "import_module", "backends", "base", "package"])
def test_only_the_backends_interface_is_imported_outside_it(tmp_path, text, ok):
    graph = _small(tmp_path, "kbuild/cli.py", text)

    def found(allowed):
        return [f.split(": ")[1] for f in backend_reach(graph, allowed)
                if f.startswith("kbuild/cli.py:")]

    assert found({}) == ([] if ok else [
        "only kbuild.backend, kbuild.backend.backends, kbuild.backend.base may be imported "
        "outside backend/"])
    assert found({("kbuild.cli", "kbuild.backend.lto"): "why"}) == []


@pytest.mark.parametrize("path,text,ok", [
    ("kbuild/cli.py", "from .backend.testing import fakedriver\n", False),
    ("kbuild/cli.py", "def f():\n    from . import testing\n", False),
    ("kbuild/backend/lto.py", "from .testing.fakedriver import installed\n", False),
    ("kbuild/testing.py", "from .backend.testing import fakedriver\n", True),
    ("kbuild/backend/testing/other.py", "from . import fakedriver\n", True),
], ids=["product", "the-door", "backend", "from-the-door", "among-themselves"])
def test_the_test_doubles_are_found_where_the_product_imports_them(tmp_path, path, text, ok):
    files = {"kbuild/backend/testing/__init__.py": "", "kbuild/backend/testing/fakedriver.py":
             "def installed():\n    pass\n", "kbuild/testing.py": "", path: text}
    graph = read_graph(_package(tmp_path, {**SMALL, **files}) / "kbuild")
    found = [f.split(":")[0] for f in doubles_imported(graph)]
    assert found == ([] if ok else [path])


def test_an_allow_list_entry_that_matches_nothing_is_stale(tmp_path):
    text = "import sys\n\n\ndef f(name):\n    return sys.modules[name], __import__(name)\n"
    graph = _small(tmp_path, "kbuild/cli.py", text + "\nfrom .backend import lto\n")
    listed = dict(computed={("kbuild/cli.py", "f"): "w"}, sys_modules={("kbuild/cli.py", "f"): "w"},
                  reach={("kbuild.cli", "kbuild.backend.lto"): "w"})
    assert stale_entries(graph, **listed) == []
    listed = dict(computed={("kbuild/cli.py", "g"): "w"}, sys_modules={("kbuild/cli.py", "f"): "w"},
                  reach={("kbuild.cli", "kbuild.backend.compiler"): "w"})
    assert stale_entries(graph, **listed) == [
        "BACKEND_REACH ('kbuild.cli', 'kbuild.backend.compiler')",
        "COMPUTED_IMPORTS ('kbuild/cli.py', 'g')"]


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


# A compiler's dispatcher attributes that the Backend interface answers for the rest of kbuild
# (`Backend.target_options`, `Backend.python_function` on a kernel).
DISPATCHER_READS = ("targetoptions",)
KBUILD = Path(__file__).resolve().parents[1] / "kbuild"
OUTSIDE_BACKEND = sorted(p for p in KBUILD.rglob("*.py")
                         if p.relative_to(KBUILD).parts[0] != "backend")


def _dispatcher_reads(source: str) -> list[str]:
    """`x.targetoptions` and `getattr(x, "targetoptions", ...)`, by line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr") and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant):
            name = node.args[1].value
        else:
            continue
        if name in DISPATCHER_READS:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_outside_backend_no_module_reads_a_dispatchers_options():
    # What a kernel was decorated with is the backend's to say (`Backend.target_options`).
    found = {p.relative_to(KBUILD).as_posix(): _dispatcher_reads(p.read_text())
             for p in OUTSIDE_BACKEND}
    assert {k: v for k, v in found.items() if v} == {}
    assert _dispatcher_reads("options = kernel.targetoptions\n"
                             "more = getattr(k, 'targetoptions', {})\n") == [
        "line 1: kernel.targetoptions", "line 2: getattr(k, 'targetoptions', {})"]


def test_a_second_builder_is_found_however_it_reaches_the_steps(tmp_path):
    """A module that commits, compiles or takes a key's lock itself, by any import form,
    is a second builder; the build service and the steps' own modules are not."""
    files = {
        "kbuild/__init__.py": "",
        "kbuild/store/__init__.py": "",
        "kbuild/store/locks.py": "class KeyLock:\n    pass\n",
        "kbuild/builder/__init__.py": "",
        "kbuild/builder/entries.py": "def commit():\n    pass\n\n\ndef fresh_entry():\n    pass\n",
        "kbuild/builder/compile.py": "def compile_target():\n    pass\n",
        "kbuild/builder/service.py": "from .entries import commit\nfrom .compile import compile_target\n"
                                   "from ..store.locks import KeyLock\n",
        "kbuild/builder/run.py": "from .service import BuildService\n",
        "kbuild/zeroconf.py": "from .builder import commit\nfrom .store.locks import KeyLock\n\n\n"
                              "def serve():\n    from .builder.compile import compile_target\n",
        "kbuild/project.py": "from . import builder as _build\nfrom .builder import entries\n\n\n"
                             "def load(plan):\n    return _build.fresh_entry(plan), entries.commit\n",
    }
    graph = read_graph(_package(tmp_path, files) / "kbuild")
    taken = [f.split(", a step")[0] for f in builder_steps(graph, allowed={})]
    assert taken == ["kbuild/project.py:6 takes commit", "kbuild/project.py:6 takes fresh_entry",
                     "kbuild/zeroconf.py:1 takes commit", "kbuild/zeroconf.py:2 takes KeyLock",
                     "kbuild/zeroconf.py:6 takes compile_target"]
    assert builder_steps(graph, allowed={("kbuild.zeroconf", "commit"): "why",
                                         ("kbuild.zeroconf", "KeyLock"): "why",
                                         ("kbuild.zeroconf", "compile_target"): "why",
                                         ("kbuild.project", "commit"): "why",
                                         ("kbuild.project", "fresh_entry"): "why"}) == []

