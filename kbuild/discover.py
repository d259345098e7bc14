"""Turn a project's declared targets into live kernels and numba signatures."""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
import traceback
from dataclasses import dataclass

from .config import KernelSpec, ProjectConfig, arch_cc
from .errors import TargetError
from .sources import record_imported_source


@dataclass(frozen=True)
class Target:
    """One build target: a kernel x one signature x one arch."""

    name: str
    signature: str
    arch: str

    @property
    def label(self) -> str:
        return f"{self.name} {self.signature} {self.arch}"


@dataclass
class ResolvedKernel:
    """A declared kernel, imported, with its signatures parsed."""

    spec: KernelSpec
    kernel: object
    argtypes: dict  # signature text -> tuple of numba types


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
    """Compiles a project module from its source, never from a __pycache__ .pyc.

    A .pyc is trusted by the source's mtime in whole seconds and its size, so a
    same-size edit within a second would compile the old code under the key of
    the new source - a stale kernel in the store for good. (A hash-checked .pyc would
    be sound, but reading one is unmarshalling code, which kbuild never does.)
    """

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        data = self.get_data(path)
        record_imported_source(path, data)
        return self.source_to_code(data, path)


class _SourceOnlyFinder:
    """A sys.path hook: directories under a project root load through `_SourceOnlyLoader`."""

    roots: set = set()

    @classmethod
    def covers(cls, path) -> bool:
        real = os.path.realpath(path or ".")
        parts = real.split(os.sep)
        return "site-packages" not in parts and "dist-packages" not in parts and any(
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
    gone = [name for name, module in sys.modules.items()
            if isinstance(getattr(getattr(module, "__spec__", None), "loader", None),
                          _SourceOnlyLoader)]
    for name in gone:
        del sys.modules[name]
    importlib.invalidate_caches()
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
    _check_kernel(config, spec.name, obj)
    argtypes = {s: parse_signature(config, spec.name, s, module) for s in spec.signatures}
    return ResolvedKernel(spec=spec, kernel=obj, argtypes=argtypes)


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
    from .backend.compiler import targeting

    add_import_paths(config)
    try:
        # Eager @cuda.jit("sig") compiles at import: give it an architecture.
        with targeting(arch_cc(config.archs[0])):
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
    """One line: the exception's first line and where in the project it was raised."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first} ({_where(config, exc)})"


def _where(config: ProjectConfig, exc) -> str:
    """file:line of the innermost frame in the project's own code (else the innermost)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) and exc.filename:
        frames.append(traceback.FrameSummary(exc.filename, exc.lineno or 0, "<module>"))
    ours = [f for f in frames if os.path.isabs(f.filename)
            and _SourceOnlyFinder.covers(os.path.dirname(f.filename))]
    frame = (ours or frames)[-1]
    filename = frame.filename
    try:
        filename = os.path.relpath(filename, config.root)
    except ValueError:  # another drive
        pass
    if filename.startswith(".."):
        filename = frame.filename
    return f"{filename}:{frame.lineno}"


def _check_kernel(config: ProjectConfig, target: str, obj) -> None:
    from .backend.objectmodel import NUMBA_CUDA
    from .keying.interfaces import Role

    fn = NUMBA_CUDA.function_of(obj)
    if fn is None or fn.role is Role.FUNCTION:
        raise TargetError(f"target '{target}' in {config.path.name} is a "
                          f"{type(obj).__name__}, not a numba-cuda kernel; "
                          "decorate it with @cuda.jit")
    if fn.role is Role.DEVICE:
        raise TargetError(f"target '{target}' in {config.path.name} is a device function "
                          "(device=True); declare the kernels that call it instead")


def parse_signature(config: ProjectConfig, target: str, text: str, module):
    """Evaluate a numba signature string with numba.types and the module's globals."""
    from numba.core import sigutils

    namespace = _signature_namespace(module)
    try:
        sig = eval(text, {"__builtins__": {}}, namespace)  # noqa: S307 - numba's own format
        argtypes, restype = sigutils.normalize_signature(sig)
    except Exception as exc:  # noqa: BLE001
        raise TargetError(f"target '{target}' in {config.path.name}: bad signature "
                          f"{text!r}: {type(exc).__name__}: {exc}") from None
    from numba.core import types

    if restype not in (None, types.void, types.none):
        raise TargetError(f"target '{target}' in {config.path.name}: signature {text!r} "
                          f"returns {restype}; kernels return void")
    return tuple(argtypes)


def _signature_namespace(module) -> dict:
    import numpy as np
    from numba import from_dtype
    from numba.core import types

    namespace = {}
    for name, value in vars(module).items():
        # A record dtype in the module can be named directly: void(Point[::1]).
        namespace[name] = from_dtype(value) if isinstance(value, np.dtype) else value
    namespace.update(vars(types))
    namespace["from_dtype"] = _from_dtype
    return namespace


def _from_dtype(value):
    """numba's `from_dtype`, also given a dtype the namespace already converted:
    `from_dtype(POINT)[::1]` (numba's own idiom) and `POINT[::1]` both work."""
    from numba import from_dtype
    from numba.core import types

    return value if isinstance(value, types.Type) else from_dtype(value)
