"""Reference resolution: the values a function reads, found by name.

`referenced_values` walks the names a function's body reads (scope-aware, from its
source, joined with the names its bytecode loads) and resolves each through its
closure cells, globals or builtins, following attribute chains through modules
(`mathx.sq` is the function `sq`), enum classes and plain project classes. Library
attributes that the toolchain pins (``cuda.grid``) resolve to a `LibraryRef`, keyed by
name. The `Keyer` keys what comes back.
"""

from __future__ import annotations

import ast
import builtins
import enum
import types as pytypes
from dataclasses import dataclass

from . import made, normalize
from .bytecode import (
    bytecode_chains, code_names, discarded_chains, loaded_bases, pruned_chains,
)
from .encode import Unencodable
from .interfaces import ObjectModel, Role, Sources
from .tree import LabelKind
from .values import canonical

# Packages whose versions are in the toolchain key: their attributes are keyed by name.
_TOOLCHAIN_PACKAGES = frozenset({"numba", "llvmlite"})

_MISSING = object()


@dataclass(frozen=True)
class LibraryRef:
    """`cuda.grid`, `math.sqrt`: an attribute of a library module, keyed by its name.

    The library's version decides what it means (numba's and numpy's are in
    the toolchain), and the name is the same under numba's simulator, whose
    objects differ from the real ones.
    """

    module: str
    path: str


@dataclass(frozen=True)
class RawNamespace:
    """`fn.__globals__`: a module's namespace reached through a function, whose reads
    nothing observes (the function hands out the module's own dict, never a recording
    one, and no read of it can be seen): a key made without them could go stale, so the
    keyer refuses it."""

    chain: str


def referenced_values(py_func, sources: Sources, objects: ObjectModel, chains=None,
                      defaults=None):
    """(kind, dotted name, value) for every global, closure cell and default it reads;
    `kind` is `LabelKind.GLOBAL`, `CLOSURE`, `DEFAULT` or `BUILTIN`. `chains`: the
    names it reads (`load_chains`), when the caller holds them already. `defaults`: the
    default values the compiler folds omitted arguments with (`Function.defaults`),
    where they are not the function's current `__defaults__`."""
    names = _load_chains(py_func, sources) if chains is None else chains
    code = py_func.__code__
    closure = dict(zip(code.co_freevars, py_func.__closure__ or ()))
    scope = made.view(py_func.__globals__)  # what a compile filled, as the program made it
    # What the bytecode never loads (source after a `return`, say) numba never reads;
    # what only a branch numba prunes on the values now reads is never compiled (decided
    # here, on the values now: the names a code object reads are remembered).
    names = {chain for chain in names if chain[0] in loaded_bases(code)} \
        - pruned_chains(code, scope, closure)
    thrown = discarded_chains(code)
    for chain in sorted(names):
        base = chain[0]
        if base in closure:
            kind, start = LabelKind.CLOSURE, _cell_value(closure[base])
        elif base in scope:
            kind, start = LabelKind.GLOBAL, scope[base]
        elif hasattr(builtins, base):
            kind, start = LabelKind.BUILTIN, getattr(builtins, base)
            if _is_language_builtin(base, start):
                continue  # part of the language (the toolchain keys Python's version)
        else:
            yield LabelKind.GLOBAL, base, ("unbound", base)
            continue
        name, value = _resolve_chain(chain, start, sources, objects)
        if chain in thrown:
            value = _uncalled(value, objects)
        yield kind, name, value
    for name, value in _defaults(py_func, defaults):
        yield LabelKind.DEFAULT, name, value


def _uncalled(value, objects: ObjectModel):
    """A value read and thrown away: numba types it and compiles nothing of it, so a
    device function is keyed as one, not by its body."""
    fn = objects.function_of(value)
    if fn is not None and fn.role is Role.DEVICE:
        return ("device function, never called",)
    return value


def _is_language_builtin(name: str, value) -> bool:
    """Whether `builtins.NAME` is Python's own, not a name a program put into builtins
    (which is keyed like a global: numba reads it the same way)."""
    if value is Ellipsis or value is NotImplemented:
        return True
    return getattr(value, "__module__", None) in ("builtins", "_sitebuiltins") \
        and getattr(value, "__name__", name) == name


def _cell_value(cell):
    try:
        value = made.item(cell, "contents", cell.cell_contents)  # a compile's memo: unset
    except ValueError:  # an empty cell
        return ("empty-cell",)
    return ("empty-cell",) if value is made.ABSENT else value


def _resolve_chain(chain, value, sources: Sources, objects: ObjectModel):
    """Follow attribute accesses through modules: `mathx.sq` is the function `sq`.
    A module's `__dict__` is the module (code reading it while numba compiles is handed
    a namespace that observes each name read, as `vars(mod)` is); a function's
    `__globals__`, its module's own dict, is a `RawNamespace`."""
    i = 1
    while i < len(chain) and (_is_namespace(value) or _constant_of_plain_class(
            value, chain[i], sources, objects)):
        if isinstance(value, pytypes.ModuleType) and chain[i] == "__dict__":
            return ".".join(chain[:i]), value
        if isinstance(value, pytypes.ModuleType) and not sources.is_project_module(value.__name__) \
                and _by_name(value.__name__, made.attribute(value, chain[i], None), objects):
            return ".".join(chain), LibraryRef(value.__name__, ".".join(chain[i:]))
        value = made.attribute(value, chain[i], _MISSING)
        i += 1
    if value is _MISSING:
        return ".".join(chain[:i]), ("missing attribute", ".".join(chain[:i]))
    if i < len(chain) and chain[i] == "__globals__" and \
            isinstance(made.attribute(value, "__globals__", None), dict):
        return ".".join(chain[:i + 1]), RawNamespace(".".join(chain[:i + 1]))
    return ".".join(chain[:i]), value


def _by_name(module_name: str, target, objects: ObjectModel) -> bool:
    """Whether a library module's attribute is keyed by name rather than followed to its value.

    Device functions are keyed by content wherever they live. numba's own objects
    are keyed by name (its version is in the toolchain; the simulator's objects
    differ). Elsewhere - a constant, an array or a submodule of a package that is
    not under the project's paths - what it holds is followed and keyed by value,
    since no key input records that package's version.
    """
    fn = objects.function_of(target) if target is not None else None
    if fn is not None and fn.role is not Role.FUNCTION:
        return False
    if module_name.partition(".")[0] in _TOOLCHAIN_PACKAGES:
        return True
    if isinstance(target, pytypes.ModuleType):
        return False
    try:
        canonical(target)
    except Unencodable:
        return True
    return False


def _constant_of_plain_class(cls, attr: str, sources: Sources, objects: ObjectModel) -> bool:
    """Whether `cls.attr` is a constant of a plain project class, keyed by its value.

    numba compiles no reference to such a class (it cannot type it): `Cls.N` is read
    by Python code that numba runs while typing (an `@overload` body), which sees
    exactly `getattr(Cls, "N")`, inherited or not. A class numba knows (an extension
    type, a namedtuple, one with a metaclass) is keyed as a whole instead (see
    `Keyer._project_class`), its typing and lowering by what compiles observe.
    """
    if not (isinstance(cls, type) and type(cls) is type and not hasattr(cls, "_fields")):
        return False
    if not sources.is_project_module(cls.__module__) or objects.known_to_compiler(cls):
        return False
    try:
        canonical(made.attribute(cls, attr))
    except (Unencodable, AttributeError):
        return False
    return True


def _is_namespace(value) -> bool:
    # Modules, and enum classes: `Mode.FAST` reads one member, not the whole class.
    return isinstance(value, pytypes.ModuleType) or (
        isinstance(value, type) and issubclass(value, enum.Enum))


def _defaults(py_func, recorded=None):
    """(`#N`, value) for each parameter with a default, N its place among the parameters:
    by place, not name, so renaming a parameter changes no key (a call that names it is
    observed where numba binds it: `Kind.PARAMETERS`)."""
    code = py_func.__code__
    positional = code.co_varnames[:code.co_argcount]
    named = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]

    def place(name):
        return f"#{named.index(name)}" if name in named else name

    if recorded is not None:  # the compiler's record: positional in order, then by name
        yield from ((place(n), recorded[n]) for n in positional if n in recorded)
        yield from sorted(((place(n), v) for n, v in recorded.items() if n not in positional),
                          key=lambda item: item[0])
        return
    for name, value in zip(positional[len(positional) - len(py_func.__defaults__ or ()):],
                           py_func.__defaults__ or ()):
        yield place(name), value
    for name, value in sorted((py_func.__kwdefaults__ or {}).items()):
        yield place(name), value


def function_def(sources: Sources, py_func):
    """(the function's `def` node, the file line of its first source line), or None."""
    finder = getattr(sources, "function_def", None)
    if finder is not None:
        found = finder(py_func)
        if found is not None:
            return found
    found = sources.source_of(py_func)
    if found is None:
        return None
    try:
        return normalize.parse_function(found[0], py_func.__name__), found[1]
    except normalize.NoSource:
        return None


def remembered(sources: Sources, py_func, kind: str, compute):
    """`compute()` for `py_func`, remembered by the sources across processes if they can
    (`ProjectSources.remembered`: by the digest of the source numba compiles)."""
    keep = getattr(sources, "remembered", None)
    return compute() if keep is None else keep(py_func, kind, compute)


def load_chains(py_func, sources: Sources) -> frozenset:
    """The dotted names `py_func` reads (see `_load_chains`): for `referenced_values`."""
    return frozenset(_load_chains(py_func, sources))


def _load_chains(py_func, sources: Sources) -> set[tuple[str, ...]]:
    """Dotted names read by the function that are not its own locals.

    The names its source reads (remembered across processes), joined with the names
    its bytecode reads: facts read back from the store can add names, never hide one
    that the code numba compiles reads.
    """
    chains = remembered(sources, py_func, "chains",
                        lambda: sorted(map(list, _load_chains_of(py_func, sources))))
    try:
        chains = set(tuple(str(part) for part in chain) for chain in chains)
    except TypeError:  # not a list of lists: not what `_load_chains_of` makes
        chains = _load_chains_of(py_func, sources)
    return chains | bytecode_chains(py_func.__code__)


def _load_chains_of(py_func, sources: Sources) -> set[tuple[str, ...]]:
    found = function_def(sources, py_func)
    fdef = found[0] if found is not None else None
    if fdef is None:
        return _drop_prefixed(code_names(py_func.__code__))
    # Decorators and default expressions ran at definition time: options and
    # __defaults__ key them. Only the body (and nested code) reads at compile time,
    # and only what is compiled: not annotations, not a branch on a constant.
    fdef = normalize.compiled_view(fdef)
    free = set(normalize.free_loads(fdef))
    chains: set[tuple[str, ...]] = set()
    bases = set()
    nodes = [n for stmt in fdef.body for n in ast.walk(stmt)]
    # `a.b` inside `a.b.c` is one read of `a.b.c`, not a read of `a.b` besides.
    # (AST nodes hash by identity: this is a set of the nodes themselves.)
    inner = {n.value for n in nodes
             if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)}
    for node in nodes:
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) \
                and node not in inner:
            chain = _attribute_chain(node)
            if chain and _chain_base(node) in free:
                chains.add(chain)
                bases.add(_chain_base(node))
    # A name read bare as well as through attributes (`Cls(...)` and `Cls.N`) keeps both:
    # the bare read needs the whole value.
    chains.update((node.id,) for node in free if node not in bases)
    return chains


def _chain_base(node):
    """The innermost Name of an attribute chain (the node object itself, for membership)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def _attribute_chain(node) -> tuple[str, ...] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return tuple(reversed(parts))


def _drop_prefixed(chains):
    # `a.b.c` read inside `a.b.c.d` is the same access; keep only maximal chains.
    out = set()
    for chain in chains:
        if not any(other != chain and other[:len(chain)] == chain for other in chains):
            out.add(chain)
    return out
