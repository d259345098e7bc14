"""The normalized AST of a function: what the compiler sees, minus what it doesn't.

Docstrings, comments, decorators and formatting are dropped; source positions
are kept only when the binary embeds them (``lineinfo`` / ``debug``). Local
variables are renamed to their order of first appearance, so renaming a local
(alpha-equivalence) rebuilds nothing, unless the binary names them: ``debug``
information does, a ``lineinfo`` line table holds lines only.
"""

from __future__ import annotations

import ast
import copy
import textwrap

from .encode import close_tuple, encode_into, open_tuple

_FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef)
_SCOPE_NODES = _FUNCTION_NODES + (ast.Lambda, ast.ClassDef, ast.ListComp,
                                  ast.SetComp, ast.DictComp, ast.GeneratorExp)


class NoSource(ValueError):
    """The function's source cannot be parsed back into one function definition."""


def parse_function(source: str, name: str) -> ast.FunctionDef:
    """Parse `source` (as `inspect.getsource` returns it) into the def named `name`."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError as exc:
        raise NoSource(f"source does not parse: {exc.msg}") from None
    for node in tree.body:
        if isinstance(node, _FUNCTION_NODES) and node.name == name:
            return node
    raise NoSource(f"no 'def {name}' at the start of its source")


def local_names(fn: ast.FunctionDef) -> set[str]:
    """Names bound inside `fn` (arguments, assignments, imports, nested defs)."""
    bound = {a.arg for a in _all_args(fn.args)}
    declared_global = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared_global.update(node.names)
        elif isinstance(node, _FUNCTION_NODES + (ast.ClassDef,)) and node is not fn:
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound - declared_global


def free_loads(fn: ast.FunctionDef) -> list[ast.Name]:
    """The `Name` loads in `fn`'s body that read a name from outside `fn` (globals, closures).

    Scope-aware: a name bound only inside a nested function, lambda or
    comprehension is local there and does not hide a global of the same name
    read elsewhere in `fn`. Decorators and defaults of `fn` itself are not its body.
    """
    out: list[ast.Name] = []
    _scope_loads(fn.body, _bound_names(fn.body, fn.args), (), out)
    return out


def _scope_loads(roots, bound, enclosing, out, *, is_class=False) -> None:
    """Collect the free loads of one scope (its own nodes start at `roots`), then of nested ones."""
    names, declared_global = bound
    for node in _own_nodes(roots):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in declared_global or not any(node.id in b for b in (names, *enclosing)):
                out.append(node)
        elif isinstance(node, _SCOPE_NODES):
            inner_roots, args = _scope_parts(node)
            # A class body's names are not visible inside its methods.
            inner_enclosing = enclosing if is_class else (names, *enclosing)
            _scope_loads(inner_roots, _bound_names(inner_roots, args), inner_enclosing, out,
                         is_class=isinstance(node, ast.ClassDef))


def _scope_parts(node):
    """(the nodes evaluated inside a nested scope, its arguments or None)."""
    if isinstance(node, _FUNCTION_NODES):
        return list(node.body), node.args
    if isinstance(node, ast.Lambda):
        return [node.body], node.args
    if isinstance(node, ast.ClassDef):
        return list(node.body), None
    # Comprehensions: the first iterable is evaluated outside (see _own_nodes).
    first, *rest = node.generators
    parts = [first.target, *first.ifs]
    for gen in rest:
        parts += [gen.target, gen.iter, *gen.ifs]
    elts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
    return parts + elts, None


def _own_nodes(roots):
    """Nodes of one scope, not descending into nested scopes' own code.

    A nested def's decorators and defaults, a class's bases and a
    comprehension's first iterable run in the enclosing scope, so they are yielded here.
    """
    stack = list(reversed(roots))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, _FUNCTION_NODES + (ast.Lambda,)):
            outer = list(getattr(node, "decorator_list", ())) + list(node.args.defaults)
            outer += [d for d in node.args.kw_defaults if d is not None]
        elif isinstance(node, ast.ClassDef):
            outer = node.decorator_list + node.bases + [k.value for k in node.keywords]
        elif isinstance(node, _SCOPE_NODES):  # a comprehension
            outer = [node.generators[0].iter]
        else:
            outer = list(ast.iter_child_nodes(node))
        stack.extend(reversed(outer))


def _bound_names(roots, args) -> tuple[set, set]:
    """(names bound in one scope, names it declares global)."""
    bound = {a.arg for a in _all_args(args)} if args is not None else set()
    declared, declared_global = set(), set()
    for node in _own_nodes(roots):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
            if isinstance(node, ast.Global):
                declared_global.update(node.names)
        elif isinstance(node, _FUNCTION_NODES + (ast.ClassDef,)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    return bound - declared, declared_global


def _all_args(args: ast.arguments):
    yield from args.posonlyargs
    yield from args.args
    yield from args.kwonlyargs
    if args.vararg:
        yield args.vararg
    if args.kwarg:
        yield args.kwarg


def normalized_ast(fn: ast.FunctionDef, *, keep_positions: bool, keep_names: bool = False,
                   first_line: int = 1, positional_args: bool = False,
                   elided: frozenset = frozenset()) -> bytes:
    """The canonical encoding of `fn`'s signature and body, decorators, docstrings,
    annotations and dead branches removed (see `compiled_view`).

    `first_line` is the file line of the source's first line, so kept positions
    are the file positions that end up in the binary's line table. `keep_names`: the
    binary names locals and arguments (debug information), so they are not renamed. With
    `positional_args` (a kernel: launched with positional arguments only; a device
    function, whose calls that name a parameter are observed where numba binds them)
    arguments are renamed by position too.
    `elided`: names of nested functions whose bodies are left out (`elide_bodies`).
    """
    fn = compiled_view(fn)
    if elided:
        fn = elide_bodies(fn, elided)
    body = _strip_docstrings(fn.body)
    renames = {} if keep_names or _has_nested_scope(fn) else \
        _alpha_renames(fn, rename_args=positional_args)
    write = _NodeWriter(renames, keep_positions, first_line)
    # Written straight into one buffer: the same bytes as encoding the nested tuples
    # (args, (statements...)), without building them first.
    start = open_tuple(write.out)
    write(_without_default_values(fn.args))
    write(body)
    close_tuple(start, write.out)
    return bytes(write.out)


def readable_source(fn: ast.FunctionDef) -> str:
    """`fn` as `normalized_ast` sees it, as source a person reads (for `kbuild explain`'s
    diffs): no decorators, docstrings, annotations or dead branches, default values as
    `...` (they are keyed by value). Names are kept as written: the renaming that makes
    the key blind to a local's name would only make the text harder to read."""
    fn = compiled_view(fn)
    fn.decorator_list = []
    fn.body = _strip_docstrings(fn.body)
    fn.args.defaults = [ast.Constant(value=...) for _ in fn.args.defaults]
    fn.args.kw_defaults = [d and ast.Constant(value=...) for d in fn.args.kw_defaults]
    return ast.unparse(ast.fix_missing_locations(fn))


def compiled_view(fn: ast.FunctionDef) -> ast.FunctionDef:
    """`fn` as far as its bytecode goes: without annotations (numba ignores them; a
    local's annotation is not even evaluated) and without the branches of an `if` on a
    constant (CPython compiles only the branch taken). A copy; `fn` is untouched.

    The function's bytecode is keyed beside this tree, so if the compiler kept
    something dropped here, the key still changes.
    """
    view = _CompiledView().visit(copy.deepcopy(fn))
    return view


def elide_bodies(fn: ast.FunctionDef, names) -> ast.FunctionDef:
    """`fn` with the body of each undecorated function named in `names` that it defines
    in its own scope replaced by `...` (its name, arguments and default expressions,
    which `fn` runs, stay). A copy; `fn` is untouched."""
    view = copy.deepcopy(fn)
    for node in _own_nodes(view.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names \
                and not node.decorator_list:
            node.body = [ast.Expr(value=ast.Constant(value=...))]
    return view


class _CompiledView(ast.NodeTransformer):
    def visit_arg(self, node):
        node.annotation = None
        return node

    def visit_FunctionDef(self, node):
        node.returns = None
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node):
        if node.value is None:
            # `x: int` compiles to nothing; `obj.attr: int` still evaluates `obj`.
            return None if node.simple else ast.Expr(value=self.visit(_target_base(node.target)))
        return self.generic_visit(ast.copy_location(
            ast.Assign(targets=[node.target], value=node.value), node))

    def visit_If(self, node):
        if isinstance(node.test, ast.Constant):
            taken = node.body if node.test.value else node.orelse
            return [self.visit(stmt) for stmt in taken] or None
        return self.generic_visit(node)


def _target_base(target):
    # What `target: T` evaluates: the object of an attribute, the object and index of a
    # subscript (both kept whole: their order is the bytecode's).
    return target.value if isinstance(target, ast.Attribute) else target


def _without_default_values(args: ast.arguments) -> ast.arguments:
    """`args` with each default expression replaced by a marker.

    Default values are keyed by value (``default #N``, from ``__defaults__``),
    which is what the compiler uses; the expression that made them is not code
    the kernel runs, so `delta=1.0` -> `delta=2.0` shows as a default, not a body change.
    """
    def marker(expr):
        return None if expr is None else ast.Name(id="<default>", ctx=ast.Load())

    out = copy.copy(args)
    out.defaults = [marker(d) for d in args.defaults]
    out.kw_defaults = [marker(d) for d in args.kw_defaults]
    return out


def _strip_docstrings(body: list) -> list:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:] or [ast.Pass()]
    return body


def _has_nested_scope(fn: ast.FunctionDef) -> bool:
    return any(isinstance(n, _SCOPE_NODES) for n in ast.walk(fn) if n is not fn)


def _alpha_renames(fn: ast.FunctionDef, rename_args: bool = False) -> dict[str, str]:
    """Locals that are not arguments, numbered in order of first appearance.

    Arguments keep their names (callers may pass them by keyword), except with
    `rename_args` (a kernel's; a device function's, whose keyword calls are observed),
    where they are numbered by position first.
    """
    argnames = {a.arg for a in _all_args(fn.args)}
    candidates = local_names(fn) - argnames
    renames: dict[str, str] = {}
    if rename_args:
        renames.update((a.arg, f"_a{i}") for i, a in enumerate(_all_args(fn.args)))
    for node in _in_source_order(fn.body):
        if isinstance(node, ast.Name) and node.id in candidates and node.id not in renames:
            renames[node.id] = f"_l{len(renames)}"
    return renames


def _in_source_order(stmts):
    for stmt in stmts:
        yield from _walk_ordered(stmt)


def _walk_ordered(node):
    # ast.walk is breadth-first; numbering needs a stable depth-first order.
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _walk_ordered(child)


def _encode_node(node, renames, keep_positions, first_line):
    if node is None or isinstance(node, (str, int, float, complex, bytes, bool)):
        return node
    if isinstance(node, list):
        return tuple(_encode_node(n, renames, keep_positions, first_line) for n in node)
    if node is Ellipsis:
        return ("...",)
    if not isinstance(node, ast.AST):
        raise TypeError(f"unexpected AST field value {type(node).__name__}")
    # The node's type fixes its fields and their order (per Python version, which
    # the toolchain keys), so values alone are unambiguous and half the size.
    fields = [type(node).__name__]
    for name in node._fields:
        if name == "type_comment":
            continue
        value = getattr(node, name, None)
        if (isinstance(node, ast.Name) and name == "id") or (isinstance(node, ast.arg)
                                                              and name == "arg"):
            value = renames.get(value, value)
        if isinstance(node, ast.Constant) and name == "value":
            fields.append(_constant(value))
            continue
        fields.append(_encode_node(value, renames, keep_positions, first_line))
    if keep_positions and hasattr(node, "lineno"):
        # Lines only: numba's line tables give every location column 1 (`.loc 1 8 1`).
        fields.append(("@line", node.lineno + first_line - 1))
    return tuple(fields)


class _NodeWriter:
    """Encodes an AST node as the tuple `_encode_node` would make, straight into `out`."""

    def __init__(self, renames, keep_positions, first_line):
        self.out = bytearray()
        self.renames, self.keep_positions, self.first_line = renames, keep_positions, first_line

    def __call__(self, node) -> None:
        out = self.out
        if isinstance(node, list):
            start = open_tuple(out)
            for item in node:
                self(item)
            close_tuple(start, out)
        elif isinstance(node, ast.AST):
            self._node(node)
        else:
            encode_into(_encode_node(node, self.renames, self.keep_positions, self.first_line),
                        out)

    def _node(self, node) -> None:
        out = self.out
        start = open_tuple(out)
        encode_into(type(node).__name__, out)
        is_name, is_constant = isinstance(node, ast.Name), isinstance(node, ast.Constant)
        is_arg = isinstance(node, ast.arg)
        for name in node._fields:
            if name == "type_comment":
                continue
            value = getattr(node, name, None)
            if (is_name and name == "id") or (is_arg and name == "arg"):
                encode_into(self.renames.get(value, value), out)
            elif is_constant and name == "value":
                encode_into(_constant(value), out)
            else:
                self(value)
        if self.keep_positions and hasattr(node, "lineno"):
            encode_into(("@line", node.lineno + self.first_line - 1), out)
        close_tuple(start, out)


def _constant(value):
    # Constants are tagged with their type so 1, 1.0 and True differ.
    if value is Ellipsis:
        return ("Ellipsis",)
    return (type(value).__name__, value)
