"""Run a function right after a module is first imported (at once, if it already is).

`kbuild.enable()` serves numba-cuda-mlir's dispatchers too, but must not import
numba-cuda-mlir itself (about 0.7 s, and most programs never use it): it waits for the
program to import it. A finder first on `sys.meta_path` lends the real finders' spec a
loader that, once the module has run, calls what was waiting for it.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading

_WAITING: dict = {}  # module name -> [function, ...]
_lock = threading.Lock()


def after_import(name: str, then) -> None:
    """Call `then()` once module `name` has been imported (now, if it has been)."""
    if name in sys.modules:  # imported (or, asked by a function that waited for it: run)
        then()
        return
    with _lock:
        _WAITING.setdefault(name, []).append(then)
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())


def cancel(then) -> None:
    """`then` no longer waits for any import."""
    with _lock:
        for name in list(_WAITING):
            _WAITING[name] = [f for f in _WAITING[name] if f is not then]
            if not _WAITING[name]:
                del _WAITING[name]


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module something waits for, it asks the finders after
    it and wraps the loader of the spec they give."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _WAITING:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Then(spec.loader, fullname)
                return spec
        return None


class _Then:
    """A loader that runs the module as `inner` does, then what waits for it."""

    def __init__(self, inner, name: str):
        self._inner, self._name = inner, name

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        # The module keeps its own loader, as if nothing had stood between.
        module.__loader__ = self._inner
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)
        with _lock:
            waiting = _WAITING.pop(self._name, [])
        for then in waiting:
            then()

    def __getattr__(self, name):  # get_source, get_filename, is_package, ...
        return getattr(self._inner, name)


__all__ = ["after_import", "cancel"]
