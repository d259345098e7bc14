"""A notebook's kernels follow its cells: a global a served kernel read, rebound by a cell.

numba resolves a kernel's globals when it compiles it and keeps that code: edit the cell
of a device function and run it again, and the kernels that call it launch the old code
until their own cell runs again. In a notebook that is never what the user meant. After
each cell runs (IPython's `post_run_cell` event), every kernel kbuild served whose code,
or the code of a device function it reaches, reads a global of the notebook's namespace
that the cell rebound to another object, drops its compiled code (its backend's
`forget_kernel`): its next launch asks kbuild again, which keys it with what it reads now (the store may
hold it already). Identities only decide when to key again; they are never in a key.
"""

from __future__ import annotations

import sys
import types as pytypes
import weakref

from ..cells import is_interactive_module

# dispatcher -> (namespace, ((name, object read), ...)) for each kernel served from cells.
_watched: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_registered: dict = {}


def active() -> bool:
    """Whether this process runs notebook cells (IPython's namespace is there)."""
    return _notebook_namespace() is not None


def follow(dispatcher, keyer) -> None:
    """Watch the notebook globals that the kernel of `dispatcher` and the device functions
    its key reached (`keyer.device_functions`) read; nothing outside IPython."""
    from ..backend.backends import ALL_OBJECTS

    namespace = _notebook_namespace()
    if namespace is None or not _listening():
        return
    read = {}
    for disp in [dispatcher, *keyer.device_functions]:
        fn = ALL_OBJECTS.function_of(disp)
        if fn is not None and fn.py_func.__globals__ is namespace:
            for name in _global_names(fn.py_func.__code__):
                if name in namespace:
                    read[name] = namespace[name]
    if read:
        try:
            _watched[dispatcher] = (namespace, tuple(sorted(read.items(), key=_first)))
        except TypeError:  # not weakly referable: not watched
            pass


def after_cell(*_args) -> None:
    """IPython's `post_run_cell`: forget the kernels whose globals the cell rebound."""
    from ..backend.backends import DEFAULT, get, of_object

    for dispatcher, (namespace, read) in list(_watched.items()):
        if any(namespace.get(name, _GONE) is not value for name, value in read):
            (of_object(dispatcher) or get(DEFAULT)).forget_kernel(dispatcher)
            _watched.pop(dispatcher, None)


_GONE = object()


def _first(item):
    return item[0]


def _notebook_namespace():
    module = sys.modules.get("__main__")
    return vars(module) if is_interactive_module(module) else None


def _listening() -> bool:
    """Whether `after_cell` runs after each cell (registered once, with IPython's shell)."""
    if "shell" not in _registered:
        ipython = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
        if ipython is None:
            return False
        ipython.events.register("post_run_cell", after_cell)
        _registered["shell"] = ipython
    return True


def _global_names(code) -> set:
    """The names `code` and the code nested in it load (globals among them)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, pytypes.CodeType):
            names |= _global_names(const)
    return names
