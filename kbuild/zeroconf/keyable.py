"""Whether kbuild can key a kernel at all: its code has a source kbuild can read.

A kernel kbuild keys belongs to a module with a source file: its entry is bound to the
module numba names in its symbols, and what it reads is the module's. Its own code may
have been made by `exec` in that module's namespace (numba's `vectorize` and
`guvectorize` make their kernels so): keying then takes its bytecode, which is what numba
compiles. A notebook's namespace has no file but keeps each cell's text (`cells`): its
kernels are keyed from that text. One typed at a plain prompt, or made by `exec` of a
string whose text was not kept, has neither (KeyingError: numba compiles it).
"""

from __future__ import annotations

import os
import sys

from ..errors import KeyingError


def check_source(py_func, options) -> None:
    """Raise KeyingError, saying why, when `py_func` (a kernel compiled with `options`)
    has no source kbuild can key it by (see the module's docstring)."""
    from .. import cells
    from ..sources import note_rerun_script

    if py_func.__module__ == "__main__":
        note_rerun_script(py_func.__code__)  # `%run script.py` again, after an edit
    module = sys.modules.get(py_func.__module__) if py_func.__module__ else None
    filename = getattr(module, "__file__", None)
    if module is not None and filename and os.path.isfile(filename) \
            and (py_func.__globals__ is vars(module) or _made_by_numba(py_func)):
        return
    if not cells.namespace_source(py_func):
        raise KeyingError(cells.unkeyable_reason(py_func))
    if (options.get("lineinfo") or options.get("debug")) \
            and cells.is_registered(py_func.__code__.co_filename):
        # Its binary would name the cell's file, which names this process (ipykernel's
        # /tmp/ipykernel_<pid>/...): not what another process's compile writes.
        raise KeyingError(f"a lineinfo or debug kernel names its cell's file "
                          f"({py_func.__code__.co_filename}) in its binary, and that name "
                          "is this process's; define it in a module to cache it")


def _made_by_numba(py_func) -> bool:
    """A kernel numba's ufunc builders made by `exec` over a copy of the user's module
    namespace (their core function and `cuda` added to it)."""
    return py_func.__code__.co_filename == "<string>" and \
        "__core__" in py_func.__globals__ and py_func.__name__.startswith(("__vectorized_",
                                                                           "__gufunc_"))
