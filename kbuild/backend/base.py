"""What a backend is: the one interface every compiler kbuild builds kernels with implements.

A backend is a compiler front end and code generator for `@cuda.jit` kernels
(numba-cuda, numba-cuda-mlir). The rest of kbuild speaks to it through this
interface only, never through a compiler's attribute names:

- `name` (as kbuild.toml's `backend` names it) and `owns(obj)`: is this one of its
  kernels or device functions;
- `objects`: the `keying.interfaces.ObjectModel` keying asks about its objects;
- `toolchain()` / `codegen_config()`: what of the compiler goes into the toolchain and
  config parts of a key (its name and version, its compilers' versions, its knobs);
- `targeting(cc)`: a block within which its code compiles for `cc` without asking a
  driver (modules that compile eagerly at import are imported inside it);
- `parse_signature(text, module)`: a kbuild.toml signature in its type vocabulary;
- `compile(...)`: one target to `Artifacts`, for an arch, recording what its front end
  consulted into an `observe.Observer` (its observation hooks), made by `observer(...)`;
- `relink(...)`: a kernel linked again from its separately compiled objects;
- `typing_registries()`: where its `@overload`s live, for observed names' digests;
- `entry_expectation(kernel)`: what a stored entry must say to be this kernel's;
- `target_options(kernel)` / `python_function(kernel)`: what a kernel was decorated with
  (`max_registers`, `link`, `debug`, ...) and the Python function it compiles;
- `launcher()`: the module that types, packs (its kernel ABI) and launches arguments;
- `dispatcher_kernel(...)`: a stored entry as the kernel its own dispatcher launches
  (zero-config), `rebuilt_kernel(...)`: one as the compiler's own kernel object,
  `serve(resolver)` / `stop_serving()`: its dispatchers asking zero-config first,
  `record_launches(record)`: its simulator's launches, `current_arch()` and `compile_arch(device_arch)`: what it builds for;
- `prepare()`: its one-time set-up, done before a process forks compile workers;
- `project_forgotten()`: the project's modules are to be imported again (`kbuild watch`):
  what its set-up took from their first import is taken again at the next compile;
- `simulating()`: whether it runs a simulator in this process;
- `holds_compiled`, `forget_code`, `forget_kernel`, `launched_as`, `watching`: the code
  its dispatchers hold in this process and the launch configuration a compile sees;
- `features`: what it supports, by name (see README "Backends").

`observed_now(sources, root)` digests the names any backend's compile observed, as
they are now (an entry's freshness).

`backends` knows which backends exist and loads one only when a project or a kernel
asks for it.
"""

from __future__ import annotations

import abc
import contextlib
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Object:
    """One separately compiled (LTO-IR) object and the manifest that describes its
    interface (see `lto`)."""

    key: str
    ltoir: bytes
    manifest: dict


@dataclass(frozen=True)
class Artifacts:
    """What one compiled target produced."""

    ptx: bytes
    cubin: bytes
    entry: str
    cooperative: bool
    # How it was linked: {"mode": "lto", "objects": [keys]} from separately compiled
    # objects, or {"mode": "whole", "reason": ...} as one program.
    link: dict = field(default_factory=dict)
    objects: tuple = ()  # the `Object`s a separate compile made
    # What the compile consulted beyond the static key: (kind, name, digest) rows, see
    # keying/observed.py; filled in by the build once the compile is over.
    observed: tuple = ()
    # Early cutoff (see keying/cutoff.py): what was taken from an earlier build instead of
    # made ("link": the PTX and cubin of the same objects' link; "cubin": the cubin of the
    # same PTX; None: nothing), and the cutoff keys the build records these bytes under.
    cutoff: str | None = None
    outputs: tuple = ()
    # The holders the compile filled, state a later compile in the process may read (a
    # memo, a registry: `keying.made.filled_since`), by `module:global`: that compile
    # must run again where the target is served (`BuildService.replay_writers`), and a
    # target behind it must read them filled (`BuildService.out_of_order`).
    fills: tuple = ()


@dataclass(frozen=True)
class Features:
    """What a backend supports (README "Backends" lists them)."""

    separate_compilation: str  # how device functions are compiled: a sentence
    debug: bool  # debug=True kernels (device-side exceptions reported at launch)
    cooperative_launch: bool  # grid synchronisation
    simulator: bool  # a CPU simulator (NUMBA_ENABLE_CUDASIM)


class Backend(abc.ABC):
    """One compiler of `@cuda.jit` kernels."""

    name: str  # as kbuild.toml's `backend` names it
    features: Features

    @property
    @abc.abstractmethod
    def objects(self):
        """Its `keying.interfaces.ObjectModel`."""

    @abc.abstractmethod
    def owns(self, obj) -> bool:
        """Whether `obj` is one of this compiler's kernels or device functions."""

    @abc.abstractmethod
    def toolchain(self) -> dict:
        """Name -> version of everything of it that turns Python into a cubin."""

    @abc.abstractmethod
    def codegen_config(self) -> dict:
        """Its config knobs that change generated code, by name."""

    def process_config(self) -> dict:
        """What two processes must share to key and compile alike: its codegen config and
        the knobs it reads when a function is decorated (frozen into its options)."""
        return self.codegen_config()

    def targeting(self, cc: tuple, binds: bool = False):
        """A block within which its code compiles for `cc`, asking no driver; `binds`: a
        stand-in driver is there, so what a GPU would load at compile is loaded."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def parse_signature(self, text: str, module) -> tuple:
        """(argument types, return type) of a signature string, evaluated in
        `signature_namespace(module)`; the return type is None for a kernel's void."""

    @abc.abstractmethod
    def signature_namespace(self, module) -> dict:
        """What a signature string declared for a kernel of `module` is evaluated in: the
        backend's types, `from_dtype` and the module's globals (see `type_namespace`)."""

    @abc.abstractmethod
    def compile(self, kernel, argtypes, cc: tuple, *, device_functions=(), stable_ids=None,
                apart=None, observer=None, outputs=None, source_roots=()) -> Artifacts:
        """One target's PTX and cubin for `cc` (see `compiler.compile_kernel`)."""

    def observer(self, static_functions=(), root=None, on_new=None, digest_now=None):
        """A record of what one compile consults (an `observe.Observer`, the one every
        backend's `compile` records into): `static_functions` are held by the static key
        by content, file names are relative to `root`; `on_new(kind, name)` is told each
        name the first time it is recorded; `digest_now` (`observed_now`'s, memoized)
        digests a typing function as it is about to run."""
        from .observe import Observer

        return Observer(static_functions, root, digest_now) if on_new is None else \
            _noting(Observer)(static_functions, root, digest_now, on_new=on_new)

    def relink(self, ltoirs, cc: tuple, *, max_registers=None, outputs=None, entry: str = "",
               flags=(), lto: bool = False):
        """PTX and cubin (a `Linked`: `.ptx`, `.cubin`, `.cutoff`, `.keys`) of separately
        compiled objects (their bytes, as stored), linked again for `cc` without a
        compile; `outputs`, `entry`, `flags` and `lto` as its compile's (see `lto.link`)."""
        raise NotImplementedError(f"backend {self.name} compiles no objects apart")

    def typing_registries(self) -> list:
        """Its typing registries holding user `@overload`s (each with `.globals`, `.attributes`)."""
        return []

    def entry_expectation(self, kernel) -> dict:
        """Fields a stored entry must hold to be `kernel`'s (see `builder.expected`)."""
        return {}

    def target_options(self, kernel) -> dict:
        """The options `kernel` (one of its kernels) was decorated with, as its compiler
        recorded them (`max_registers`, `link`, `debug`, ...): a copy; {} for an object
        that holds none."""
        return {}

    def python_function(self, kernel):
        """The Python function `kernel` compiles; None for an object that holds none."""
        return None

    @abc.abstractmethod
    def launcher(self):
        """The module that launches its stored kernels (see `backend.launcher`)."""

    def dispatcher_kernel(self, request, manifest: dict, read_blob, device_arch: str,
                          device_cc: tuple, source_roots, for_launch: bool):
        """The compiled kernel to hand `request.dispatcher` (zero-config's `dispatch.Request`)
        for the stored entry `manifest` on the current device (`device_arch`, `device_cc`):
        its binary read with `read_blob`, a debug binary's source paths put back under
        `source_roots` (see `served`); `for_launch`: built for one launch configuration,
        so the dispatcher compiles (or fetches) another for other configurations."""
        raise NotImplementedError(f"backend {self.name} cannot hand a stored kernel to "
                                  "its dispatcher")

    def rebuilt_kernel(self, manifest: dict, argtypes, binary: bytes, binary_kind: str,
                       device_cc: tuple, options: dict, py_func=None, links=()):
        """The compiler's own kernel object for a stored target, backed by `binary` (a
        "cubin" or "ptx", linked with `links`): what its launcher hands kernels it cannot
        launch itself (see `launcher.needs_numba_kernel`); `options` are the live
        dispatcher's, `py_func` the kernel's Python function."""
        raise NotImplementedError(f"backend {self.name} rebuilds no kernel from the store")

    def serve(self, resolver) -> None:
        """From now on its dispatchers ask `resolver(Request)` (zero-config's session; a
        `dispatch.Request`) for a kernel before compiling one; replaces an earlier one."""
        raise NotImplementedError(f"backend {self.name} serves no dispatcher")

    def stop_serving(self) -> None:
        """Its dispatchers compile on their own again (kernels handed over stay loaded)."""

    def record_launches(self, record) -> None:
        """Under its simulator: `record(kernel, argtypes, launch)` is called for each kernel
        launch (zero-config's `kbuild run --record`)."""
        raise NotImplementedError(f"backend {self.name} has no simulator")

    def current_arch(self) -> str:
        """The current device's arch (`sm_90`), asked of the driver once per device."""
        raise NotImplementedError(f"backend {self.name} launches nothing")

    def compile_arch(self, device_arch: str) -> str:
        """The arch its compile makes for a device of `device_arch` (the device's own
        unless the compiler is told another)."""
        return device_arch

    def prepare(self) -> None:
        """Its one-time set-up of a process's first compile, done now."""

    def project_forgotten(self) -> None:
        """The project's modules were dropped, to be imported again from their saved
        sources (`kbuild watch`): what this compiler's set-up took from the registrations
        their first import made (its typing and lowering registries) must be taken again
        at the next compile, as a fresh process's first compile takes it. numba-cuda
        loads its registries' new entries at every compile: nothing to do."""

    def forget_compiled(self, device_functions=(), objects=None) -> None:
        """Drop what this process compiled that a later compile would reuse: separately
        compiled objects (those keyed `objects`, or all when None), and the code
        `device_functions` (dispatchers) hold. A compile after it makes everything from
        source (`--verify`)."""

    def simulating(self) -> bool:
        return False

    # -- its dispatchers (the code a process holds, the launch a compile sees) ----------

    def holds_compiled(self, dispatcher) -> bool:
        """Whether a (device function's) dispatcher holds code compiled earlier here."""
        return False

    def forget_code(self, dispatcher) -> None:
        """Drop the code a device function's dispatcher holds: the next compile that calls
        it types it again with the values it reads then."""

    def forget_kernel(self, dispatcher) -> None:
        """Drop every overload a lazy kernel's dispatcher holds: its next launch compiles
        it again (through kbuild's hook)."""

    def kernel_launch_sensitive(self, kernel) -> bool:
        """Whether `kernel` (a compiled kernel its dispatcher holds or was handed) was
        compiled for one launch configuration alone (it depends on it: numba's
        `mark_launch_config_sensitive()`)."""
        return False

    def launched_as(self, kernel, launch):
        """A block within which a compile of `kernel` sees `launch` = (grid, block, shared
        memory) as its launch configuration (None: nothing changes); yields its marks
        (`.sensitive` when the block ends: the compile depended on its launch)."""
        return contextlib.nullcontext(_NoMarks())

    def watching(self, config):
        """A block yielding the marks of a compile for the launch configuration `config`
        (the dispatcher's own, during a launch)."""
        return contextlib.nullcontext(_NoMarks())


def observed_now(sources, root):
    """`(kind, name) -> digest now` of the names compiles observe (an `observe.Current`,
    memoized: make one per build), for every backend's observations: `sources` is a
    keyer's, file names are relative to the project `root`."""
    from .observe import Current

    return Current(sources, root)


def probing(labels):
    """A block within which whoever reads a holder of `labels` (by `module:global`, as a
    compile's `Artifacts.fills` names them) is handed (`Kind.FILLED`, label), as if the
    compile that fills it had run here (it ran in another process)."""
    from .observe.written import probing as probe

    return probe(labels)


@functools.cache
def _noting(observer_class):
    class Noting(observer_class):
        def __init__(self, *args, on_new, **kwargs):
            super().__init__(*args, **kwargs)
            self._on_new = on_new

        def first_seen(self, kind, name):
            self._on_new(kind, name)

    return Noting


class _NoMarks:
    sensitive = False


def type_namespace(module, types_module, from_dtype) -> dict:
    """A signature's names: `types_module`'s (numba.types or a copy of it) and `module`'s
    globals. A type the module defines (a type of `types_module`, or a dtype:
    `void(Point[::1])`) wins over the types module's of the same name, as the module's
    own code sees it (a record named `Pair`, `Record` or `Tuple`); any other module value
    (`float32 = np.float32`, a helper function) only fills in names the types module
    lacks, so the types a signature names stay the compiler's."""
    import numpy as np

    namespace, own_types = {}, {}
    for name, value in vars(module).items():
        if isinstance(value, np.dtype):
            try:
                own_types[name] = from_dtype(value)
            except Exception:  # noqa: BLE001 - a dtype with no type: not a type here
                namespace[name] = value
        elif isinstance(value, types_module.Type):
            own_types[name] = value
        else:
            namespace[name] = value
    namespace.update(vars(types_module))
    namespace.update(own_types)
    namespace["from_dtype"] = _from_dtype_of(types_module, from_dtype)
    return namespace


def _from_dtype_of(types_module, from_dtype):
    # `from_dtype(POINT)[::1]` when POINT is already a type
    return lambda value: value if isinstance(value, types_module.Type) else from_dtype(value)


class TypeNamespace(Mapping):
    """`type_namespace(module, ...)` read name by name, as a signature's `eval` reads it:
    each name resolved from the module's globals when it is asked for, with the same
    precedence. Parsing a signature then costs the names it holds, not the module's
    size, and always sees the module as it is now (a type defined after an earlier
    parse is named by it)."""

    def __init__(self, module, types_module, from_dtype):
        self._globals = vars(module)
        self._types_module, self._from_dtype = types_module, from_dtype

    def __getitem__(self, name):
        if name == "from_dtype":
            return _from_dtype_of(self._types_module, self._from_dtype)
        value = self._globals.get(name, _ABSENT)
        if isinstance(value, np_dtype()):
            try:
                return self._from_dtype(value)
            except Exception:  # noqa: BLE001 - a dtype with no type: not a type here
                pass
        elif isinstance(value, self._types_module.Type):
            return value
        found = vars(self._types_module).get(name, _ABSENT)
        if found is not _ABSENT:
            return found
        if value is _ABSENT:
            raise KeyError(name)
        return value

    def is_type(self, value) -> bool:
        """A type of the compiler's, or a class of them (`Array`, `UniTuple`)."""
        kind = self._types_module.Type
        return isinstance(value, kind) or isinstance(value, type) and issubclass(value, kind)

    def __iter__(self):
        return iter(type_namespace(_Globals(self._globals), self._types_module,
                                   self._from_dtype))

    def __len__(self):
        return sum(1 for _ in self)


def eval_signature(text: str, names: TypeNamespace):
    """`eval(text)` in `names` (a signature's namespace). Its names are read now every
    time; a text whose names are all the compiler's types (the types module's, a
    module's own type or record) evaluates to the same signature for the same types,
    so that result is kept for the process (the same types: the very objects)."""
    found = _SIGNATURES.get(text)
    if found is None:
        found = _SIGNATURES[text] = (compile(text, "<string>", "eval"), {})
    code, results = found
    values = tuple(names.get(name, _ABSENT) for name in code.co_names)
    pure = all(names.is_type(v) for v in values)
    if pure:
        kept = results.get(tuple(map(id, values)))
        if kept is not None and all(a is b for a, b in zip(kept[0], values)):
            return kept[1]
    value = eval(code, {"__builtins__": {}}, names)  # noqa: S307
    if pure:
        results[tuple(map(id, values))] = (values, value)
    return value


_SIGNATURES: dict = {}  # text -> (its code, {ids of its names' values: (values, result)})


class _Globals:
    def __init__(self, found: dict):
        self.__dict__ = found


_ABSENT = object()


def np_dtype():
    import numpy as np

    return np.dtype
