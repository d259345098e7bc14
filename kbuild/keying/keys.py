"""Target keys: a Merkle tree over everything a kernel's compiled code depends on.

This is the one documented place that lists what goes into a key
(schema `KEY_SCHEMA`). A target = kernel x signature x arch; its key is the
digest of a `KeyNode` tree:

- ``kernel MOD:QUALNAME`` - the kernel function:
  - ``body``: its normalized AST (see `normalize`), positions only with lineinfo/debug,
    and its bytecode without positions, local names or docstring (what numba compiles);
  - ``option NAME``: every decorator option (fastmath, opt, lineinfo, debug,
    max_registers, launch_bounds, lto, link files by content, ...);
  - ``global NAME`` / ``closure NAME`` / ``default NAME``: the values it reads
    (numbers, strings, tuples, numpy arrays and scalars, dtypes, numba types,
    enums, records field by field; library functions and numba's objects by
    qualified name, other libraries' constants by value); only names read by
    the body count, scope-aware (a nested function's local hides nothing);
  - ``callee MOD:QUALNAME``: the same tree for every device function (or
    jitable Python function) it reaches - through globals, module attributes,
    closure cells or default values - transitively; and for each name that
    reaches one, which function it names (``global NAME`` -> MOD:QUALNAME);
- ``signature``: each argument type by content (records by layout);
- ``arch``: the target architecture;
- ``toolchain``: numba-cuda, numba, llvmlite, NVVM, nvJitLink, Python, key schema;
- ``config``: numba config knobs that change generated code.

Keying is pure: side effects (reading source files and linked files, telling
project modules from libraries) come in through a `Sources` object.
"""

from __future__ import annotations

import ast
import builtins
import dis
import enum
import sys
import types as pytypes
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Protocol

from numba.core import types as nbtypes

from . import normalize
from .encode import Unencodable, digest_of, encode
from ..errors import KeyingError
from .values import canonical, summary, type_canonical

KEY_SCHEMA = 4  # 2: callee bindings, bytecode fingerprints, record fields with offsets
#                3: symbol numbers from identity (separately compiled objects)
#                4: floats by bit pattern; sets, dicts, functions in containers; no
#                   annotations, dead branches or kernel argument names; builtins set
#                   by the program

# Decorator options that never change the compiled code.
_IGNORED_OPTIONS = frozenset({"cache"})


@dataclass(frozen=True)
class KeyNode:
    """One key input: a label, a readable summary, a digest and its own inputs."""

    label: str
    summary: str
    digest: str
    children: tuple = ()
    # For a device function numba compiles into a library of its own (and so kbuild into an
    # object of its own): its identity, which names its symbols. Not part of the digest.
    ident: str | None = field(default=None, compare=False)

    def flatten(self, prefix=()):
        """Every node as (path of labels, summary, digest), depth first."""
        path = prefix + (self.label,)
        yield path, self.summary, self.digest
        for child in self.children:
            yield from child.flatten(path)


def leaf(label: str, value, text: str) -> KeyNode:
    """A key input whose content is the encodable `value`."""
    return KeyNode(label, text, digest_of(("leaf", KEY_SCHEMA, label, value)))


def branch(label: str, text: str, children) -> KeyNode:
    """A key input made of other inputs; children are ordered by label."""
    kids = tuple(sorted(children, key=lambda n: n.label))
    labels = [k.label for k in kids]
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate key labels under {label!r}: {labels}")
    inner = tuple((k.label, k.digest) for k in kids)
    return KeyNode(label, text, digest_of(("node", KEY_SCHEMA, label, inner)), kids)


class Sources(Protocol):
    """The side effects keying needs, passed in so keying stays pure."""

    def source_of(self, func) -> tuple[str, int] | None:
        """(source text, first line number) of a function, or None."""

    def is_project_module(self, module_name: str) -> bool:
        """Whether a module belongs to the project (its objects are keyed by content)."""

    def file_digest(self, path: str) -> str:
        """The digest of a linked file's bytes."""

    def overloads_of(self, func) -> list:
        """The functions numba's `@overload(func)` registered (what it compiles for `func`)."""

    def link_files_of(self, extfn) -> list[str]:
        """The files a `cuda.declare_device` function links."""

    def simulator_options(self, fake) -> dict:
        """The options of a simulator kernel (NUMBA_ENABLE_CUDASIM), which keeps none."""

    def known_to_numba(self, value) -> bool:
        """Whether numba's typing registries name `value` itself (compiled code can use it)."""


@dataclass
class _Function:
    """What keying needs to know about a function-like object."""

    py_func: pytypes.FunctionType
    options: dict | None  # None: a simulator kernel's, not read yet
    role: str  # "kernel", "device" or "function"


def as_function(obj) -> _Function | None:
    """The Python function and compile options behind a kernel, device function or jitable."""
    py_func = getattr(obj, "py_func", None)
    if isinstance(py_func, pytypes.FunctionType) and hasattr(obj, "targetoptions"):
        options = dict(obj.targetoptions)
        return _Function(py_func, options, "device" if options.get("device") else "kernel")
    fn = getattr(obj, "fn", None)
    if isinstance(fn, pytypes.FunctionType) and hasattr(obj, "_device"):
        # numba's simulator (NUMBA_ENABLE_CUDASIM): FakeCUDAKernel.
        # Its options are read back from its decorator when keyed (`Sources.simulator_options`).
        return _Function(fn, None, "device" if obj._device else "kernel")
    defn = getattr(obj, "_defn", None)
    if isinstance(defn, pytypes.FunctionType):
        return _Function(defn, {}, "function")  # a user @intrinsic
    if isinstance(obj, pytypes.FunctionType):
        return _Function(obj, {}, "function")
    return None


def qualified_name(func) -> str:
    return f"{func.__module__}:{func.__qualname__}"


class Keyer:
    """Builds key trees, remembering every function it has keyed in this process."""

    def __init__(self, sources: Sources):
        self._sources = self.sources = sources
        self._memo: dict = {}
        self._stack: list = []
        self.device_functions: list = []  # dispatchers reached as callees, for the compiler
        self.stable_ids: dict = {}  # py_func -> a number from its identity, for symbol names
        self.nodes: dict = {}  # py_func -> its function tree (however it was reached)
        self._ids_taken: set = set()
        self._contained_callees: list = []  # see `_contents`
        self._bodies: dict = {}  # body digest -> py_func, for `body_text`

    def body_text(self, body_digest: str) -> str | None:
        """The source of a body this keyer keyed as `body_digest`, normalized for reading
        (`normalize.readable_source`), or None. For display only: it keys nothing."""
        py_func = self._bodies.get(body_digest)
        try:
            found = py_func and function_def(self._sources, py_func)
        except KeyingError:  # the file changed since it was imported
            return None
        return normalize.readable_source(found[0]) if found else None

    def target_node(self, kernel, kernel_name: str, argtypes, signature_text: str,
                    arch: str, toolchain: dict, config: dict) -> KeyNode:
        """The key tree of one target (kernel x signature x arch)."""
        fn = as_function(kernel)
        if fn is None or fn.role != "kernel":
            raise KeyingError(f"target '{kernel_name}' is not a numba-cuda kernel")
        kernel_node = self.function_node(kernel, f"kernel {kernel_name}", kernel_name)
        return branch("target", kernel_name, [
            kernel_node,
            signature_node(argtypes, signature_text),
            leaf("arch", arch, arch),
            branch("toolchain", "", [leaf(k, v, str(v)) for k, v in toolchain.items()]),
            branch("config", "", [leaf(k, canonical(v), summary(v)) for k, v in config.items()]),
        ])

    def function_node(self, obj, label: str, where: str) -> KeyNode:
        """The key tree of a kernel, device function or jitable function."""
        fn = as_function(obj)
        if fn.options is None:
            fn.options = dict(self._sources.simulator_options(obj))
        memo_key = (label, obj)
        if memo_key in self._memo:
            return self._memo[memo_key]
        if any(f is fn.py_func for f in self._stack):
            # Recursion: refer to the function by name; its content is keyed above.
            return leaf(label, ("recursive", qualified_name(fn.py_func)), "recursive")
        if fn.role != "function" and not label.startswith("kernel ") \
                and not any(d is obj for d in self.device_functions):
            self.device_functions.append(obj)
        self._stack.append(fn.py_func)
        try:
            node = self._function_tree(fn, label, where)
        finally:
            self._stack.pop()
        number = self._assign_stable_id(fn.py_func, _identity(fn.py_func, node))
        if number is not None and _compiled_apart(fn):
            node = replace(node, ident=f"{qualified_name(fn.py_func)}${number}")
        self._memo[memo_key] = node
        self.nodes.setdefault(fn.py_func, node)
        return node

    def _assign_stable_id(self, py_func, identity: str) -> int | None:
        # numba numbers every function it compiles and mangles the number into symbol
        # names. A number from the function's identity (name, closure, defaults) makes
        # those names independent of build order, and keeps them when only the body
        # changes, so objects compiled against a callee still link with its new version.
        # Two distinct functions with one identity keep numba's own numbering.
        if py_func in self.stable_ids:
            return self.stable_ids[py_func]
        number = int(identity[:12], 16) + (1 << 48)
        if number in self._ids_taken:
            return None
        self._ids_taken.add(number)
        self.stable_ids[py_func] = number
        return number

    def _function_tree(self, fn: _Function, label: str, where: str) -> KeyNode:
        py_func = fn.py_func
        name = qualified_name(py_func)
        keep_positions = bool(fn.options.get("lineinfo") or fn.options.get("debug"))
        children = [self._body(py_func, keep_positions, where, fn.role == "kernel")]
        children += [self._option(k, v, where) for k, v in sorted(fn.options.items())
                     if k not in _IGNORED_OPTIONS]
        children += self._references(py_func, where)
        if fn.role == "function":
            # A stub whose @overload implementations are what numba compiles for it.
            children += [self.function_node(impl, f"overload {qualified_name(impl)}", where)
                         for impl in self._sources.overloads_of(py_func)]
        if keep_positions:
            children.append(leaf("file", _relative_file(py_func), _relative_file(py_func)))
        return branch(label, name, children)

    def _body(self, py_func, keep_positions: bool, where: str, kernel: bool) -> KeyNode:
        # A kernel is launched with positional arguments only: their names are not code.
        kind = f"ast{int(keep_positions)}{'k' if kernel else ''}"
        tree = _remembered(self._sources, py_func, kind,
                           lambda: _normalized_digest(self._sources, py_func, keep_positions,
                                                      kernel))
        if tree is not None:
            # numba compiles the bytecode, not the source: key both, so source read
            # back from a file edited after import (or `python -O`) can't pass for it.
            node = leaf("body", (tree, _code_fingerprint(py_func.__code__, where)),
                        "source with line numbers" if keep_positions else "source")
            self._bodies[node.digest] = py_func
            _offer_body_text(self._sources, node.digest, lambda: self.body_text(node.digest))
            return node
        # No parsable source (a lambda, exec'd code): key the bytecode instead.
        code = py_func.__code__
        if keep_positions:  # the line table ends up in the binary
            return leaf("body", (_code_canonical(code, where), code.co_firstlineno,
                                 code.co_linetable), "bytecode with line numbers")
        return leaf("body", _code_canonical(code, where), "bytecode")

    def _option(self, name, value, where) -> KeyNode:
        if name == "link":
            value = tuple(self._link_item(item, where) for item in (value or ()))
        elif name == "extensions":
            value = tuple(_extern_name(e) or _fail(where, f"option extensions item {e!r}")
                          for e in (value or ()))
        try:
            return leaf(f"option {name}", canonical(value), summary(value))
        except Unencodable as exc:
            raise KeyingError(f"{where}: option '{name}' has a value of type "
                              f"{exc.type_name} that kbuild cannot key") from None

    def _link_item(self, item, where):
        path = item if isinstance(item, str) else getattr(item, "path", None)
        if isinstance(path, str):
            try:
                return ("file", path.rsplit("/", 1)[-1], self._sources.file_digest(path))
            except OSError as exc:
                raise KeyingError(f"{where}: link file {path} cannot be read "
                                  f"({exc.strerror}); restore it or fix the link= path") \
                    from None
        data = getattr(item, "data", None)
        if isinstance(data, (bytes, str)):
            return ("code", type(item).__name__, digest_of(data))
        _fail(where, f"linked item of type {type(item).__name__}")

    def _references(self, py_func, where: str) -> list[KeyNode]:
        refs, bindings = [], {}
        for kind, name, value in _referenced_values(py_func, self._sources):
            refs.append(self._reference(kind, name, value, where))
            label = refs[-1][1].label
            # Device functions held in a tuple, list or dict the value is made of.
            refs += [(name, node) for node in self._contained_callees]
            self._contained_callees = []
            if label.startswith("callee "):
                callee = label[len("callee "):]
                # Which name reaches which function: swapping `sq as f, cube as g` to
                # `cube as f, sq as g` changes no body and no callee, only this.
                label = f"{kind} {name}"
                bindings[label] = leaf(label, ("calls", callee), callee)
        return _disambiguate(refs) + list(bindings.values())

    def _reference(self, kind: str, name: str, value, where: str):
        fn = as_function(value)
        if fn is not None and (fn.role != "function" or self._is_project_object(fn.py_func)):
            callee_label = f"callee {qualified_name(fn.py_func)}"
            return name, self.function_node(value, callee_label, where)
        label = f"{kind} {name}"
        if _is_extern_function(value):
            return name, self._extern_function(label, value)
        if _record_type(value) is not None:
            return name, _type_node(label, value)
        if isinstance(value, _LibraryRef):
            return name, leaf(label, ("library", value.module, value.path),
                              f"{value.module}.{value.path}")
        try:
            return name, leaf(label, canonical(value), summary(value))
        except Unencodable:
            pass
        if isinstance(value, _CONTAINERS):
            callees: list = []
            contents = self._contents(value, f"{kind} '{name}'", where, callees)
            self._contained_callees = callees  # taken by `_references` right away
            return name, leaf(label, contents, summary(value))
        extern = _extern_name(value)
        if extern is not None and not self._is_project_object(value):
            return name, leaf(label, ("extern",) + extern, f"{extern[0]}.{extern[1]}")
        if isinstance(value, type) and self._is_project_object(value):
            return name, self._project_class(label, value, where)
        raise KeyingError(
            f"{where}: {kind} '{name}' is a {type(value).__module__}."
            f"{type(value).__qualname__}, which kbuild cannot key by content; "
            "make it a number, string, tuple, numpy array or dtype, enum, "
            "or a device function")

    def _contents(self, value, what: str, where: str, callees: list):
        """A container by content, device functions in it as calls (their trees become
        the function's callees, as when a function is named directly)."""
        fn = as_function(value)
        if fn is not None and (fn.role != "function" or self._is_project_object(fn.py_func)):
            name = qualified_name(fn.py_func)
            callees.append(self.function_node(value, f"callee {name}", where))
            return ("calls", name)
        if isinstance(value, (tuple, list)):
            return (type(value).__name__,
                    tuple(self._contents(v, what, where, callees) for v in value))
        if isinstance(value, (set, frozenset)):
            return (type(value).__name__, tuple(sorted(
                (self._contents(v, what, where, callees) for v in value), key=encode)))
        if isinstance(value, dict):
            return ("dict", tuple(sorted(((self._contents(k, what, where, callees),
                                           self._contents(v, what, where, callees))
                                          for k, v in value.items()), key=encode)))
        try:
            return canonical(value)
        except Unencodable:
            pass
        extern = _extern_name(value)
        if extern is not None and not self._is_project_object(value):
            return ("extern",) + extern
        raise KeyingError(
            f"{where}: {what} holds a {type(value).__module__}.{type(value).__qualname__}, "
            "which kbuild cannot key by content; hold numbers, strings, tuples, numpy "
            "arrays or dtypes, enums or device functions in it instead")

    def _project_class(self, label, cls, where) -> KeyNode:
        """A class of the project's (a numba extension type, say) by its module's whole source.

        What numba compiles for it lives in typing and lowering functions registered
        elsewhere (`@type_callable`, `@lower`, `@overload_method`), usually beside the
        class; keying the whole module is coarse but never misses those.
        """
        module = sys.modules.get(cls.__module__)
        path = getattr(module, "__file__", None)
        if not path:
            _fail(where, f"class {cls.__qualname__} (no source file)")
        value = ("project-class", cls.__module__, cls.__qualname__,
                 self._sources.file_digest(path))
        return leaf(label, value, f"class {cls.__qualname__} (module {cls.__module__} source)")

    def _extern_function(self, label, extfn) -> KeyNode:
        """A `cuda.declare_device` function: its name, signature and linked files by content."""
        sig = extfn.sig
        files = tuple(sorted(self._link_item(path, label)
                             for path in self._sources.link_files_of(extfn)))
        value = ("extern-function", extfn.name, tuple(type_canonical(a) for a in sig.args),
                 type_canonical(sig.return_type), files)
        return leaf(label, value, f"declare_device {extfn.name}{sig}")

    def _is_project_object(self, value) -> bool:
        module = getattr(value, "__module__", None)
        return isinstance(module, str) and self._sources.is_project_module(module)


def _identity(py_func, node: KeyNode) -> str:
    """What tells one function from another, whatever its body: its qualified name and the
    values it closes over or takes as defaults (a closure factory's products differ)."""
    captured = tuple((k.label, k.digest) for k in node.children
                     if k.label.startswith(("closure ", "default ")))
    return digest_of(("identity", qualified_name(py_func), captured))


def _compiled_apart(fn: _Function) -> bool:
    """Whether numba compiles calls to `fn` as calls into a library of its own.

    A device function is, unless inlined at numba IR level (inline="always"); jitable
    functions and @overload implementations are left inside their caller's object.
    """
    return fn.role == "device" and fn.options.get("inline", "never") in ("never", False, None)


def own_digest(node: KeyNode) -> str:
    """A function tree's digest with each separately compiled callee by identity only.

    This keys the function's own object: what its code depends on except its callees'
    bodies, which live in their own objects (their interfaces are checked at link time).
    """
    inner = tuple((k.label, ("interface", k.ident) if k.ident and k.label.startswith("callee ")
                   else k.digest) for k in node.children)
    return digest_of(("own", KEY_SCHEMA, node.summary, inner))


def _remembered(sources, py_func, kind: str, compute):
    """`compute()` for `py_func`, remembered by the sources across processes if they can
    (`ProjectSources.remembered`: by the digest of the source numba compiles)."""
    remembered = getattr(sources, "remembered", None)
    return compute() if remembered is None else remembered(py_func, kind, compute)


def _offer_body_text(sources, body_digest: str, render) -> None:
    """Hand a body's readable source (`render()`, called only if it is not kept yet) to
    sources that keep it for `kbuild explain` (`ProjectSources.keep_body_text`)."""
    keep = getattr(sources, "keep_body_text", None)
    if keep is not None:
        keep(body_digest, render)


def _normalized_digest(sources, py_func, keep_positions: bool, kernel: bool) -> str | None:
    found = function_def(sources, py_func)
    if found is None:
        return None
    fdef, first_line = found
    return digest_of(normalize.normalized_ast(fdef, keep_positions=keep_positions,
                                              first_line=first_line, positional_args=kernel))


def _is_extern_function(value) -> bool:
    cls = type(value)
    return cls.__name__ == "ExternFunction" and cls.__module__.startswith("numba") \
        and hasattr(value, "sig") and hasattr(value, "name")


def signature_node(argtypes, signature_text: str) -> KeyNode:
    """Argument types by content; records get one child per field for explanations."""
    return branch("signature", signature_text,
                  [_type_node(f"argument {i}", t) for i, t in enumerate(argtypes, 1)])


def _type_node(label, t) -> KeyNode:
    """A numba type by content; a record (or an array of records) with one child per field."""
    record = _record_type(t)
    if record is not None:
        kids = [leaf(f"field '{n}'", (canonical(f.type), f.offset), f"{f.type} @{f.offset}")
                for n, f in record.fields.items()]
        kids.append(leaf("layout", canonical(t), f"size {record.size}, aligned {record.aligned}, "
                                                 f"fields {', '.join(record.fields)}"))
        return branch(f"{label} record", str(t), kids)
    return leaf(label, canonical(t), str(t))


def _record_type(t):
    """The numba Record that `t` is or holds (as an array's dtype), else None."""
    if not isinstance(t, nbtypes.Type):
        return None
    record = t if isinstance(t, nbtypes.Record) else getattr(t, "dtype", None)
    return record if isinstance(record, nbtypes.Record) else None


def _disambiguate(refs) -> list[KeyNode]:
    """One node per label; one function reached under two names with two contents gets both."""
    by_label: dict[str, list] = {}
    for name, node in refs:
        by_label.setdefault(node.label, []).append((name, node))
    out = []
    for label, items in by_label.items():
        distinct = {node.digest for _, node in items}
        if len(distinct) == 1:
            out.append(items[0][1])
            continue
        for name, node in items:
            out.append(KeyNode(f"{label} (as {name})", node.summary, node.digest, node.children))
    return out


def _referenced_values(py_func, sources):
    """(kind, dotted name, value) for every global, closure cell and default it reads."""
    names = _load_chains(py_func, sources)
    closure = dict(zip(py_func.__code__.co_freevars, py_func.__closure__ or ()))
    for chain in sorted(names):
        base = chain[0]
        if base in closure:
            kind, scope = "closure", _cell_value(closure[base])
        elif base in py_func.__globals__:
            kind, scope = "global", py_func.__globals__[base]
        elif hasattr(builtins, base):
            kind, scope = "builtin", getattr(builtins, base)
            if _is_language_builtin(base, scope):
                continue  # part of the language (the toolchain keys Python's version)
        else:
            yield "global", base, ("unbound", base)
            continue
        yield (kind,) + _resolve_chain(chain, scope, sources)
    for name, value in _defaults(py_func):
        yield "default", name, value


def _is_language_builtin(name: str, value) -> bool:
    """Whether `builtins.NAME` is Python's own, not a name a program put into builtins
    (which is keyed like a global: numba reads it the same way)."""
    if value is Ellipsis or value is NotImplemented:
        return True
    return getattr(value, "__module__", None) in ("builtins", "_sitebuiltins") \
        and getattr(value, "__name__", name) == name


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return ("empty-cell",)


@dataclass(frozen=True)
class _LibraryRef:
    """`cuda.grid`, `math.sqrt`: an attribute of a library module, keyed by its name.

    The library's version decides what it means (numba's and numpy's are in
    the toolchain), and the name is the same under numba's simulator, whose
    objects differ from the real ones.
    """

    module: str
    path: str


def _resolve_chain(chain, value, sources):
    """Follow attribute accesses through modules: `mathx.sq` is the function `sq`."""
    i = 1
    while i < len(chain) and (_is_namespace(value) or _constant_of_plain_class(value, chain[i],
                                                                                sources)):
        if isinstance(value, pytypes.ModuleType) and not sources.is_project_module(value.__name__) \
                and _by_name(value.__name__, getattr(value, chain[i], None)):
            return ".".join(chain), _LibraryRef(value.__name__, ".".join(chain[i:]))
        value = getattr(value, chain[i], _MISSING)
        i += 1
    if value is _MISSING:
        return ".".join(chain[:i]), ("missing attribute", ".".join(chain[:i]))
    return ".".join(chain[:i]), value


_MISSING = object()
_CONTAINERS = (tuple, list, dict, set, frozenset)

# Packages whose versions are in the toolchain key: their attributes are keyed by name.
_TOOLCHAIN_PACKAGES = frozenset({"numba", "llvmlite"})


def _by_name(module_name: str, target) -> bool:
    """Whether a library module's attribute is keyed by name rather than followed to its value.

    Device functions are keyed by content wherever they live. numba's own objects
    are keyed by name (its version is in the toolchain; the simulator's objects
    differ). Elsewhere - a constant, an array or a submodule of a package that is
    not under the project's paths - what it holds is followed and keyed by value,
    since no key input records that package's version.
    """
    fn = as_function(target) if target is not None else None
    if fn is not None and fn.role != "function":
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


def _constant_of_plain_class(cls, attr: str, sources) -> bool:
    """Whether `cls.attr` is a constant of a plain project class, keyed by its value.

    numba compiles no reference to such a class (it cannot type it): `Cls.N` is read
    by Python code that numba runs while typing (an `@overload` body), which sees
    exactly `getattr(Cls, "N")`, inherited or not. A class numba knows (an extension
    type, a namedtuple, one with a metaclass) is keyed by its module instead (see
    `Keyer._project_class`): its typing and lowering live in registrations there.
    """
    if not (isinstance(cls, type) and type(cls) is type and not hasattr(cls, "_fields")):
        return False
    if not sources.is_project_module(cls.__module__) or sources.known_to_numba(cls):
        return False
    try:
        canonical(getattr(cls, attr))
    except (Unencodable, AttributeError):
        return False
    return True


def _is_namespace(value) -> bool:
    # Modules, and enum classes: `Mode.FAST` reads one member, not the whole class.
    return isinstance(value, pytypes.ModuleType) or (
        isinstance(value, type) and issubclass(value, enum.Enum))


def _defaults(py_func):
    code = py_func.__code__
    positional = code.co_varnames[:code.co_argcount]
    for name, value in zip(positional[len(positional) - len(py_func.__defaults__ or ()):],
                           py_func.__defaults__ or ()):
        yield name, value
    for name, value in sorted((py_func.__kwdefaults__ or {}).items()):
        yield name, value


def function_def(sources, py_func):
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


def _load_chains(py_func, sources) -> set[tuple[str, ...]]:
    """Dotted names read by the function that are not its own locals.

    The names its source reads (remembered across processes), joined with the names
    its bytecode reads: facts read back from the store can add names, never hide one
    that the code numba compiles reads.
    """
    chains = _remembered(sources, py_func, "chains",
                         lambda: sorted(map(list, _load_chains_of(py_func, sources))))
    try:
        chains = set(tuple(str(part) for part in chain) for chain in chains)
    except TypeError:  # not a list of lists: not what `_load_chains_of` makes
        chains = _load_chains_of(py_func, sources)
    return chains | _bytecode_chains(py_func.__code__)


def _load_chains_of(py_func, sources) -> set[tuple[str, ...]]:
    found = function_def(sources, py_func)
    fdef = found[0] if found is not None else None
    if fdef is None:
        return _drop_prefixed(_code_names(py_func.__code__))
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


_LOAD_NAME_OPS = frozenset({"LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME", "LOAD_CLASSDEREF"})
_LOAD_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


def _code_names(code) -> set[tuple[str, ...]]:
    """Dotted names read by bytecode (a function without source): `helpers.typed` is
    followed through the module like in source, not keyed as the bare module."""
    names = set((n,) for n in code.co_freevars)
    chain = None
    for ins in dis.get_instructions(code):
        if ins.opname in _LOAD_NAME_OPS:
            chain = (ins.argval,)
        elif ins.opname in _LOAD_ATTR_OPS and chain is not None:
            chain += (ins.argval,)
        else:
            chain = None
            continue
        names.add(chain)
    for const in code.co_consts:
        if isinstance(const, pytypes.CodeType):
            names |= _code_names(const)
    return names


def _bytecode_chains(code) -> set[tuple[str, ...]]:
    """Dotted names that `code` (and the code nested in it) reads from its globals or its
    closure: its own locals and the cells it shares with nested functions are left out."""
    closure = frozenset(code.co_freevars)
    return {(chain[0],) + chain[2:] for chain in _bytecode_loads(code)
            if chain[1] == "g" or chain[0] in closure}


@lru_cache(maxsize=None)
def _bytecode_loads(code) -> frozenset:
    """(name, "g" | "d", attribute...) for every global or cell load chain in `code`, each
    as far as it goes (`a.b.c` gives only that, as the source's attribute chain does)."""
    found = set()
    chain = None
    for ins in dis.get_instructions(code):
        if ins.opname in _LOAD_ATTR_OPS and chain is not None:
            chain += (ins.argval,)
            continue
        if chain is not None:
            found.add(chain)
        chain = None
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            chain = (ins.argval, "g")
        elif ins.opname in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
            chain = (ins.argval, "d")
    if chain is not None:
        found.add(chain)
    for const in code.co_consts:
        if isinstance(const, pytypes.CodeType):
            found |= _bytecode_loads(const)
    return frozenset(found)


def _code_canonical(code, where):
    consts = tuple(_const_canonical(c, where, _code_canonical) for c in code.co_consts)
    return ("code", code.co_code, consts, code.co_names, code.co_varnames,
            code.co_freevars, code.co_argcount, code.co_kwonlyargcount)


def _code_fingerprint(code, where):
    """The instructions, minus what comments, formatting, docstrings, positions and local names change.

    Locals by slot number, constants by value (a docstring shifts their
    indices), names, comparisons and the like by their text; no line numbers. No NOPs
    either (what is left of a branch on a constant, for line tracing), so jumps go
    to instruction numbers, not offsets.
    """
    instructions = [ins for ins in dis.get_instructions(code) if ins.opname != "NOP"]
    number = {ins.offset: i for i, ins in enumerate(instructions)}
    ops = []
    for ins in instructions:
        if ins.opcode in dis.hasconst:
            # By index, not argval: dis cannot show some (3.11's KW_NAMES gives <unknown>).
            arg = _const_canonical(code.co_consts[ins.arg], where, _code_fingerprint)
        elif ins.opcode in dis.hasname or ins.opcode in dis.hascompare:
            arg = ins.argrepr
        elif ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs:
            arg = ("to", _jump_target(number, ins.argval))
        else:
            arg = ins.arg
        ops.append((ins.opname, arg))
    return ("bytecode", tuple(ops), code.co_argcount, code.co_posonlyargcount,
            code.co_kwonlyargcount)


def _jump_target(number: dict, offset: int) -> int:
    """The number of the instruction at `offset`, or after it if that was a NOP."""
    while offset not in number and offset <= max(number, default=0):
        offset += 2
    return number.get(offset, len(number))


def _const_canonical(c, where, code_form):
    """A bytecode constant by content; sets in a hash-independent order."""
    if isinstance(c, pytypes.CodeType):
        return code_form(c, where)
    if c is Ellipsis:
        return ("Ellipsis",)
    if isinstance(c, frozenset):
        return ("frozenset", tuple(sorted((_const_canonical(x, where, code_form) for x in c),
                                          key=encode)))
    if isinstance(c, tuple):
        return ("tuple", tuple(_const_canonical(x, where, code_form) for x in c))
    try:
        return canonical(c)
    except Unencodable:
        _fail(where, f"a constant of type {type(c).__name__} in bytecode")


def _extern_name(value):
    module = getattr(value, "__module__", None)
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if isinstance(module, str) and isinstance(name, str):
        return module, name
    return None


def _relative_file(py_func) -> str:
    # Only the module path: absolute paths never enter a key.
    return py_func.__module__.replace(".", "/") + ".py"


def _fail(where, what):
    raise KeyingError(f"{where}: {what} cannot be keyed by content")
