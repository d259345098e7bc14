"""The normalized AST of a function: what the compiler sees, minus what it doesn't.

Docstrings, comments, decorators and formatting are dropped; source positions
are kept only when the binary embeds them (``lineinfo`` / ``debug``). Without
positions, local variables are renamed to their order of first appearance,
so renaming a local (alpha-equivalence) rebuilds nothing.
"""

from __future__ import annotations

import ast
import textwrap

from .encode import encode

_POSITION_FIELDS = ("lineno", "col_offset", "end_lineno", "end_col_offset")
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


def _all_args(args: ast.arguments):
    yield from args.posonlyargs
    yield from args.args
    yield from args.kwonlyargs
    if args.vararg:
        yield args.vararg
    if args.kwarg:
        yield args.kwarg


def normalized_ast(fn: ast.FunctionDef, *, keep_positions: bool, first_line: int = 1) -> bytes:
    """The canonical encoding of `fn`'s signature and body, decorators and docstrings removed.

    `first_line` is the file line of the source's first line, so kept positions
    are the file positions that end up in the binary's line table.
    """
    body = _strip_docstrings(fn.body)
    renames = {} if keep_positions or _has_nested_scope(fn) else _alpha_renames(fn)
    args_node = fn.args
    encoded = (
        _encode_node(args_node, renames, keep_positions, first_line),
        tuple(_encode_node(stmt, renames, keep_positions, first_line) for stmt in body),
        _encode_node(fn.returns, renames, keep_positions, first_line),
    )
    return encode(encoded)


def _strip_docstrings(body: list) -> list:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:] or [ast.Pass()]
    return body


def _has_nested_scope(fn: ast.FunctionDef) -> bool:
    return any(isinstance(n, _SCOPE_NODES) for n in ast.walk(fn) if n is not fn)


def _alpha_renames(fn: ast.FunctionDef) -> dict[str, str]:
    """Locals that are not arguments, numbered in order of first appearance.

    Arguments keep their names: callers may pass them by keyword.
    """
    argnames = {a.arg for a in _all_args(fn.args)}
    candidates = local_names(fn) - argnames
    renames: dict[str, str] = {}
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
    fields = []
    for name in node._fields:
        if name == "type_comment":
            continue
        value = getattr(node, name, None)
        if isinstance(node, ast.Name) and name == "id":
            value = renames.get(value, value)
        if isinstance(node, ast.Constant) and name == "value":
            fields.append((name, _constant(value)))
            continue
        fields.append((name, _encode_node(value, renames, keep_positions, first_line)))
    if keep_positions and hasattr(node, "lineno"):
        fields.append(("@line", node.lineno + first_line - 1, node.col_offset))
    return (type(node).__name__, tuple(fields))


def _constant(value):
    # Constants are tagged with their type so 1, 1.0 and True differ.
    if value is Ellipsis:
        return ("Ellipsis",)
    return (type(value).__name__, value)
