"""The backends kbuild knows, loaded only when a project or a kernel asks for one.

`KNOWN` names each backend, the Python package its objects come from and the pip
extra that installs it. `get(name)` loads one (a missing package is one error naming
the extra to install); `of_object(obj)` says which backend's kernel an object is
(asking only backends whose package is already imported: an object of a package
nobody imported cannot exist); `ALL_OBJECTS` is the `ObjectModel` keying gets, which
answers for every backend's objects, so one keyer keys a project whose kernels use
both.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Known:
    """A backend kbuild can build with."""

    name: str  # as kbuild.toml spells it
    module: str  # kbuild's module implementing it (its `BACKEND`)
    package: str  # the import name of the compiler's package (its objects' module root)
    extra: str | None  # kbuild's pip extra that installs it (None: always installed)


NUMBA_CUDA_NAME = "numba-cuda"
MLIR_NAME = "numba-cuda-mlir"
DEFAULT = NUMBA_CUDA_NAME
KNOWN = {k.name: k for k in (
    Known(NUMBA_CUDA_NAME, "kbuild.backend.numbacuda", "numba", None),
    # Its `backend` module, not the package: importing the package imports numba-cuda-mlir,
    # and zero-config asks for this backend right after that import, before the package
    # has finished (`zeroconf._serve_mlir`).
    Known(MLIR_NAME, "kbuild.backend.mlir.backend", "numba_cuda_mlir", "mlir"),
)}


class MissingBackend(ConfigError):
    """A backend was asked for whose package is not installed."""


def missing_message(name: str, who: str) -> str:
    """The one error for a backend whose package is not installed, naming the extra."""
    known = KNOWN[name]
    return (f"{who} asks for backend {name!r}, but its package ({known.package}) is not "
            f'installed; install it with: pip install "kbuild[{known.extra}]"')


def imported(package: str) -> bool:
    """Whether this process has imported `package`."""
    return sys.modules.get(package) is not None


def installed(name: str) -> bool:
    """Whether the backend's package can be imported (without importing it)."""
    package = KNOWN[name].package
    if imported(package):
        return True
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # ValueError: a package blocked in sys.modules
        return False


def get(name: str, who: str = "the project"):
    """The backend `name`, loaded now; `MissingBackend` when its package is absent."""
    known = KNOWN[name]
    if not installed(name):
        raise MissingBackend(missing_message(name, who))
    # Asked for every object keyed: a module imported already is read, not imported again.
    module = sys.modules.get(known.module)
    return (module if module is not None else importlib.import_module(known.module)).BACKEND


def loaded() -> list:
    """The backends whose compiler this process has imported (numba-cuda always: kbuild
    itself depends on it), in `KNOWN` order."""
    return [get(k.name) for k in KNOWN.values() if k.extra is None or imported(k.package)]


def of_object(obj):
    """The backend whose object `obj` is (a dispatcher, a device function, an intrinsic,
    a declared extern, a type), or None for an object of no compiler's."""
    root = type(obj).__module__.partition(".")[0]
    for known in KNOWN.values():
        if root == known.package and imported(known.package):
            return get(known.name)
    return None


@contextlib.contextmanager
def targeting(names, cc: tuple, binds: bool = False):
    """Within the block, every backend in `names` that is installed compiles for `cc`
    without asking a driver (kernel modules that compile at import are imported here);
    `binds`: under a stand-in driver, loading what a GPU would load at compile."""
    with contextlib.ExitStack() as stack:
        for name in names:
            if installed(name):
                stack.enter_context(get(name).targeting(cc, binds))
        yield


class AllObjects:
    """`keying.interfaces.ObjectModel` for every backend: an object is answered for by the
    backend it belongs to (numba-cuda's model answers for plain Python functions and
    values); what the compilers' registries hold is asked of every loaded backend."""

    def _model(self, obj):
        backend = of_object(obj)
        return (backend or get(DEFAULT)).objects

    def function_of(self, obj):
        return self._model(obj).function_of(obj)

    def options_of(self, obj) -> dict:
        return self._model(obj).options_of(obj)

    def declared_function(self, value):
        return self._model(value).declared_function(value)

    def record_of(self, value):
        return self._model(value).record_of(value)

    def linked_item(self, item):
        return self._model(item).linked_item(item)

    def overloads_of(self, func) -> list:
        found = []
        for backend in loaded():
            found += [f for f in backend.objects.overloads_of(func)
                      if not any(f is g for g in found)]
        return found

    def known_to_compiler(self, value) -> bool:
        return any(backend.objects.known_to_compiler(value) for backend in loaded())

    def named_form(self, value):
        return self._model(value).named_form(value)


ALL_OBJECTS = AllObjects()
