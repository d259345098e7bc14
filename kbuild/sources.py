"""The side effects keying needs: source text, linked files, project membership.

Facts keying computed in an earlier process are read from, and written to, the store
(`store.facts`); this module keeps this process's tables of them.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import sys
import time
from functools import lru_cache
from pathlib import Path

from . import cells
from .keying import ctext
from .keying.encode import digest
from .errors import CHANGED_AFTER_IMPORT, KeyingError
from .store.facts import KeptFacts

# path -> digest of the source bytes this process compiled the module from.
_IMPORTED: dict[str, str] = {}


def record_imported_source(path: str, data: bytes) -> None:
    """Remember what a project module was compiled from (called by its loader)."""
    _IMPORTED[os.path.realpath(path)] = digest(decoded_source(data).encode("utf-8"))


def note_source(path: str) -> None:
    """Remember the source of a module kbuild did not import itself (a program running
    under `kbuild.enable()` imported it), as it is on disk now, the first time one of its
    functions is keyed: its keying facts are then kept by that digest (so a warm process
    parses nothing), and an edit made later in the process is seen as one (`_index_defs`)."""
    real = _realpath(path)
    if real in _IMPORTED:
        return
    try:
        with open(real, "rb") as fh:
            record_imported_source(real, fh.read())
    except OSError:
        pass


def note_rerun_script(code) -> None:
    """A script run again in one process after an edit (IPython's `%run`) made new code
    from its file as it is now: when `code` compiles from that text, it is the text the
    program now runs, no longer an edit made after import (`check_imported`). Only under
    IPython: a plain script never runs again, and an edit to it stays one."""
    real = _realpath(code.co_filename)
    if real not in _IMPORTED or not cells.in_ipython():
        return
    try:
        with open(real, "rb") as fh:
            data = fh.read()
    except OSError:
        return
    if digest(decoded_source(data).encode("utf-8")) != _IMPORTED[real] \
            and cells.file_compiles_to(code):
        record_imported_source(real, data)


def imported_sources() -> list[str]:
    """The real paths of the project modules this process compiled from their sources."""
    return sorted(_IMPORTED)


def changed_since_import() -> list[str]:
    """The project modules whose file no longer holds the source this process compiled
    (edited, or removed, while it ran)."""
    changed = []
    for path, imported in sorted(_IMPORTED.items()):
        try:
            with open(path, "rb") as fh:
                now = digest(decoded_source(fh.read()).encode("utf-8"))
        except OSError:
            now = None
        if now != imported:
            changed.append(path)
    return changed


def decoded_source(data: bytes) -> str:
    """Source bytes as Python reads them: BOM and coding cookie honoured, every line
    ending a newline. Digests of source are taken over this text, so a file that only
    changed its encoding or line endings is the same source (and no "changed after
    import" is reported for a CRLF or latin-1 file)."""
    try:
        return importlib.util.decode_source(data)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        # Not decodable as Python source (the import would have failed): the raw bytes.
        return data.decode("utf-8", "surrogateescape").replace("\r\n", "\n").replace("\r", "\n")


class ProjectSources:
    """`keying.interfaces.Sources` for a project whose import roots are `roots` (absolute paths).

    A module is the project's when its file lies under a root and not inside an
    installed package (site-packages), so device functions in libraries are
    still keyed by content but library helpers (``math.sqrt``) by name.
    """

    def __init__(self, roots, facts_dir=None):
        self._roots = tuple(os.path.realpath(r) + os.sep for r in roots)
        self._project_cache: dict[str, bool] = {}
        # Facts about functions (normalized syntax tree digests, names read) by the digest
        # of the source they were compiled from: a no-op build parses nothing.
        self._kept = KeptFacts(facts_dir) if facts_dir else None
        self._facts: dict[str, dict] = {}
        self._changed: set[str] = set()
        self._body_texts: dict[str, object] = {}  # body digest -> render(), to save

    def remembered(self, func, kind: str, compute):
        """`compute()` (JSON data) for `func`, kept in the facts directory under the digest
        of the source this process compiled `func` from; computed when not there."""
        code = getattr(func, "__code__", None)
        source = code and _IMPORTED.get(_realpath(code.co_filename))
        if self._kept is None or source is None or not self._unchanged(code, source) \
                or func.__name__ == "<lambda>":
            # Computed here: no facts kept, the file changed since import (`compute` reads
            # it and refuses), or a lambda (two on one line share a line and a name).
            return compute()
        table = self._facts.get(source)
        if table is None:
            table = self._facts[source] = self._kept.table(source)
        slot = f"{code.co_firstlineno} {func.__qualname__} {kind}"
        if slot not in table:
            table[slot] = compute()
            self._changed.add(source)
        return table[slot]

    def _unchanged(self, code, source: str) -> bool:
        try:
            return source_digest(code.co_filename) == source
        except OSError:
            return False

    def save_facts(self) -> None:
        """Write what `remembered` computed; a facts directory that cannot be written is
        only slower, never wrong."""
        for source in sorted(self._changed):
            try:
                self._kept.save_table(source, self._facts[source])
            except OSError:
                return
        self._changed.clear()
        if self._body_texts:
            self._kept.save_body_texts(self._body_texts)
        self._body_texts.clear()

    def keep_body_text(self, body_digest: str, render) -> None:
        """Keep `render()`, a body's readable source, beside the facts when they are saved
        (rendered only if not kept yet): `kbuild explain` diffs an earlier build's body
        (named in its entry's inputs by digest) against today's. Display only; never read
        back into a key."""
        if self._kept is not None:
            self._body_texts[body_digest] = render

    def body_text(self, body_digest: str) -> str | None:
        """The readable source kept for the body keyed as `body_digest`, or None (never
        kept, pruned, unreadable or damaged)."""
        return self._kept.body_text(body_digest) if self._kept is not None else None

    def source_of(self, func):
        code = getattr(func, "__code__", None)
        if code is not None:
            cells.registered_text(code)  # what inspect reads is what numba compiles
            check_imported(code.co_filename)  # inspect reads the file again
        try:
            lines, first = inspect.getsourcelines(func)
        except (OSError, TypeError):
            return None
        return "".join(lines), first

    def function_def(self, func):
        """(the `def` node of `func` from its file's syntax tree, 1), or None.

        Each file is parsed once per process, instead of tokenizing it again
        for every function as `inspect.getsource` does. Line numbers in the
        node are the file's own, hence the first line 1.
        """
        code = getattr(func, "__code__", None)
        if code is None or func.__name__ == "<lambda>":
            return None
        text = cells.registered_text(code)
        defs = self._defs_by_line(code.co_filename) if text is None else _cell_defs(text)
        for node in defs.get(code.co_firstlineno, ()):
            if node.name == func.__name__:
                return node, 1
        return None

    def _defs_by_line(self, filename: str) -> dict:
        cache = self.__dict__.setdefault("_defs", {})
        # By the text the program compiled too: a script run again (`note_rerun_script`).
        slot = (filename, _IMPORTED.get(_realpath(filename)))
        if slot not in cache:
            cache[slot] = _index_defs(filename)
        return cache[slot]

    def is_project_module(self, module_name: str) -> bool:
        cached = self._project_cache.get(module_name)
        if cached is None:
            cached = self._project_cache[module_name] = self._in_roots(module_name)
        return cached

    def _in_roots(self, module_name: str) -> bool:
        module = sys.modules.get(module_name)
        path = getattr(module, "__file__", None)
        if not path:
            # A notebook's namespace: its functions are the program's, keyed by content.
            return cells.is_interactive_module(module)
        path = os.path.realpath(path)
        if "site-packages" in path.split(os.sep) or "dist-packages" in path.split(os.sep):
            return False
        return path.startswith(self._roots)

    def relative_path(self, path: str) -> tuple | None:
        """(index of the import root, path below it in POSIX form) of a path under one of
        the project's roots, else None: how a path is keyed independently of where the
        checkout is."""
        real = os.path.realpath(path)
        for index, root in enumerate(self._roots):
            if real.startswith(root) or real + os.sep == root:
                return index, Path(os.path.relpath(real, root)).as_posix()
        return None

    def file_digest(self, path: str) -> str:
        """The digest of a file's bytes; a module's source (a class keyed by its module, a
        module imported lazily) only while it still holds what the import compiled."""
        check_imported(path)
        return _by_stamp(_DIGESTS, _realpath(path), _read_digest)

    def cuda_source_digest(self, path: str) -> str:
        return _by_stamp(_CUDA_DIGESTS, _realpath(path), _read_cuda_digest)


@lru_cache(maxsize=None)
def _realpath(path: str) -> str:
    return os.path.realpath(path)


# A file's digest or decoded text is kept by its whole stat, as git's index keeps a file:
# an edit that keeps the size and mtime (`cp -p`, `rsync -t`, `touch -r`, a checkout)
# still changes the ctime (and often the inode). Two writes within one tick of the file
# system's coarse clock keep every field, so a file changed that recently before it was
# read ("racily clean" in git's words) is not kept at all: read again next time.
_RACY_NS = 2 * 10**9
_DIGESTS: dict[str, tuple] = {}  # real path -> (stamp, digest of the bytes)
_TEXTS: dict[str, tuple] = {}  # real path -> (stamp, decoded source text)
_CUDA_DIGESTS: dict[str, tuple] = {}  # real path -> (stamp, digest of the CUDA C source form)


def _stamp(path: str) -> tuple:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _by_stamp(table: dict, path: str, read):
    """`read(path)`, kept in `table` while the file's stat stays what it was."""
    stamp = _stamp(path)
    held = table.get(path)
    if held is not None and held[0] == stamp:
        return held[1]
    value = read(path)
    if time.time_ns() - max(stamp[3], stamp[4]) > _RACY_NS:
        table[path] = (stamp, value)
    else:
        table.pop(path, None)
    return value


def _read_digest(path: str) -> str:
    with open(path, "rb") as fh:
        return digest(fh.read())


def _read_cuda_digest(path: str) -> str:
    with open(path, "rb") as fh:
        return ctext.source_digest(fh.read())


def _read_text(path: str) -> str:
    with open(path, "rb") as fh:
        return decoded_source(fh.read())


def check_imported(path) -> None:
    """Raise `KeyingError` when the file a module was imported from (`_SourceOnlyLoader`:
    every module that is not installed) no longer holds the bytes the import compiled.

    numba compiles the code objects the import made; kbuild keys sources it reads again.
    Keying what is on disk now would store that compile under a key it does not match
    (an import that rewrites a file imported before it, a save during the build)."""
    try:
        real = _realpath(path)
    except (OSError, TypeError, ValueError):
        return
    if real in _IMPORTED:
        try:
            text = _by_stamp(_TEXTS, real, _read_text)
        except OSError:
            return  # gone: whatever reads it next fails, naming it
        _check_text(path, real, text)


def _check_text(shown, real: str, text: str) -> None:
    imported = _IMPORTED.get(real)
    if imported is not None and digest(text.encode("utf-8")) != imported:
        # The code numba would compile is not the code on disk: keying either one
        # would describe a binary this process cannot build.
        raise KeyingError(f"{shown} {CHANGED_AFTER_IMPORT}; run again "
                          "in a new process (or Project.load() in a fresh interpreter)")


def source_digest(path: str) -> str:
    """The digest of a Python source file's decoded text (see `decoded_source`)."""
    real = _realpath(path)
    return digest(_by_stamp(_TEXTS, real, _read_text).encode("utf-8"))


@lru_cache(maxsize=64)
def _cell_defs(text: str) -> dict:
    """Every function definition in a cell's registered text (`cells`), by first line."""
    try:
        return _defs_of(ast.parse(text))
    except (SyntaxError, ValueError):
        return {}


def _index_defs(filename: str) -> dict:
    """Every function definition in a file, by the line its code object starts on."""
    try:
        real = _realpath(filename)
        text = _by_stamp(_TEXTS, real, _read_text)
    except OSError:
        return {}
    _check_text(filename, real, text)
    try:
        return _defs_of(ast.parse(text))
    except (SyntaxError, ValueError):
        return {}


def _defs_of(tree) -> dict:
    index: dict = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # A decorated function's code starts at its first decorator.
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            index.setdefault(first, []).append(node)
    return index
