"""Turn a project's declared targets into live kernels and numba signatures.

Each kernel is compiled by the backend whose object it is (a numba-cuda dispatcher, or
numba-cuda-mlir's `MLIRDispatcher`), which must be the one kbuild.toml names for it,
if it names one; its signatures are parsed in that backend's types."""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
import sysconfig
import traceback
from dataclasses import dataclass, field

from .artifacts import arch_cc
from .backend import is_library
from .config import KernelSpec, ProjectConfig
from .errors import TargetError
from .keying import made
from .model import Target  # noqa: F401 - the noun's home is the model; named here too
from .sources import record_imported_source


@dataclass
class ResolvedKernel:
    """A declared kernel, imported, with its signatures parsed."""

    spec: KernelSpec
    kernel: object
    argtypes: dict  # signature text -> tuple of numba types
    # Signatures that do not parse (a typo, a type the module lacks): each fails its own
    # targets, never the kernel's other signatures nor other kernels.
    bad_signatures: dict = field(default_factory=dict)  # signature text -> TargetError
    backend: object = None  # the `backend.base.Backend` that compiles it (None: numba-cuda)

    def __post_init__(self):
        if self.backend is None:
            from .backend.backends import DEFAULT, get

            self.backend = get(DEFAULT)


def add_import_paths(config: ProjectConfig) -> None:
    """Put the project's import roots first on sys.path (once); import them from source."""
    for root in reversed(config.paths):
        text = str(root)
        if text not in sys.path:
            sys.path.insert(0, text)
    new_roots = {os.path.realpath(r) for r in config.paths} - _SourceOnlyFinder.roots
    if not new_roots and _SourceOnlyFinder.hook in sys.path_hooks:
        return  # once per root, not once per kernel: the purge below is costly
    _SourceOnlyFinder.roots.update(new_roots)
    if _SourceOnlyFinder.hook not in sys.path_hooks:
        sys.path_hooks.insert(0, _SourceOnlyFinder.hook)
    for path in list(sys.path_importer_cache):
        if _SourceOnlyFinder.covers(path):
            del sys.path_importer_cache[path]  # found again, through the hook


class _SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Compiles a module from its source, never from a __pycache__ .pyc, and records the
    bytes it compiled (`sources.record_imported_source`): keying reads sources again, and
    checks them against these.

    A .pyc is trusted by the source's mtime in whole seconds and its size, so a
    same-size edit within a second would compile the old code under the key of
    the new source - a stale kernel in the store for good. kbuild's own modules and
    the toolchain's (a checkout of one on the path) load as Python loads them.
    (A hash-checked .pyc would be sound, but reading one is unmarshalling code, which
    kbuild never does.)
    """

    def get_code(self, fullname):
        if is_library(fullname):
            return super().get_code(fullname)
        path = self.get_filename(fullname)
        data = self.get_data(path)
        record_imported_source(path, data)
        return self.source_to_code(data, path)


def _stdlib_dirs() -> tuple:
    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k))


class _SourceOnlyFinder:
    """A sys.path hook: folders whose modules are not installed load through
    `_SourceOnlyLoader` - the project's import roots, and any other folder on the path that
    is neither an installed-packages folder nor the standard library's (a package beside
    the project on PYTHONPATH, whose device functions and constants a kernel reads as
    much as its own)."""

    roots: set = set()

    @classmethod
    def covers(cls, path) -> bool:
        real = os.path.realpath(path or ".")
        parts = real.split(os.sep)
        if "site-packages" in parts or "dist-packages" in parts:
            return False
        return not any(real == d or real.startswith(d + os.sep) for d in _stdlib_dirs())

    @classmethod
    def in_roots(cls, path) -> bool:
        """Whether `path` is under one of the project's import roots."""
        real = os.path.realpath(path or ".")
        return cls.covers(path) and any(
            real == r or real.startswith(r + os.sep) for r in cls.roots)

    @classmethod
    def hook(cls, path):
        if not cls.covers(path) or not os.path.isdir(path or "."):
            raise ImportError("not a kbuild project directory")
        loaders = [(importlib.machinery.ExtensionFileLoader,
                    importlib.machinery.EXTENSION_SUFFIXES),
                   (_SourceOnlyLoader, importlib.machinery.SOURCE_SUFFIXES)]
        return importlib.machinery.FileFinder(path, *loaders)


def forget_project_modules() -> int:
    """Drop every module kbuild imported from a project's sources from sys.modules, so the
    next import runs the saved sources (`kbuild watch`); returns how many. Modules loaded
    any other way (kbuild itself, numba, site-packages) stay."""
    from .backend.backends import loaded

    gone = [name for name, module in sys.modules.copy().items()
            if isinstance(getattr(getattr(module, "__spec__", None), "loader", None),
                          _SourceOnlyLoader) and not is_library(name)]
    for name in gone:
        del sys.modules[name]
    importlib.invalidate_caches()
    for backend in loaded():  # what their compilers took from the first import goes too
        backend.project_forgotten()
    made.forget_all()  # the state compiles filled into the modules gone
    return len(gone)


def resolve_kernel(config: ProjectConfig, spec: KernelSpec) -> ResolvedKernel:
    """Import and getattr `module:attr.path`; check it is a kernel; parse its signatures."""
    module_name, _, attr_path = spec.name.partition(":")
    module = _import(config, spec.name, module_name)
    obj = module
    for i, part in enumerate(attr_path.split(".")):
        if not hasattr(obj, part):
            owner = module_name if i == 0 else f"{module_name}:{'.'.join(attr_path.split('.')[:i])}"
            what = "module" if i == 0 else "object"
            raise TargetError(f"unknown target '{spec.name}' in {config.path.name}: "
                              f"{what} '{owner}' has no attribute '{part}'")
        obj = getattr(obj, part)
    backend = _check_kernel(config, spec, obj)
    resolved = ResolvedKernel(spec=spec, kernel=obj, argtypes={}, backend=backend)
    for text in spec.signatures:
        try:
            resolved.argtypes[text] = parse_signature(config, spec.name, text, module, backend)
        except BadSignature as exc:
            resolved.bad_signatures[text] = exc
    return resolved


class ImportFailure(TargetError):
    """A declared module exists but raised while importing: its targets fail, the others build.

    It names the module and the one-line cause, so every target of that module fails with
    one import attempt (`for_target`).
    """

    exit_code = 1

    def __init__(self, config_name: str, target: str, module: str, cause: str):
        super().__init__(f"target '{target}' in {config_name}: importing '{module}' failed: "
                         f"{cause}")
        self.config_name, self.module, self.cause = config_name, module, cause

    def for_target(self, target: str) -> "ImportFailure":
        return ImportFailure(self.config_name, target, self.module, self.cause)


def _import(config: ProjectConfig, target: str, module_name: str):
    from .backend import backends

    add_import_paths(config)
    try:
        # Eager @cuda.jit("sig") compiles at import: give it an architecture, for every
        # backend the project may use (one it names, or whose package is imported).
        names = [backends.DEFAULT, *config.backends, *(
            k.name for k in backends.KNOWN.values() if backends.imported(k.package))]
        with backends.targeting(dict.fromkeys(names), arch_cc(config.archs[0])):
            return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and _is_prefix(exc.name, module_name):
            raise TargetError(f"unknown target '{target}' in {config.path.name}: "
                              f"no module named '{exc.name}' (import roots: "
                              f"{', '.join(str(p) for p in config.paths)})") from None
        raise ImportFailure(config.path.name, target, module_name,
                            _import_cause(config, exc)) from None
    except Exception as exc:  # noqa: BLE001 - user code can raise anything at import
        raise ImportFailure(config.path.name, target, module_name,
                            _import_cause(config, exc)) from None


def _is_prefix(package: str, module_name: str) -> bool:
    return module_name == package or module_name.startswith(package + ".")


def _import_cause(config: ProjectConfig, exc) -> str:
    """One line: the exception's first line and where in the project it was raised (and,
    for a backend's package that is not installed, the pip extra that installs it)."""
    from .backend.backends import KNOWN

    first = (str(exc).strip().splitlines() or [""])[0]
    cause = f"{type(exc).__name__}: {first} ({_where(config, exc)})"
    for known in KNOWN.values():
        if isinstance(exc, ModuleNotFoundError) and known.extra and exc.name \
                and _is_prefix(known.package, exc.name):
            cause += f'; backend {known.name!r} is installed with: pip install "kbuild[{known.extra}]"'
    return cause


def _where(config: ProjectConfig, exc) -> str:
    """file:line of the innermost frame in the project's own code (else the innermost)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) and exc.filename:
        frames.append(traceback.FrameSummary(exc.filename, exc.lineno or 0, "<module>"))
    ours = [f for f in frames if os.path.isabs(f.filename)
            and _SourceOnlyFinder.in_roots(os.path.dirname(f.filename))]
    frame = (ours or frames)[-1]
    filename = frame.filename
    try:
        filename = os.path.relpath(filename, config.root)
    except ValueError:  # another drive
        pass
    if filename.startswith(".."):
        filename = frame.filename
    return f"{filename}:{frame.lineno}"


def _check_kernel(config: ProjectConfig, spec: KernelSpec, obj):
    """The backend that compiles `obj`, which must be a kernel of the backend kbuild.toml
    names for it (when it names one)."""
    from .backend import backends
    from .keying.interfaces import Role

    target = spec.name
    backend = backends.of_object(obj)
    fn = backend.objects.function_of(obj) if backend is not None and backend.owns(obj) else None
    if fn is None or fn.role is Role.FUNCTION:
        raise TargetError(f"target '{target}' in {config.path.name} is a "
                          f"{type(obj).__name__}, not a numba-cuda kernel; "
                          "decorate it with @cuda.jit")
    if fn.role is Role.DEVICE:
        raise TargetError(f"target '{target}' in {config.path.name} is a device function "
                          "(device=True); declare the kernels that call it instead")
    if spec.backend is not None and spec.backend != backend.name:
        raise TargetError(f"target '{target}' in {config.path.name} is a {backend.name} kernel "
                          f"({type(obj).__name__}), but kbuild.toml names backend "
                          f"{spec.backend!r} for it; import cuda from the package of "
                          f"{spec.backend} or set backend = {backend.name!r}")
    return backend


def parse_signature(config: ProjectConfig, target: str, text: str, module, backend=None):
    """Evaluate a signature string with the backend's types (numba's: numba.types) and the
    module's globals, the module's own types winning (see `backend.base.type_namespace`)."""
    backend = backend or _default_backend()
    try:
        argtypes, restype = backend.parse_signature(text, module)
    except Exception as exc:  # noqa: BLE001
        raise BadSignature(f"target '{target}' in {config.path.name}: bad signature "
                           f"{text!r}: {type(exc).__name__}: {exc}"
                           f"{_type_did_you_mean(exc, backend, module)}") from None
    if restype is not None:
        raise BadSignature(f"target '{target}' in {config.path.name}: signature {text!r} "
                           f"returns {restype}; kernels return void")
    return tuple(argtypes)


class BadSignature(TargetError):
    """A declared signature that does not parse: its own targets fail (exit 1), the
    kernel's other signatures and the other kernels build."""

    exit_code = 1


def _type_did_you_mean(exc: Exception, backend, module) -> str:
    """'; did you mean 'float32'?' for a name the signature misspelt (`flaot32`)."""
    import difflib

    name = getattr(exc, "name", None) if isinstance(exc, NameError) else None
    if not isinstance(name, str):
        return ""
    # What could stand where a type is written: not the module's functions, kernels or
    # imported modules (`Particle` is the dtype `PARTICLE`, not the function `particles`).
    backend = backend or _default_backend()
    names = {k.lower(): k for k, v in sorted(signature_namespace(module, backend).items(),
                                             reverse=True)
             if isinstance(k, str) and not k.startswith("_") and _type_like(v, backend)}
    close = difflib.get_close_matches(name.lower(), names, n=1, cutoff=0.6)
    return f"; did you mean '{names[close[0]]}'?" if close else ""


def _type_like(value, backend) -> bool:
    """Whether a signature's namespace entry can be a type: anything but a function, a
    module or a kernel (a dispatcher, which keeps its Python function)."""
    import inspect

    return not (inspect.isroutine(value) or inspect.ismodule(value)
                or backend.python_function(value) is not None)


def signature_namespace(module, backend=None) -> dict:
    """What a signature string declared for a kernel of `module` is evaluated in: the
    backend's types (numba.types), `from_dtype` and the module's globals."""
    return (backend or _default_backend()).signature_namespace(module)


def _default_backend():
    from .backend.backends import DEFAULT, get

    return get(DEFAULT)
