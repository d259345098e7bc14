"""The keyer: builds a target's key tree (see `tree` for what goes into it).

`Keyer` keys a kernel and, transitively, every function it reaches, each once per
process; it asks `Sources` for side effects and an `ObjectModel` what the compiler's
objects are (`interfaces`), finds what each function reads with `references`, and
fingerprints bytecode with `bytecode`.
"""

from __future__ import annotations

import functools
import os
import sys
import types as pytypes
from dataclasses import replace
from pathlib import PurePath

from . import made, normalize
from ..environ import WatchedEnviron
from ..errors import KeyingError
from .bytecode import code_canonical, code_fingerprint, nested_code, returned_functions, \
    returned_globals
from .ctext import compiled_as_cuda_c
from .encode import Unencodable, digest_of, encode
from .interfaces import Function, LinkedCode, ObjectModel, Role, Sources, python_function
from .references import LibraryRef, RawNamespace, function_def, referenced_values, remembered
from .tree import LabelKind, KeyNode, branch, label_kind, label_name, leaf, reached_as, \
    record_label
from .values import cache_held, cache_unwrapped, canonical, cannot_key, instance_state, \
    is_cache, library_object_form, made_at_import, summary, type_canonical

# Decorator options that never change the compiled code.
_IGNORED_OPTIONS = frozenset({"cache"})
_CONTAINERS = (tuple, list, dict, set, frozenset, pytypes.MappingProxyType)
# What a class holds for Python's bookkeeping or a dataclass's (mirrors of its fields,
# which are keyed as the class attributes and instance state they are): never keyed.
_CLASS_PLUMBING = frozenset({"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__",
                             "__firstlineno__", "__static_attributes__", "__annotations__",
                             "__slots__", "__dataclass_fields__", "__dataclass_params__",
                             "__match_args__"})
# Libraries whose plain objects are keyed by their public state (their versions are in
# the toolchain key). Not numba's: its objects of state (device arrays) hold addresses.
_VERSIONED_LIBRARIES = frozenset({"numpy"})
_DEPTH = 32  # objects held in objects, at most (deeper: a cycle, refused)


def qualified_name(func) -> str:
    return f"{func.__module__}:{func.__qualname__}"


class Keyer:
    """Builds key trees, remembering every function it has keyed in this process."""

    def __init__(self, sources: Sources, objects: ObjectModel):
        self._sources = self.sources = sources
        self._objects = self.objects = objects
        self._memo: dict = {}
        self._stack: list = []
        self.device_functions: list = []  # dispatchers reached as callees, for the compiler
        self._reached_ids: set = set()  # of `device_functions` (kept alive there), by identity
        self.stable_ids: dict = {}  # py_func -> a number from its identity, for symbol names
        # function object -> its tree (however it was reached). By the object numba
        # compiles, not its Python function: one function jitted twice with other options
        # (`cuda.jit(device=True, fastmath=True)(f)` beside `cuda.jit(device=True)(f)`) is
        # two device functions, two trees, two objects.
        self.nodes: dict = {}
        self._ids_taken: set = set()
        self._contained_callees: list = []  # see `_contents`
        self._nesting = 0  # objects inside objects `_object_contents` is keying now
        self._bodies: dict = {}  # body digest -> py_func, for `body_text`

    def python_function(self, obj):
        """The Python function a function object in `nodes` compiles."""
        return self._objects.function_of(obj).py_func

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
        fn = self._objects.function_of(kernel)
        if fn is None or fn.role is not Role.KERNEL:
            raise KeyingError(f"target '{kernel_name}' is not a numba-cuda kernel")
        kernel_node = self.function_node(kernel, LabelKind.KERNEL.label(kernel_name),
                                         kernel_name)
        return branch(LabelKind.TARGET.label(), kernel_name, [
            kernel_node,
            signature_node(argtypes, signature_text, self._objects),
            leaf(LabelKind.ARCH.label(), arch, arch),
            branch(LabelKind.TOOLCHAIN.label(), "",
                   [leaf(k, v, str(v)) for k, v in toolchain.items()]),
            branch(LabelKind.CONFIG.label(), "",
                   [leaf(k, canonical(v), summary(v)) for k, v in config.items()]),
        ])

    def function_node(self, obj, label: str, where: str, selector: bool = False) -> KeyNode:
        """The key tree of a kernel, device function or jitable function. `selector`: an
        `@overload*` function, which numba runs and whose returned implementation it
        compiles: the bodies of the nested implementations it only makes and returns are
        left out (`bytecode.returned_functions`; the one numba compiles is observed)."""
        fn = self._objects.function_of(obj)
        if fn.options is None:
            fn.options = dict(self._objects.options_of(obj))
        memo_key = (label, obj, selector)
        found = self._memo.get(memo_key)
        if found is not None and found[1] == made.generation():
            made.replay(found[2])  # the names the slots it read as made hand on
            return found[0]
        if any(f is fn.py_func for f in self._stack):
            # Recursion: refer to the function by name; its content is keyed above.
            return leaf(label, ("recursive", qualified_name(fn.py_func)), "recursive")
        if fn.role is not Role.FUNCTION and label_kind(label) is not LabelKind.KERNEL \
                and id(obj) not in self._reached_ids:
            self.device_functions.append(obj)
            self._reached_ids.add(id(obj))
        self._stack.append(fn.py_func)
        try:
            with made.touches() as touched:
                node = self._function_tree(fn, label, where, selector)
        finally:
            self._stack.pop()
        number = self._assign_stable_id(fn.py_func, _identity(fn.py_func, node))
        if number is not None and _compiled_apart(fn):
            node = replace(node, ident=f"{qualified_name(fn.py_func)}${number}")
        self._memo[memo_key] = (node, made.generation(), frozenset(touched))
        self.nodes.setdefault(obj, node)
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

    def _function_tree(self, fn: Function, label: str, where: str,
                       selector: bool = False) -> KeyNode:
        py_func = fn.py_func
        name = qualified_name(py_func)
        # What the binary embeds of the source: debug information its lines and the
        # names of locals and arguments, a lineinfo line table its lines only.
        keep_names = bool(fn.options.get("debug"))
        keep_positions = keep_names or bool(fn.options.get("lineinfo"))
        elided = returned_functions(py_func.__code__) if selector else frozenset()
        children = [self._body(py_func, keep_positions, keep_names, where,
                               self._by_place(fn), elided)]
        children += [self._option(k, v, where) for k, v in sorted(fn.options.items())
                     if k not in _IGNORED_OPTIONS]
        returned = returned_globals(py_func.__code__) if selector else frozenset()
        refs, bindings = self._references(py_func, where, fn.defaults,
                                          frozenset(".".join(c) for c in returned))
        attributes, held = self._attribute_parts(py_func, where)
        # One function may be reached both ways, and under one name twice (held twice).
        children += _disambiguate(refs + held) + bindings + attributes
        if fn.role is Role.FUNCTION:
            # A stub whose @overload implementations (and how each was registered: strict,
            # inline, ...) are what numba compiles for it.
            # Numba tries them in registration order (the first that types wins): the
            # second and later are labelled by their place in it.
            for index, (impl, options) in enumerate(self._objects.overloads_of(py_func)):
                place = f" #{index}" if index else ""
                children.append(self.function_node(
                    impl, LabelKind.OVERLOAD.label(qualified_name(impl) + place), where,
                    selector=True))
                children += [self._option(f"overload{place} {name}", value, where)
                             for name, value in sorted(options.items())]
        if keep_positions:
            path = _relative_file(py_func)
            children.append(leaf(LabelKind.FILE.label(), path, path))
        return branch(label, name, children)

    def _by_place(self, fn: Function) -> bool:
        """Whether `fn`'s parameters are keyed by place, not name. A kernel's are: it is
        launched with positional arguments only. A device function's are where a call
        that names one can be observed, numba binding it against the function found by
        its name (`module:qualname` of `Kind.PARAMETERS`): a function that name finds now,
        or a factory's product whose code that name finds in the factory's, compiled apart
        (not inlined into its callers' IR). Anything else (a jitable, a function made by
        `exec`, one of two lambdas) keeps its names."""
        if fn.role is Role.KERNEL:
            return True
        if not _compiled_apart(fn):
            # A jitable, or a device function numba inlines into its caller's IR (inline=
            # "always"): that binds a call's keywords itself (no dispatcher's call template
            # sees them), and a debug caller's information names the inlined parameters.
            return False
        py_func = fn.py_func
        module = sys.modules.get(py_func.__module__)
        if not isinstance(module, pytypes.ModuleType) or \
                py_func.__globals__ is not pytypes.ModuleType.__getattribute__(module, "__dict__"):
            return False  # made in a namespace of its own (`exec`): no name finds it again
        outer, local, inner = py_func.__qualname__.partition(".<locals>.")
        found = python_function(self._objects, _named(py_func, outer))
        if local:  # a factory's product: its code, found in the factory's by its name
            return found is not None and nested_code(found.__code__, inner) is py_func.__code__
        return found is py_func

    def attribute_nodes(self, py_func, where: str) -> list[KeyNode]:
        """What the program set on the function object (`helper.scale = 2.0`), by
        content: Python that numba runs while typing (an `@overload` body) reads
        `helper.scale` as it reads a global, and a program may set it at run time. Device
        functions held there are callees. Python's own (`__wrapped__`) are no state. A
        value with no content form (a test runner's mark, a library's record) is keyed as
        the function's module source holds it, as a class with no content form is: set in
        that source, an edit there rebuilds; it never fails a kernel that holds it."""
        nodes, callees = self._attribute_parts(py_func, where)
        return nodes + _disambiguate(callees)

    def _attribute_parts(self, py_func, where: str) -> tuple[list, list]:
        """`attribute_nodes` as (the attributes' leaves, [(path, callee node)])."""
        held = {name: value for name, value in made.view(vars(py_func)).items()
                if not (name.startswith("__") and name.endswith("__"))}
        nodes: list[KeyNode] = []
        callees: list = []
        for name in sorted(held):
            what = f"attribute '{name}' of function {qualified_name(py_func)}"
            label = LabelKind.ATTRIBUTE.label(name)
            found: list = []
            try:
                contents = self._contents(held[name], what, where, found,
                                          f"{py_func.__name__}.{name}")
            except KeyingError:
                nodes.append(self._attribute_source(label, py_func, held[name], where))
                continue
            nodes.append(leaf(label, contents, summary(held[name])))
            callees += found
        return nodes, callees

    def _attribute_source(self, label, py_func, value, where: str) -> KeyNode:
        """An attribute with no content form: its type by name and the source of the
        module that defines the function (where a decorator or an assignment set it)."""
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
        source = self._module_source(py_func, where, f"attribute holding a {kind} of "
                                     f"function {qualified_name(py_func)}")
        form = ("attribute-by-source", kind, py_func.__module__, source)
        return leaf(label, form, f"a {kind} (module {py_func.__module__} source)")

    def _module_source(self, obj, where: str, what: str) -> str:
        """The digest of the source file of the module that defines `obj`, which keys
        `what` as a whole; without a source file, `what` cannot be keyed (KeyingError)."""
        path = getattr(sys.modules.get(obj.__module__), "__file__", None)
        if not path:
            cannot_key(where, f"{what} (no source file)")
        return self._sources.file_digest(path)

    def _body(self, py_func, keep_positions: bool, keep_names: bool, where: str,
              kernel: bool, elided: frozenset = frozenset()) -> KeyNode:
        # `kernel`: arguments by place (`_by_place`), their names are not code.
        # "ast1": lines and names kept (debug); "ast1a": lines kept, locals renamed.
        kind = f"ast{int(keep_positions)}{'' if keep_names or not keep_positions else 'a'}" \
               f"{'k' if kernel else ''}"
        names = frozenset(c.co_name for c in elided)
        if names:
            kind += " elided " + ",".join(sorted(names))
        tree = remembered(self._sources, py_func, kind,
                          lambda: _normalized_digest(self._sources, py_func, keep_positions,
                                                     keep_names, kernel, names))
        body = LabelKind.BODY.label()
        if tree is not None:
            # numba compiles the bytecode, not the source: key both, so source read
            # back from a file edited after import (or `python -O`) can't pass for it.
            node = leaf(body, (tree, code_fingerprint(py_func.__code__, where, elided)),
                        "source with line numbers" if keep_positions else "source")
            self._bodies[node.digest] = py_func
            _offer_body_text(self._sources, node.digest, lambda: self.body_text(node.digest))
            return node
        # No parsable source (a lambda, exec'd code): key the bytecode instead.
        code = py_func.__code__
        if keep_positions:  # the line table ends up in the binary
            return leaf(body, (code_canonical(code, where), code.co_firstlineno,
                               code.co_linetable), "bytecode with line numbers")
        return leaf(body, code_canonical(code, where), "bytecode")

    # -- the leaves of a function's tree, one at a time (zeroconf's journal re-takes them) --

    def is_callee(self, value) -> bool:
        """Whether a value a function reads is keyed as a callee (by its own tree)."""
        return self._callee(value) is not None

    def callee(self, value) -> Function | None:
        """A value a function reads as the function it is keyed as (a callee), or None."""
        return self._callee(value)

    def value_leaf(self, kind: LabelKind, name: str, value, where: str) -> KeyNode | None:
        """The node a value a function reads gets in its tree (KeyingError when it cannot
        be keyed), or None when it holds callees (their trees are the function's too)."""
        _, node = self._reference(kind, name, value, where)
        if self._contained_callees:
            self._contained_callees = []
            return None
        return node

    def option_leaf(self, name: str, value, where: str) -> KeyNode:
        """The node of one decorator option (`link` by its files' bytes)."""
        return self._option(name, value, where)

    def _option(self, name, value, where) -> KeyNode:
        if name == "link":
            value = tuple(self._link_item(item, where) for item in (value or ()))
        elif name == "extensions":
            value = tuple(_extern_name(e) or cannot_key(where, f"option extensions item {e!r}")
                          for e in (value or ()))
        try:
            return leaf(LabelKind.OPTION.label(name), canonical(value), summary(value))
        except Unencodable as exc:
            raise KeyingError(f"{where}: option '{name}' has a value of type "
                              f"{exc.type_name} that kbuild cannot key") from None

    def _link_item(self, item, where):
        linked = self._objects.linked_item(item)
        if isinstance(linked, str):
            read = self._sources.cuda_source_digest if compiled_as_cuda_c(linked) else \
                self._sources.file_digest
            try:
                return ("file", linked.rsplit("/", 1)[-1], read(linked))
            except OSError as exc:
                raise KeyingError(f"{where}: link file {linked} cannot be read "
                                  f"({exc.strerror}); restore it or fix the link= path") \
                    from None
        if isinstance(linked, LinkedCode):
            return ("code", linked.kind, digest_of(linked.data))
        cannot_key(where, f"linked item of type {type(item).__name__}")

    def _references(self, py_func, where: str, defaults=None,
                    returned: frozenset = frozenset()) -> tuple[list, list[KeyNode]]:
        """What `py_func` reads: [(the name or path it reaches it by, its leaf or callee
        tree)] for `_disambiguate`, and the leaves binding each name to the function it
        calls; `returned`: the dotted names a selector only returns
        (`bytecode.returned_globals`)."""
        refs, bindings = [], {}
        for kind, name, value in referenced_values(py_func, self._sources, self._objects,
                                                   defaults=defaults):
            if name in returned and self._implementation(value):
                # numba compiles it only where this selector is the one chosen, and the
                # compile observes it then (`function mod:impl`): which one, not its body.
                label = kind.label(name)
                refs.append((name, leaf(label, ("returned implementation",
                                                qualified_name(value)), name)))
                continue
            refs.append(self._reference(kind, name, value, where))
            label = refs[-1][1].label
            # Device functions held in a tuple, list or dict the value is made of, each
            # by where it is held (`FUNCS[0]`): two closures of one factory share a name.
            refs += self._contained_callees
            self._contained_callees = []
            if label_kind(label) is LabelKind.CALLEE:
                callee = label_name(label)
                # Which name reaches which function: swapping `sq as f, cube as g` to
                # `cube as f, sq as g` changes no body and no callee, only this.
                label = kind.label(name)
                bindings[label] = leaf(label, ("calls", callee), callee)
        return refs, list(bindings.values())

    def _implementation(self, value) -> bool:
        """Whether a value a selector returns is an implementation numba compiles as
        Python, observed when it does: a project's plain function, with no registrations
        of its own, that its module and name find (the observation digests what
        `function mod:name` finds then). A closure a factory made at import, a lambda,
        a function whose name now finds another: none is found by its name, so it is
        keyed here by content, its closure's values with it."""
        fn = self._callee(value)
        return fn is not None and fn.role is Role.FUNCTION \
            and isinstance(value, pytypes.FunctionType) and fn.py_func is value \
            and not self._objects.overloads_of(value) and _found_by_name(value)

    def _callee(self, value) -> Function | None:
        """`value` as a function keyed as a callee (by its tree), else None."""
        fn = self._objects.function_of(value)
        if fn is not None and (fn.role is not Role.FUNCTION or self._is_project_object(fn.py_func)):
            return fn
        return None

    def _reference(self, kind: LabelKind, name: str, value, where: str):
        value = cache_unwrapped(value)
        fn = self._callee(value)
        if fn is not None:
            callee_label = LabelKind.CALLEE.label(qualified_name(fn.py_func))
            return name, self.function_node(value, callee_label, where)
        label = kind.label(name)
        declared = self._objects.declared_function(value)
        if declared is not None:
            return name, self._declared_function(label, declared)
        if self._objects.record_of(value) is not None:
            return name, _type_node(label, value, self._objects)
        if isinstance(value, RawNamespace):
            raise KeyingError(
                f"{where}: reads '{value.chain}', a module's namespace reached through a "
                "function, which kbuild cannot follow (no read of it can be observed); "
                "read the names from the module itself (`module.NAME`, `vars(module)`)")
        if isinstance(value, LibraryRef):
            return name, leaf(label, ("library", value.module, value.path),
                              f"{value.module}.{value.path}")
        try:
            return name, leaf(label, canonical(value), summary(value))
        except Unencodable:
            pass
        if isinstance(value, _CONTAINERS) or self._object_state(value) is not None:
            callees: list = []
            contents = self._contents(value, f"{kind.value} '{name}'", where, callees, name)
            self._contained_callees = callees  # taken by `_references` right away
            return name, leaf(label, contents, summary(value))
        environ = _environment_name(value)
        if environ is not None:
            # The process's environment: what code reads of it is observed by name as it
            # runs (`observed env`), never the whole mapping.
            return name, leaf(label, ("extern", "os", environ), f"os.{environ}")
        extern = _extern_name(value)
        if extern is not None and not self._is_project_object(value):
            return name, leaf(label, ("extern",) + extern, f"{extern[0]}.{extern[1]}")
        if isinstance(value, type) and self._is_project_object(value):
            return name, self._project_class(label, value, where)
        form = library_object_form(value)
        if form is not None:
            return name, leaf(label, form, form[0])
        raise KeyingError(
            f"{where}: {kind.value} '{name}' is a {type(value).__module__}."
            f"{type(value).__qualname__}, which kbuild cannot key by content; "
            "make it a number, string, tuple, numpy array or dtype, enum, "
            "or a device function")

    def _contents(self, value, what: str, where: str, callees: list, path: str = ""):
        """A container by content, device functions in it as calls: their trees become
        the function's callees, as when a function is named directly, each appended to
        `callees` as (where it is held from `path` on, its tree)."""
        value = cache_unwrapped(value)
        fn = self._callee(value)
        if fn is not None:
            name = qualified_name(fn.py_func)
            callees.append((path, self.function_node(value, LabelKind.CALLEE.label(name),
                                                     where)))
            return ("calls", name)
        if isinstance(value, (tuple, list)):
            items = made.sequence(value) if isinstance(value, list) else value
            return (type(value).__name__,
                    tuple(self._contents(v, what, where, callees, f"{path}[{i}]")
                          for i, v in enumerate(items)))
        if isinstance(value, (set, frozenset)):  # no place: members told apart by content
            return (type(value).__name__, tuple(sorted(
                (self._contents(v, what, where, callees, f"{path}{{}}") for v in value),
                key=encode)))
        if isinstance(value, (dict, pytypes.MappingProxyType)):
            # A mapping proxy (`types.MappingProxyType`, a class's `__dict__`): a read-only
            # view, keyed by what it shows.
            return ("dict" if isinstance(value, dict) else "mappingproxy", tuple(sorted(
                ((self._contents(k, what, where, callees, f"{path}{{}}"),
                  self._contents(v, what, where, callees, f"{path}[{_key_text(k)}]"))
                 for k, v in made.view(value).items()),
                key=encode)))
        try:
            return canonical(value)
        except Unencodable:
            pass
        environ = _environment_name(value)
        if environ is not None:  # held in a container: read by name, observed (above)
            return ("extern", "os", environ)
        extern = _extern_name(value)
        if extern is not None and not self._is_project_object(value):
            return ("extern",) + extern
        state = self._object_state(value)
        if state is not None:
            return self._object_contents(value, state, what, where, callees, path)
        form = library_object_form(value)
        if form is not None:
            return form
        raise KeyingError(
            f"{where}: {what} holds a {type(value).__module__}.{type(value).__qualname__}, "
            "which kbuild cannot key by content; hold numbers, strings, tuples, numpy "
            "arrays or dtypes, enums or device functions in it instead")

    def _object_state(self, value) -> tuple | None:
        """What a configuration object that Python reads while numba compiles is keyed by,
        as (kind, state): a `functools.partial` (its function, arguments and keywords), an
        lru_cache'd function holding answers no compile made (its function, and each such
        call's arguments and answer: made at import, say, from reads no compile saw), a
        `SimpleNamespace`, or an instance of a plain class of the project's (a dataclass,
        a settings object: `instance_state`); None for anything else."""
        if isinstance(value, functools.partial):
            return "partial", {"func": value.func, "args": value.args,
                               "keywords": dict(value.keywords)}
        try:
            held = cache_held(value)
        except Unencodable:
            raise KeyingError(
                "kbuild cannot read the answers a functools cache holds on this Python; "
                "make what it returns a module constant") from None
        if held:  # what an lru_cache'd helper answers from, made outside compiles
            return "cached", {"func": value.__wrapped__, "held": held}
        if isinstance(value, pytypes.SimpleNamespace):
            return "namespace", instance_state(value)
        if isinstance(value, PurePath):
            return "path", {"at": self._path_form(value)}
        if not self._is_project_object(type(value)):
            # numpy's (`np.finfo(np.float32)`): its version is keyed, so its classes by
            # name and their public state by value.
            library = type(value).__module__.partition(".")[0] in _VERSIONED_LIBRARIES
            state = instance_state(value) if library else None
            return None if state is None else (
                "library-instance", {k: v for k, v in state.items() if not k.startswith("_")})
        state = instance_state(value)
        return None if state is None else ("instance", state)

    def _path_form(self, path: PurePath) -> tuple:
        """A path by where it is in the project (never the checkout's own location), else
        as written."""
        relative = getattr(self._sources, "relative_path", None)
        found = relative(str(path)) if relative is not None and path.is_absolute() else None
        return ("project",) + found if found is not None else ("as-written", path.as_posix())

    def _object_contents(self, value, state, what, where, callees, path: str = ""):
        """An object (`_object_state`) by content: its class by its code, then each
        attribute it holds by its value, in name order. Raises KeyingError for one
        nested deeper than `_DEPTH` (a cycle)."""
        kind, attributes = state
        if self._nesting > _DEPTH:
            raise KeyingError(f"{where}: {what} holds objects nested more than {_DEPTH} deep "
                              "(a cycle?), which kbuild cannot key by content; hold plain "
                              "values in it instead")
        self._nesting += 1
        try:
            held = tuple((name, self._contents(attributes[name], what, where, callees,
                                               f"{path}.{name}"))
                         for name in sorted(attributes))
        finally:
            self._nesting -= 1
        if kind == "library-instance":
            return (kind, type(value).__module__, type(value).__qualname__, held)
        if kind != "instance":
            return (kind, held)
        cls = type(value)
        return (kind, cls.__module__, cls.__qualname__, self._instance_class(cls, where), held)

    def object_digest(self, value, where: str) -> str | None:
        """The digest of a configuration object (`_object_state`) by content, functions it
        holds by their trees; None for any other value."""
        state = self._object_state(value)
        if state is None:
            return None
        callees: list = []
        contents = self._object_contents(value, state, "object", where, callees)
        return digest_of((contents, tuple(node.digest for _, node in callees)))

    def _instance_class(self, cls, where: str) -> str:
        """The class of a configuration object by what it holds (`_class_parts`); by its
        modules' sources where an attribute has no such form. A comment elsewhere in its
        module changes nothing."""
        parts = self._class_parts(cls, where)
        if parts is None:
            label = LabelKind.GLOBAL.label(cls.__qualname__)
            return self._class_source(label, cls, where).digest
        return digest_of(("class", cls.__module__, cls.__qualname__, parts))

    def _class_parts(self, cls, where: str) -> tuple | None:
        """Each attribute of each of `cls`'s project classes, functions (methods, property
        getters) by their trees, values by content, library bases by name; None where an
        attribute has no such form."""
        parts = []
        for klass in cls.__mro__[:-1]:
            if not self._is_project_object(klass):
                parts.append(("base", klass.__module__, klass.__qualname__))
                continue
            for attr, value in sorted(made.view(klass, vars(klass)).items()):
                if attr in _CLASS_PLUMBING:
                    continue
                form = self._class_attribute(value, where)
                if form is None:
                    return None
                parts.append((klass.__qualname__, attr, form))
        return tuple(parts)

    def _class_attribute(self, value, where: str):
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if is_cache(value):  # a cached method: its function, and what it kept
            state = self._object_state(value)
            value = value.__wrapped__
            if state is not None:
                function = self._class_attribute(value, where)
                callees: list = []
                try:
                    held = self._contents(state[1]["held"], "a cache", where, callees)
                except KeyingError:  # an answer with no content form: the module's source
                    return None
                return None if function is None else (
                    "cached", function, held, tuple(node.digest for _, node in callees))
        if isinstance(value, property):
            return property_form(value, lambda f: self._class_attribute(f, where))
        try:
            return ("value", canonical(value))
        except Unencodable:
            pass
        if not isinstance(value, pytypes.FunctionType):
            return None
        if not self._is_project_object(value):  # a library's (3.13's `__replace__`): by name
            extern = _extern_name(value)
            return None if extern is None else ("extern",) + extern
        if function_def(self._sources, value) is None:
            # Made by exec from the class's fields (a dataclass's `__init__`, `__eq__`):
            # by its code, whose names the fields are.
            return ("code", digest_of(code_fingerprint(value.__code__, value.__qualname__)))
        fn = self._callee(value)
        if fn is None:
            return None
        try:
            label = LabelKind.CALLEE.label(qualified_name(fn.py_func))
            return ("function", self.function_node(value, label, where).digest)
        except KeyingError:  # it reads what has no content form: the module's source
            return None

    def _project_class(self, label, cls, where) -> KeyNode:
        """A class of the project's (a numba extension type's Python class: `Pair(a, b)`
        typed by `@type_callable(Pair)`) by what it holds (`_class_parts`).

        What numba compiles for it lives in the typing and lowering functions registered
        for it, which every compile observes by what it looked up, wherever they are
        (`typing function mod:Pair`, `lowering function mod:Pair`: see
        backend/registrations.py), so a comment, a docstring or another function in its
        module changes no key. A class with a metaclass of its own, or an attribute with
        no content form, is keyed by its module's whole source (`_class_source`).
        """
        parts = self._class_parts(cls, where) if type(cls) is type else None
        if parts is None:
            return self._class_source(label, cls, where)
        value = ("project-class-content", cls.__module__, cls.__qualname__,
                 parts) + made_at_import(cls)
        return leaf(label, value, f"class {cls.__qualname__}")

    def _class_source(self, label, cls, where) -> KeyNode:
        """A class of the project's by its module's whole source: coarse, but it never
        misses what a class with no content form holds."""
        source = self._module_source(cls, where, f"class {cls.__qualname__}")
        value = ("project-class", cls.__module__, cls.__qualname__, source) \
            + made_at_import(cls)
        return leaf(label, value, f"class {cls.__qualname__} (module {cls.__module__} source)")

    def _declared_function(self, label, declared) -> KeyNode:
        """A declared extern function: its name, signature and linked files by content."""
        files = tuple(sorted(self._link_item(path, label) for path in declared.link_files))
        value = ("extern-function", declared.name,
                 tuple(type_canonical(a) for a in declared.argtypes),
                 type_canonical(declared.restype), files)
        return leaf(label, value, f"declare_device {declared.name}{declared.signature_text}")

    def _is_project_object(self, value) -> bool:
        module = getattr(value, "__module__", None)
        return isinstance(module, str) and self._sources.is_project_module(module)


def property_form(prop: property, form_of):
    """A property by its getter, setter and deleter, each by `form_of`; None where one of
    them has no form."""
    parts = tuple(form_of(f) if f else ("none",) for f in (prop.fget, prop.fset, prop.fdel))
    return None if None in parts else ("property",) + parts


def _identity(py_func, node: KeyNode) -> str:
    """What tells one function from another, whatever its body: its qualified name and the
    values it closes over or takes as defaults (a closure factory's products differ)."""
    captured = tuple((k.label, k.digest) for k in node.children
                     if k.kind in (LabelKind.CLOSURE, LabelKind.DEFAULT))
    return digest_of(("identity", qualified_name(py_func), captured))


def _compiled_apart(fn: Function) -> bool:
    """Whether numba compiles calls to `fn` as calls into a library of its own.

    A device function is, unless inlined at numba IR level (inline="always"); jitable
    functions and @overload implementations are left inside their caller's object.
    """
    return fn.role is Role.DEVICE and fn.options.get("inline", "never") in ("never", False, None)


def _offer_body_text(sources, body_digest: str, render) -> None:
    """Hand a body's readable source (`render()`, called only if it is not kept yet) to
    sources that keep it for `kbuild explain` (`ProjectSources.keep_body_text`)."""
    keep = getattr(sources, "keep_body_text", None)
    if keep is not None:
        keep(body_digest, render)


def _normalized_digest(sources, py_func, keep_positions: bool, keep_names: bool,
                       kernel: bool, elided: frozenset = frozenset()) -> str | None:
    found = function_def(sources, py_func)
    if found is None:
        return None
    fdef, first_line = found
    return digest_of(normalize.normalized_ast(fdef, keep_positions=keep_positions,
                                              keep_names=keep_names, first_line=first_line,
                                              positional_args=kernel, elided=elided))


def signature_node(argtypes, signature_text: str, objects: ObjectModel) -> KeyNode:
    """Argument types by content; records get one child per field for explanations."""
    return branch(LabelKind.SIGNATURE.label(), signature_text,
                  [_type_node(LabelKind.ARGUMENT.label(i), t, objects)
                   for i, t in enumerate(argtypes, 1)])


def _type_node(label, t, objects: ObjectModel) -> KeyNode:
    """A numba type by content; a record (or an array of records) with one child per field."""
    record = objects.record_of(t)
    if record is not None:
        kids = [leaf(LabelKind.FIELD.label(n), (canonical(f.type), f.offset),
                     f"{f.type} @{f.offset}")
                for n, f in record.fields.items()]
        kids.append(leaf(LabelKind.LAYOUT.label(), canonical(t),
                         f"size {record.size}, aligned {record.aligned}, "
                         f"fields {', '.join(record.fields)}"))
        return branch(record_label(label), str(t), kids)
    return leaf(label, canonical(t), str(t))


def _disambiguate(refs) -> list[KeyNode]:
    """One node per label, from [(the name or path it was reached by, node)]. Where one
    label holds two contents (one function under two names; two closures of a factory,
    or two lambdas, held in one tuple), each gets its own label, by where it was reached
    from (which name holds which function is part of the key) or, in a set, by its own
    content."""
    by_label: dict[str, list] = {}
    for name, node in refs:
        by_label.setdefault(node.label, []).append((name, node))
    out = []
    for label, items in by_label.items():
        if len({node.digest for _, node in items}) == 1:
            out.append(items[0][1])
            continue
        by_name: dict[str, dict] = {}
        for name, node in items:
            by_name.setdefault(name, {})[node.digest] = node
        for name, nodes in by_name.items():
            for digest, node in nodes.items():
                where = name if len(nodes) == 1 else f"{name}#{digest[:12]}"
                out.append(KeyNode(reached_as(label, where), node.summary, node.digest,
                                   node.children))
    return out


def _found_by_name(func) -> bool:
    """Whether `func` is what its qualified name finds in its module's namespace (a
    module-level function, a class's function or static method)."""
    return _named(func, func.__qualname__) is func


def _named(func, qualname: str):
    """What `qualname` finds in `func`'s module namespace, through classes (a dispatcher
    made of `func`, say), read from the namespaces; None where nothing is."""
    first, *rest = qualname.split(".")
    value = func.__globals__.get(first)
    for part in rest:
        value = vars(value).get(part) if isinstance(value, type) else None
        value = getattr(value, "__func__", value) if isinstance(value, staticmethod) else value
    return value


def _key_text(key) -> str:
    """A mapping's key as its place in a path (`TABLE['fast']`); '?' where its repr is
    not a plain value's."""
    return repr(key) if type(key) in (str, int, bool, float) or key is None else "?"


def _environment_name(value) -> str | None:
    """'environ' or 'environb' for the process's environment mappings (a name bound to one
    at import, `from os import environ`), else None."""
    if value is os.environ or isinstance(value, WatchedEnviron):
        return "environ"
    return "environb" if value is getattr(os, "environb", None) else None


def _extern_name(value):
    """(module, qualified name) of an object keyed by its name, or None."""
    module = getattr(value, "__module__", None)
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if isinstance(module, str) and isinstance(name, str):
        return module, name
    return None


def _relative_file(py_func) -> str:
    # Only the module path: absolute paths never enter a key.
    return py_func.__module__.replace(".", "/") + ".py"
