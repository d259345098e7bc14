"""Code whose text is kept in memory rather than in a file: notebook cells and the like.

IPython compiles each cell under a file name of its own (ipykernel:
`/tmp/ipykernel_<pid>/<hash>.py`; its terminal: `<ipython-input-N-...>`) and registers the
cell's text in `linecache` under that name with no modification time, an entry
`linecache.checkcache` never drops, as there is no file to compare it with. Any program
may do the same for code it makes with `compile` and `exec`. Such text is a source as good
as a file's, provided it is the text the code was compiled from: ipykernel names a cell
after its text, but a name registered by hand may be registered again with other text,
and keying that text would describe code numba does not compile. `registered_text`
therefore compiles the text again and finds the very code object in it.

The file name itself (it holds the kernel process's id) never enters a key: keying reads
the text, the function's module name and qualified name.
"""

from __future__ import annotations

import ast
import linecache
import os
import sys
from functools import lru_cache

from .errors import KeyingError

# What IPython may compile a cell with (top-level `await`); harmless for other text.
_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


# Names every `exec` of a string, `python -c` and a plain prompt share (Python 3.13 keeps
# the `-c` text under `<string>`): text registered there is no one code's own.
_SHARED_NAMES = frozenset({"<string>", "<stdin>"})


def is_registered(filename: str) -> bool:
    """Whether `linecache` holds text registered in memory (no file behind it) for `filename`."""
    if filename in _SHARED_NAMES:
        return False
    entry = linecache.cache.get(filename)
    return isinstance(entry, tuple) and len(entry) == 4 and entry[1] is None \
        and isinstance(entry[2], list)


def registered_text(code) -> str | None:
    """The text registered in `linecache` for `code`'s file name, or None when there is
    none. KeyingError when the text registered now is not what `code` was compiled from
    (the name was registered again with other text since)."""
    filename = code.co_filename
    if not is_registered(filename):
        return None
    text = "".join(linecache.cache[filename][2])
    if _signature(code) not in _code_signatures(filename, text):
        raise KeyingError(f"the text registered for {_shown(filename)} is not the text "
                          f"'{code.co_name}' was compiled from (registered again since); "
                          "run its cell again")
    return text


def in_ipython() -> bool:
    """Whether IPython runs this program (a notebook's kernel, its terminal)."""
    get = getattr(sys.modules.get("IPython"), "get_ipython", None)
    return get is not None and get() is not None


def is_interactive_module(module) -> bool:
    """Whether `module` is an interactive namespace (IPython's user namespace, installed as
    `__main__` with no file): the program's own code, written in cells."""
    return getattr(module, "__name__", None) == "__main__" and \
        not getattr(module, "__file__", None)


def unkeyable_reason(py_func) -> str:
    """Why the code of `py_func` has no source kbuild can key (neither a file nor text
    registered for it), in words a user can act on."""
    filename = py_func.__code__.co_filename
    if filename == "<stdin>":
        how = "typed at a plain >>> prompt, which keeps no text"
        hint = "define it in a module, or in IPython or Jupyter, which keep each cell's text"
    elif filename in _MAGIC_NAMES:
        how = "compiled by an IPython cell magic such as %%time, which keeps no text"
        hint = "define the kernel in a cell without the magic, or in a module"
    elif filename.startswith("<") and filename.endswith(">"):
        how = "made with exec of a string, or python -c, whose text was not kept"
        hint = ("define it in a module, or register its text in linecache under the name "
                "it was compiled with")
    elif os.path.isfile(filename):
        how = "made with exec in a namespace of no module"
        hint = "define it in a module"
    else:
        how = "no such file now, nor text registered for it"
        hint = "define it in a module"
    return f"it has no source file ({filename}: {how}); {hint}"


def file_compiles_to(code) -> bool:
    """Whether `code`'s file, as it is on disk now, compiles to `code` (a script run with
    IPython's `%run`, or `exec(compile(open(f).read(), f, "exec"))`: no import recorded
    the text it was compiled from)."""
    try:
        with open(code.co_filename, "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    from importlib.util import decode_source

    try:
        text = decode_source(data)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return False
    return _signature(code) in _code_signatures(code.co_filename, text)


# What IPython's %%time and %%timeit compile a cell's text under, registering none of it.
_MAGIC_NAMES = frozenset({"<timed exec>", "<timed eval>", "<magic-timeit>"})


def _shown(filename: str) -> str:
    return os.path.basename(filename) if os.sep in filename else filename


def _signature(code) -> tuple:
    """What tells a compiled function from another compiled at the same place (its line
    table too: a lineinfo binary holds its positions)."""
    return (code.co_firstlineno, getattr(code, "co_qualname", code.co_name), code.co_code,
            code.co_names, code.co_varnames,
            getattr(code, "co_linetable", None) or getattr(code, "co_lnotab", None))


@lru_cache(maxsize=256)
def _code_signatures(filename: str, text: str) -> frozenset:
    """The signature of every code object compiling `text` under `filename` makes."""
    try:
        top = compile(text, filename, "exec", flags=_FLAGS, dont_inherit=True)
    except (SyntaxError, ValueError):
        return frozenset()
    found, pending = set(), [top]
    while pending:
        code = pending.pop()
        found.add(_signature(code))
        pending.extend(c for c in code.co_consts if isinstance(c, type(top)))
    return frozenset(found)


def namespace_source(py_func) -> bool:
    """Whether `py_func`, made in a namespace that is no imported module's (a notebook's
    cells; a script run with `%run`, whose namespace IPython keeps, its `__name__`
    removed), has a source kbuild can key: text registered for its code, or a file that
    compiles to it. Keying reads what it reads from its own `__globals__`. KeyingError
    when its registered text is not the text it was compiled from."""
    code = py_func.__code__
    return registered_text(code) is not None or file_compiles_to(code)
