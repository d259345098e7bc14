"""The record of what one compile consulted: an `Observer` of names, as (Kind, name).

The hooks (`hooks`, `reads`, `oscalls`) call its methods while numba types and lowers a
target; each method decides whether what was consulted is the project's and, if so, the
name it is found again by (`Current` digests that name now). It also keeps, for the
process, what each answer numba keeps (a typing template's, a device function's compile)
read when it was made (`answering`), so a compile that numba serves from a kept answer
still records those reads; and, after the compile, the files linked in (`link_files`).
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import os
import sys
import sysconfig
import threading
import types as pytypes
from pathlib import Path

from ...environ import WatchedEnviron
from ...keying.bytecode import returned_functions
from ...keying.observed import Kind
from .. import oscalls, registrations
from ..libraries import is_settings, namespace_module
from ..registrations import held, is_library, is_overload_template, is_project, key_name, \
    qualified, typing_functions
from ..toolchain import is_toolchain_distribution
from .reads import _bystander, _site_packages


class Observer:
    """The names one compile consulted, as (Kind, name) pairs in the order first seen."""

    def __init__(self, static_functions=(), root: Path | None = None, digest_now=None):
        # Functions the static key already holds by content: their bodies need no observation.
        self._static = set(static_functions)  # functions hash by identity
        self.root = root
        self.names: dict = {}
        # Globals read only by statically keyed functions: the static key holds them
        # (records, project classes, ...) however their value is keyed here.
        self.static_only: set = set()
        self._dynamic: set = set()
        # What a registry entry holds of the project's, decided once per entry in this
        # process (entries hash by identity: in this process only, never in a key).
        self._templates: dict = {}
        self._lowered: dict = {}
        self._models: dict = {}
        # id(OverloadSelector) -> ("function KEY" / ... / "", its key, the selector: kept, so
        # no id is reused while it names another): a look-up memo, never part of a key.
        self._selectors: dict = {}
        self._collecting: list = []  # what each answer being made now (`answering`) reads
        # Names a kept answer read when it was made, with the digests they had then.
        self.pinned: dict = {}
        self._answered: dict = {}  # questions answered (run) in this compile, in order
        # `Current` (memoized): a typing function is digested as it is about to run, not
        # as the compile leaves it (it may fill a memo dict of its module's as it runs).
        self._digest_now = digest_now
        # What the project's code made while this compile ran (files written, folders
        # made, a file renamed into place), as real paths: read back, its own output.
        self._made: set = set()
        self._thread = threading.get_ident()  # the thread that compiles
        # Why what this compile read cannot all be said (`unsaid_within`): its failure is
        # then not recorded, and the next build compiles it again.
        self.unsaid: str | None = None

    def first_seen(self, kind: Kind, name: str) -> None:
        """Told each name the first time this compile records it."""

    def _is_static(self, func) -> bool:
        try:
            return func in self._static
        except TypeError:  # an unhashable callable is no function the static key holds
            return False

    def here(self) -> bool:
        """Whether this thread's reads are this compile's: the thread that compiles, or one
        it started while it compiles (`oscalls.observes`). What the program's other threads
        read meanwhile (a server's, a scheduler's heartbeat) is no input of the compile."""
        return threading.get_ident() == self._thread or oscalls.observes(self)

    @contextlib.contextmanager
    def unsaid_within(self, why: str):
        """A block after which this compile can say what it read, only if it ends well
        (NVRTC lists the headers it opened when it compiles, not when it fails). If it
        raises, `unsaid` stays `why`; a compile stopped at its time limit within it has
        told the parent so (a note of an unseen read, which no failure record keeps)."""
        self.first_seen(Kind.UNSEEN, why)
        self.unsaid = why
        yield
        self.unsaid = None

    def add(self, kind: Kind, name: str) -> None:
        if not self.here():
            return
        key = (kind, name)
        if key not in self.names:
            self.first_seen(kind, name)
        self.names.setdefault(key, None)
        for collected in self._collecting:
            collected.setdefault(key, None)

    def read(self, module_name: str, attr: str) -> None:
        """Python code running during the compile read `module_name.attr` (a module
        attribute, or a module global through `globals()`): by its value."""
        self.add(Kind.READ, f"{module_name}:{attr}")

    def running(self, template, *asked):
        """A typing template runs Python (an overload, an intrinsic) for `asked` (its
        argument types, or the type and attribute); see `answering`."""
        return self.answering(_question(type(template), asked),
                              lambda: _forget_answer(template, asked))

    @contextlib.contextmanager
    def answering(self, question, forget):
        """numba answers `question` (a typing template's, for some argument types; a device
        function's compile for some) within the block, running Python, or from what it
        kept when it first ran it in this process. Whatever was observed while it ran is
        read by every compile the answer serves, with the digests it had *then*
        (`pinned`): a value changed since is not what numba's kept answer was made from.
        An answer made while nothing observed it (an eager kernel typed at its import)
        is dropped (`forget()`), so numba runs it again, observed."""
        earlier = _ANSWERS.get(question)
        if question not in self._answered:
            if earlier is None or None in earlier.values():
                if forget():
                    earlier = _ANSWERS[question] = {}
                    self._answered[question] = None
            else:
                for key, (found, static) in earlier.items():
                    self.names.setdefault(key, None)
                    self.pinned.setdefault(key, found)
                    if static and key not in self._dynamic:
                        self.static_only.add(key)
                    for outer in self._collecting:
                        outer.setdefault(key, None)
        collected: dict = {}
        self._collecting.append(collected)
        try:
            yield
        finally:
            # By identity: `list.remove` compares by equality, and an inner answer's record
            # equals its outer one's when both began empty (it took the outer's away).
            del self._collecting[next(i for i, c in enumerate(self._collecting)
                                      if c is collected)]
            if collected:  # it ran now: what it read is read now, digested with this compile
                entry = _ANSWERS.setdefault(question, {})
                entry.update(dict.fromkeys(collected))
                self._answered[question] = None
                for key in collected:
                    self.pinned.pop(key, None)
            for outer in self._collecting:
                outer.update(collected)

    def answered(self, digests: dict) -> None:
        """This compile's digests (`Current.observations`): the answers it made keep them."""
        for question in self._answered:
            entry = _ANSWERS.get(question)
            for key in list(entry or ()):
                if entry[key] is None and key in digests:
                    entry[key] = (digests[key], key in self.static_only)

    def function(self, func, kind: Kind = Kind.FUNCTION) -> None:
        module = getattr(func, "__module__", None)
        if is_library(module) or (kind is Kind.FUNCTION and self._is_static(func)):
            return
        # Typing-time functions are found again through numba's registries, closures and
        # all; a function numba interprets by its name.
        qualname = func.__qualname__ if kind is not Kind.FUNCTION else _interpreted_name(func)
        self.add(kind, f"{module}:{qualname}")

    def parameters(self, func) -> None:
        """numba bound a call's keywords against `func`'s parameters: their names decide
        what the call passes where (by `mod:qualname`; one no name finds digests as
        missing, and its key holds its names: `Keyer._by_place`)."""
        module = getattr(func, "__module__", None)
        if not is_library(module):
            self.add(Kind.PARAMETERS, f"{module}:{func.__qualname__}")

    def typing_function(self, template, kind: Kind) -> None:
        """An `@overload*` / `@intrinsic` template ran: the project functions it runs
        (a `register_jitable` function through numba's wrapper, too), by name; their
        registration's options are digested with them (`Current`)."""
        for func in typing_functions(type(template)):
            name = qualified(func)
            first = (kind, name) not in self.names
            self.add(kind, name)
            if first and self._digest_now is not None:
                self._first_sight(kind, name, func)

    def _first_sight(self, kind: Kind, name: str, func) -> None:
        """Digest a typing function, and the implementations it makes and returns (each
        observed as `mod:ol_f.<locals>.impl` when numba compiles it), before it runs."""
        code = getattr(func, "__code__", None)
        made = returned_functions(code) if code is not None else ()
        names = [(kind, name)] + [(Kind.FUNCTION, f"{name}.<locals>.{inner.co_name}")
                                  for inner in made]
        for key in names:
            try:
                self._digest_now(*key)
            except Exception:  # noqa: BLE001 - digested again after the compile, and said
                pass

    def typing_template(self, template, what: str) -> None:
        """Numba asked a typing template (`what`: "function" or "attributes") for an
        answer: when it holds anything of the project's, every template registered for
        the same key is observed (`typing function mod:Span`)."""
        cls = type(template)
        name = self._templates.get(cls)
        if name is None:
            key = key_name(getattr(cls, "key", None))
            project = not is_overload_template(cls) and key is not None and \
                is_project(registrations.template(cls))
            name = self._templates[cls] = f"{what} {key}" if project else ""
        if name:
            self.add(Kind.TYPING, name)

    def lowering(self, selector, impl) -> None:
        """Numba's target context found `impl` in `selector` (one key's table of lowering
        implementations): when it holds anything of the project's, every implementation
        registered for that key is observed (`lowering getattr 'lo'`)."""
        try:
            project = self._lowered.get(impl)
        except TypeError:  # an unhashable implementation holds nothing of a module's
            return
        if project is None:
            sigs = tuple(sig for sig, found in getattr(selector, "versions", ()) if found is impl)
            project = self._lowered[impl] = not registrations.made_by_templates(impl) and \
                is_project(held((impl, sigs)))
        if project:
            name = _selector_name(self._selectors, selector, impl)
            if name:
                self.add(Kind.LOWERING, name)

    def model(self, manager, fetype) -> None:
        """Numba looked up the data model of `fetype`: a project's type or model is
        observed by the type's class (`lowering model mod:SpanType`)."""
        cls = type(fetype)
        name = self._models.get(cls)
        if name is None:
            handlers = getattr(manager, "_handlers", {})
            found = held((cls, handlers.get(cls)))
            key = key_name(cls)
            name = self._models[cls] = f"model {key}" if key and is_project(found) else ""
        if name:
            self.add(Kind.LOWERING, name)

    def global_of(self, func, name: str) -> None:
        """A global `name` that numba froze while interpreting `func`."""
        scope = func.__globals__
        module = scope.get("__name__")
        if is_library(module):
            return
        if name in scope:
            if namespace_module(scope) == module:
                key = (Kind.GLOBAL, f"{module}:{name}")
                self.add(*key)
                if self._is_static(func) and key not in self._dynamic:
                    self.static_only.add(key)
                else:
                    self._dynamic.add(key)
                    self.static_only.discard(key)
        elif hasattr(builtins, name) and not _plain_builtin(getattr(builtins, name)):
            self.add(Kind.BUILTIN, name)

    def module_attribute(self, module, attr: str) -> None:
        """`module.attr` typed as a constant; numba also treats some classes (its stubs,
        `cuda.atomic`) as modules."""
        if isinstance(module, pytypes.ModuleType):
            name = module.__name__
        else:
            name = f"{getattr(module, '__module__', '')}:{getattr(module, '__qualname__', '')}"
            name, _, inner = name.partition(":")
            attr = f"{inner}.{attr}"
        if not is_library(name) or is_settings(name, module):  # numba's config: state
            self.add(Kind.GLOBAL, f"{name}:{attr}")

    def read_by_project(self, frame=None) -> bool:
        """Whether the code reading an env var (the nearest caller of `frame`, by default
        the caller's, outside the os module, collections.abc, kbuild's stand-ins and this
        package) is the project's, directly or through a library
        (`oscalls.asked_by_project`): numba's and the standard library's own reads are
        pinned by the toolchain."""
        if not self.here():
            return False
        frame = frame or sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__") in _PLUMBING:
            frame = frame.f_back
        return oscalls.asked_by_project(frame, _bystander)

    def names_file(self, path) -> bool:
        """Whether a file read at `path` is observed: not the toolchain's, nor one this
        compile made."""
        return _file_name(path, self.root) is not None and not self._made_here(path)

    def made(self, path) -> None:
        """The project's code wrote a file at `path`, made a folder there or renamed a file
        to it, while this compile ran: what it reads there later is its own output (a
        temporary file or folder written and read back), no input."""
        if isinstance(path, (str, bytes, os.PathLike)):
            self._made.add(os.path.realpath(os.fsdecode(path)))

    def _made_here(self, path) -> bool:
        if not self._made:
            return False
        real = os.path.realpath(os.fsdecode(path))
        return any(real == made or real.startswith(made + os.sep) for made in self._made)

    def file(self, path, kind: Kind = Kind.FILE) -> None:
        name = _file_name(path, self.root)
        if name is not None and not self._made_here(path):
            self.add(kind, name)
            if not os.path.isabs(os.fspath(path)):
                self.add(Kind.CWD, ".")  # found from the working directory


def _selector_name(names: dict, selector, impl) -> str:
    """What a lowering table is for, as an observed name: `function KEY` (`_defns`),
    `getattr 'ATTR'`, `setattr 'ATTR'` (`*`: generic), `cast`, `constant`; "" for a key
    with no name the same in every process, and for an `@intrinsic`'s code generator
    (registered under itself as it is typed: observed as its definition)."""
    if id(selector) not in names:
        names.clear()  # tables are added as a compile goes: look again
        from numba.cuda.descriptor import cuda_target

        context = cuda_target.target_context
        for table, kind in (("_defns", "function"), ("_getattrs", "getattr"),
                            ("_setattrs", "setattr")):
            for key, found in list(getattr(context, table, {}).items()):
                name = registrations.attr_name(key) if kind != "function" else key_name(key)
                names[id(found)] = (f"{kind} {name}" if name else "", key, found)
        for table, kind in (("_casts", "cast"), ("_get_constants", "constant")):
            found = getattr(context, table, None)
            if found is not None:
                names[id(found)] = (kind, None, found)
        names.setdefault(id(selector), ("", None, selector))  # another context's: not again
    name, key, _ = names[id(selector)]
    return "" if key is impl else name


def _interpreted_name(func) -> str:
    """A function numba interprets, as found again later: an implementation that a
    module-level function (an overload's selector) only made and returned by its own
    name (`ol_f.<locals>.impl`, see `Current._returned_digest`); any other nested one
    by its outermost function, which holds it."""
    outer, sep, inner = func.__qualname__.partition(".<locals>.")
    if sep and "." not in outer and "<" not in inner:
        found = getattr(sys.modules.get(func.__module__), outer, None)
        code = getattr(found, "__code__", None)
        if code is not None and any(c is func.__code__ for c in returned_functions(code)):
            return func.__qualname__
    return _outermost(func.__qualname__)


def _outermost(qualname: str) -> str:
    # A function made inside another (an overload's `impl`, a factory's product) is what
    # its enclosing function's code and the values it read make it: observe that one.
    return qualname.split(".<locals>.")[0]


def _plain_builtin(value) -> bool:
    return getattr(value, "__module__", None) == "builtins" and isinstance(
        value, (type, pytypes.BuiltinFunctionType))


def _toolchain_dirs() -> tuple:
    """The interpreter's folders. Not the temporary folder: a file there that the
    compile did not make itself (`Observer.made`) is an input like any other."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    paths.update(p for p in sysconfig.get_paths().values() if p)
    return tuple(os.path.realpath(p) + os.sep for p in paths)


def from_root(path, root) -> str | None:
    """Where `path` is from the project root, as a POSIX path ("." for the root itself: a
    moved checkout names it the same), or None outside it. Both are taken as they really
    are (symbolic links resolved)."""
    return _under(os.path.realpath(os.fspath(path)), root)


def _under(real: str, root) -> str | None:
    """`from_root` of a path already resolved."""
    top = os.path.realpath(root)
    if real == top:
        return "."
    if real.startswith(top.rstrip(os.sep) + os.sep):
        return Path(os.path.relpath(real, top)).as_posix()
    return None


def _file_name(path, root) -> str | None:
    """How a file read during the compile is named: relative to the project root when
    under it, else absolute; None for the toolchain's own files and the system's
    (/proc, /dev, /sys)."""
    if not isinstance(path, (str, os.PathLike)):
        return None
    real = os.path.realpath(os.fspath(path))
    name = _under(real, root) if root is not None else None
    if name is not None:
        return name
    if real.startswith(("/proc/", "/dev/", "/sys/")) or \
            (real.startswith(_toolchain_dirs()) and not _installed_by_another(real)):
        return None
    return real


def _installed_by_another(real: str) -> bool:
    """Whether a file of the interpreter's is an installed package's that is not the
    toolchain's (a numba extension's data, a data package, another distribution's
    metadata): its installation, not a keyed version, decides what it holds."""
    for site in _site_packages():
        if real.startswith(site):
            top = real[len(site):].partition(os.sep)[0]
            if not top or is_library(top.partition(".")[0]):
                return False
            if top.endswith((".dist-info", ".egg-info")):
                return not is_toolchain_distribution(top.partition("-")[0])
            owners = _owners().get(top.partition(".")[0])
            return not owners or not all(is_toolchain_distribution(d) for d in owners)
    return False


@functools.cache
def _owners() -> dict:
    """Top-level name -> the installed distributions that hold it."""
    from importlib import metadata

    return metadata.packages_distributions()


# The stand-ins' own frames between a read and its reader: this package's and the mapping's.
_PLUMBING = frozenset({"os", "_collections_abc", "collections.abc", WatchedEnviron.__module__,
                       *(f"{__package__}.{part}" for part in ("observer", "reads", "hooks",
                                                              "current"))})

# What each answer numba keeps (a typing template's for some argument types, a device
# function's compile) read when it was made in this process: (kind, name) -> (its digest
# then, whether only statically keyed code read it), or None until the compile that made
# it is digested. Template classes and dispatchers live as long as the process; numba
# makes each answer once and keeps it. A look-up memo by identity, never in a key.
_ANSWERS: dict = {}


def _question(cls, asked) -> tuple:
    """(a template class, what it was asked) as a memo key: numba keeps a template's answer
    per argument types. Whatever cannot be hashed is asked apart by the class alone
    (coarser, and never fewer reads)."""
    try:
        key = (cls, repr_free(asked))
        hash(key)
        return key
    except TypeError:
        return (cls,)


def _forget_answer(template, asked) -> bool:
    """Drop what numba keeps of a project's typing template's answer for these argument
    types (`_impl_cache`, keyed by (context, args, kws, ...)), so its Python runs again.
    numba's own templates read nothing of the project's: theirs are kept."""
    cache = getattr(type(template), "_impl_cache", None)
    func = getattr(template, "_overload_func", None) or \
        getattr(template, "_definition_func", None)
    if not isinstance(cache, dict) or is_library(getattr(func, "__module__", None)):
        return True
    called = asked[0] if len(asked) == 2 else None  # generic(args, kws), as the hook saw it
    if not (isinstance(called, tuple) and len(called) == 2 and isinstance(called[1], dict)):
        return True  # an attribute template: it runs every time it is asked
    args, kws = tuple(called[0]), tuple(called[1].items())
    for key in [k for k in cache if isinstance(k, tuple) and k[1:3] == (args, kws)]:
        del cache[key]
    # numba-cuda-mlir also keeps what the overload function returned, per the options
    # it read (`_overload_result_cache`, keyed by (function, args, kws)): dropped too, or
    # the rebuilt implementation is made from the kept result without running it.
    results = getattr(type(template), "_overload_result_cache", None)
    if isinstance(results, dict):
        results.pop((func, args, kws), None)
    return True


def repr_free(value):
    """`value` made hashable: dicts as sorted item tuples, lists and tuples as tuples."""
    if isinstance(value, dict):
        return tuple(sorted((k, repr_free(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(repr_free(v) for v in value)
    return value


def linked_paths(observer: Observer, paths) -> None:
    """Record linked files (paths; other items are keyed by content). Their headers are
    what NVRTC opened while compiling them (`hooks._nvrtc_headers`)."""
    for path in paths:
        if isinstance(path, (str, os.PathLike)):
            observer.file(path, Kind.LINK)


def link_files(observer: Observer, library) -> None:
    """Record the files linked into `library` (and its libraries). Their headers are what
    NVRTC opened while compiling them (`hooks._nvrtc_headers`)."""
    seen, todo = set(), [library]
    while todo:
        lib = todo.pop()
        if lib in seen:  # code libraries hash by identity (numba keeps them in sets too)
            continue
        seen.add(lib)
        todo += list(getattr(lib, "_linking_libraries", ()))
        for path in getattr(lib, "_linking_files", ()):
            if isinstance(path, (str, os.PathLike)):
                observer.file(path, Kind.LINK)
