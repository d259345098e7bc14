"""The side effects keying needs: source text, linked files, project membership."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import stat
import sys
import time
from functools import lru_cache
from pathlib import Path

from .keying.encode import digest
from .errors import KeyingError

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
    """`keys.Sources` for a project whose import roots are `roots` (absolute paths).

    A module is the project's when its file lies under a root and not inside an
    installed package (site-packages), so device functions in libraries are
    still keyed by content but library helpers (``math.sqrt``) by name.
    """

    def __init__(self, roots, facts_dir=None):
        self._roots = tuple(os.path.realpath(r) + os.sep for r in roots)
        self._project_cache: dict[str, bool] = {}
        # Facts about functions (normalized syntax tree digests, names read) by the digest
        # of the source they were compiled from: a no-op build parses nothing.
        self._facts_dir = Path(facts_dir) / _facts_version() if facts_dir else None
        self._facts: dict[str, dict] = {}
        self._changed: set[str] = set()
        self._body_texts: dict[str, object] = {}  # body digest -> render(), to save

    def remembered(self, func, kind: str, compute):
        """`compute()` (JSON data) for `func`, kept in the facts directory under the digest
        of the source this process compiled `func` from; computed when not there."""
        code = getattr(func, "__code__", None)
        source = code and _IMPORTED.get(_realpath(code.co_filename))
        if self._facts_dir is None or source is None or not self._unchanged(code, source) \
                or func.__name__ == "<lambda>":
            # Computed here: no facts kept, the file changed since import (`compute` reads
            # it and refuses), or a lambda (two on one line share a line and a name).
            return compute()
        table = self._facts.get(source)
        if table is None:
            table = self._facts[source] = _read_facts(self._facts_dir / f"{source}.json", source)
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
        from .store.local import atomic_write

        for source in sorted(self._changed):
            text = json.dumps(_facts_record(source, self._facts[source]), sort_keys=True)
            try:
                atomic_write(self._facts_dir / f"{source}.json", text.encode(), self._facts_dir,
                             prefix=".facts.")
            except OSError:
                return
        self._changed.clear()
        self._save_body_texts()

    def keep_body_text(self, body_digest: str, render) -> None:
        """Keep `render()`, a body's readable source, beside the facts when they are saved
        (rendered only if not kept yet): `kbuild explain` diffs an earlier build's body
        (named in its entry's inputs by digest) against today's. Display only; never read
        back into a key."""
        if self._facts_dir is not None:
            self._body_texts[body_digest] = render

    def body_text(self, body_digest: str) -> str | None:
        """The readable source kept for the body keyed as `body_digest`, or None (never
        kept, pruned, unreadable or damaged)."""
        from .store.manifest import HEX32

        if self._facts_dir is None or not HEX32.match(body_digest):
            return None
        try:
            data = _read_regular_file(self._body_path(body_digest), BODY_TEXT_MAX_BYTES)
            record = json.loads(data) if data is not None else None
        except (OSError, ValueError, RecursionError):
            return None
        if not isinstance(record, dict) or record.get("body") != body_digest:
            return None
        text = record.get("text")
        if not isinstance(text, str) or record.get("digest") != _facts_digest(body_digest, text):
            return None
        return text

    def _body_path(self, body_digest: str) -> Path:
        return self._facts_dir / f"body-{body_digest}.json"

    def _save_body_texts(self) -> None:
        from .store.local import atomic_write

        now = time.time()
        for body, render in sorted(self._body_texts.items()):
            path = self._body_path(body)
            if _kept_in_use(path, now):
                continue
            text = render()
            if text is None or len(text) > BODY_TEXT_MAX_BYTES // 2:
                continue
            record = {"body": body, "text": text, "digest": _facts_digest(body, text)}
            try:
                atomic_write(path, json.dumps(record).encode(), self._facts_dir,
                             prefix=".facts.")
            except OSError:
                break  # not writable: explain says the earlier source was not kept
        self._body_texts.clear()

    def source_of(self, func):
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
        defs = self._defs_by_line(code.co_filename)
        for node in defs.get(code.co_firstlineno, ()):
            if node.name == func.__name__:
                return node, 1
        return None

    def _defs_by_line(self, filename: str) -> dict:
        cache = self.__dict__.setdefault("_defs", {})
        if filename not in cache:
            cache[filename] = _index_defs(filename)
        return cache[filename]

    def is_project_module(self, module_name: str) -> bool:
        cached = self._project_cache.get(module_name)
        if cached is None:
            cached = self._project_cache[module_name] = self._in_roots(module_name)
        return cached

    def _in_roots(self, module_name: str) -> bool:
        module = sys.modules.get(module_name)
        path = getattr(module, "__file__", None)
        if not path:
            return False
        path = os.path.realpath(path)
        if "site-packages" in path.split(os.sep) or "dist-packages" in path.split(os.sep):
            return False
        return path.startswith(self._roots)

    def file_digest(self, path: str) -> str:
        return _file_digest(_realpath(path), os.stat(path).st_mtime_ns)

    # numba's registries, read through the backend (keying names no numba internals).

    def overloads_of(self, func) -> list:
        from .backend.registry import overload_implementations

        return overload_implementations(func)

    def link_files_of(self, extfn) -> list[str]:
        from .backend.registry import extern_link_files

        return extern_link_files(extfn)

    def known_to_numba(self, value) -> bool:
        from .backend.registry import known_to_numba

        return known_to_numba(value)

    def simulator_options(self, fake) -> dict:
        from .backend.simopts import options_for

        return dict(options_for(fake))


@lru_cache(maxsize=None)
def _realpath(path: str) -> str:
    return os.path.realpath(path)


@lru_cache(maxsize=1)
def _facts_version() -> str:
    """Facts are what kbuild's own code computes: a new kbuild starts a new directory."""
    keying = Path(__file__).resolve().parent / "keying"
    return digest(b"".join(path.read_bytes() for path in sorted(keying.glob("*.py"))))[:16]


FACTS_MAX_BYTES = 16 << 20  # a facts file is a few KiB per source file; more is not ours


def _facts_record(source: str, table: dict) -> dict:
    """What a facts file holds: the table, the source it describes and a digest over both,
    so a damaged or hand-edited file is recognised and recomputed (see `_read_facts`)."""
    return {"source": source, "table": table, "digest": _facts_digest(source, table)}


def _facts_digest(source: str, table) -> str:
    # Also a kept body text's (`table` its text): a damaged or truncated file is recognised.
    return digest(json.dumps([source, table], sort_keys=True).encode("utf-8"))


def _read_facts(path: Path, source: str) -> dict:
    """The facts table kept for `source`, or {} (recomputed) when the file is missing,
    unreadable, too large, nested too deep, not for this source or not matching its digest.

    The digest catches damage, not forgery. What the facts could hide is guarded apart:
    the names a function reads are checked against its bytecode (`keys._load_chains`),
    and its body's key holds the bytecode fingerprint beside the syntax tree digest.
    """
    try:
        data = _read_regular_file(path, FACTS_MAX_BYTES)
        record = json.loads(data) if data is not None else None
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(record, dict) or record.get("source") != source:
        return {}
    table = record.get("table")
    if not isinstance(table, dict) or record.get("digest") != _facts_digest(source, table):
        return {}
    try:
        os.utime(path)  # its last use, for `prune_facts`; a read-only store keeps its times
    except OSError:
        pass
    return table


def _read_regular_file(path: Path, limit: int) -> bytes | None:
    """The bytes of `path` if it is a regular file (not a link, FIFO or device: those are
    never opened to block or to be followed) of at most `limit` bytes, else None."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


BODY_TEXT_MAX_BYTES = 1 << 20  # a function's source; anything longer is not shown


def _kept_in_use(path: Path, now: float) -> bool:
    """Whether a body's text is kept; if so, marked as in use (for `prune_facts`) once a
    day, so a function unchanged for months still has its text when it is first edited.
    A stat per function body and build; a write only once a day."""
    try:
        if now - path.stat().st_mtime > 24 * 3600:
            os.utime(path)
        return True
    except OSError:
        return False


FACTS_MAX_AGE = 30 * 24 * 3600  # seconds a facts file may go unread before `kbuild gc` drops it


def prune_facts(facts_root: Path, max_age: float = FACTS_MAX_AGE) -> int:
    """Remove the facts of other kbuild versions, and this version's facts unread for
    `max_age` seconds (an edited file leaves its old facts behind); return how many files
    went. Facts only save parsing: one removed too soon costs a parse, never a wrong key."""
    if not facts_root.is_dir():
        return 0
    current, removed = _facts_version(), 0
    oldest = time.time() - max_age
    for folder in facts_root.iterdir():
        for path in (folder.iterdir() if folder.is_dir() else [folder]):
            try:
                if folder.name != current or path.stat().st_mtime < oldest:
                    path.unlink()
                    removed += 1
            except OSError:
                pass
        if folder.name != current:
            try:
                folder.rmdir()
            except OSError:
                pass
    return removed


@lru_cache(maxsize=None)
def _file_digest(path: str, _mtime_ns: int) -> str:
    with open(path, "rb") as fh:
        return digest(fh.read())


def source_digest(path: str) -> str:
    """The digest of a Python source file's decoded text (see `decoded_source`)."""
    real = _realpath(path)
    return digest(_source_text(real, os.stat(real).st_mtime_ns).encode("utf-8"))


@lru_cache(maxsize=None)
def _source_text(path: str, _mtime_ns: int) -> str:
    with open(path, "rb") as fh:
        return decoded_source(fh.read())


def _index_defs(filename: str) -> dict:
    """Every function definition in a file, by the line its code object starts on."""
    try:
        real = _realpath(filename)
        text = _source_text(real, os.stat(real).st_mtime_ns)
    except OSError:
        return {}
    imported = _IMPORTED.get(real)
    if imported is not None and digest(text.encode("utf-8")) != imported:
        # The code numba would compile is not the code on disk: keying either one
        # would describe a binary this process cannot build.
        raise KeyingError(f"{filename} changed after this process imported it; run again "
                          "in a new process (or Project.load() in a fresh interpreter)")
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return {}
    index: dict = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # A decorated function's code starts at its first decorator.
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            index.setdefault(first, []).append(node)
    return index
