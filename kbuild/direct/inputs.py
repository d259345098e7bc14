"""The inputs section of a journal: everything a full keying read, taken after the run
(`snapshot`) and checked again by a later one (`check`).

- the interpreter (version, executable, the flags that change bytecode or imports), the
  working directory and `sys.path`, `sys.meta_path` and `sys.path_hooks` as the command
  found them;
- every environment variable read by name, and the watched ones as a whole
  (`recorder.WATCHED_*`), by digest (values are never written down);
- files: the source of every module imported (kbuild's, numba's, numpy's, the project's),
  every file opened for reading, every shared library mapped, the project file, and the
  files the compiles were observed to read; each with its identity (`store.tree.identity`)
  and, up to `HASHED_BYTES`, the digest of its bytes;
- folders: every folder the import system or the program listed (a new `foo.py` earlier
  on the path would shadow a module), with a digest of the names that matter;
- paths that were absent and must stay so (a `sys.path` entry not made yet, numba's
  `.numba_config.yaml`).

Paths under the project's folder are written relative to it (`@/lab/mathx.py`), so a
checkout restored elsewhere with its store still finds its journal valid.

A file is trusted by its identity alone unless it is racy: changed within one tick of
the file system's clock (`tick`) before the journal was written, so that a later change
in the same tick could leave its identity as it was (git's rule; the reference is the
journal file's own mtime, the same clock that stamps the files). A racy file, or one
whose identity changed, is read and its digest compared: the same bytes are no change
(a touch, a copy), and the journal is refreshed with the new identity.

The same rule decides what a run may journal at all: a file whose bytes the run used
are not known exactly must have the identity it had when the run opened it (its
identity is taken at that moment), and must not have been changed within a tick of that.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
from dataclasses import dataclass, field

from ..keying.encode import digest
from ..store.tree import identity
from .recorder import ReadRecorder, combined, watched_environment

# How far apart two changes of a file may be and still get one time stamp: the kernel
# stamps files from a clock that moves in ticks (1-10 ms); a file system that keeps only
# seconds (FAT: 2 s; some network file systems) shows it in its stamps.
FINE_TICK_NS = 50_000_000
COARSE_TICK_NS = 2_000_000_000
HASHED_BYTES = 4 << 20  # larger files (shared libraries) are trusted by identity only
# numba reads its settings from this file in the working directory, if it exists (its
# absence is checked with a stat, which no audit hook sees).
PROBED = (".numba_config.yaml",)
_SKIPPED = ("/proc/", "/sys/", "/dev/")
_IMPORTABLE = tuple(importlib.machinery.all_suffixes())
_DISTRIBUTIONS = (".dist-info", ".egg-info", ".egg-link", ".pth")


class Unjournalable(Exception):
    """Why this run cannot be journaled (something changed while it ran)."""


@dataclass
class Paths:
    """Absolute paths <-> journal paths, relative to the project folder where under it."""

    root: str

    def rel(self, path: str) -> str:
        if path == self.root:
            return "@"
        if path.startswith(self.root + os.sep):
            return "@/" + path[len(self.root) + 1:]
        return path

    def abs(self, path: str) -> str:
        if path == "@":
            return self.root
        if path.startswith("@/"):
            return os.path.join(self.root, path[2:])
        return path


def start_state(recorder: ReadRecorder, paths: Paths) -> dict:
    """What the command found before it imported anything of the project's: compared
    whole with what the next command finds at the same point."""
    return {"python": _python(), "cwd": paths.rel(os.getcwd()),
            "sys_path": [paths.rel(os.path.abspath(p) if p else os.getcwd()) for p in sys.path],
            "meta_path": [_type_name(f) for f in sys.meta_path],
            "path_hooks": [_type_name(h) for h in sys.path_hooks],
            "watched": _env_digest(recorder.watched)}


def snapshot(recorder: ReadRecorder, paths: Paths, state: dict, *, exact: dict,
             skip: tuple, previous: dict | None = None, previous_mtime: int = 0) -> dict:
    """The inputs of a run that `recorder` recorded (stopped), `state` being its
    `start_state`. `exact`: absolute path -> digest of the bytes the run used, checked
    against the file now (a module source edited during the run is no input of it);
    `skip`: folders whose files are not inputs (the store). Unjournalable when a file
    changed while the run went on. `previous` (an earlier journal's inputs, written at
    `previous_mtime`): digests of unchanged files are taken from it, not computed again."""
    files, absent = {}, set()
    known = (previous or {}).get("files", {})
    for path in sorted(_input_files(recorder, skip) | set(exact)):
        try:
            info = os.stat(path)
        except OSError:
            absent.add(paths.rel(path))  # read, then removed by the run: it must stay so
            continue
        rel, now = paths.rel(path), identity(info)
        old = known.get(rel)
        if path not in exact:
            _unchanged_since_read(path, now, recorder)
            if old and old[:5] == now and not racy(old, previous_mtime):
                files[rel] = old
                continue
        files[rel] = _file_record(path, exact.get(path))
    dirs = {}
    for path, kind in sorted(_listed(recorder, skip).items()):
        names = _names(path, kind)
        if names is None:
            absent.add(paths.rel(path))
            continue
        dirs[paths.rel(path)] = identity(os.stat(path)) + [kind, names]
    for probe in PROBED:
        if not os.path.exists(probe):
            absent.add(paths.rel(os.path.abspath(probe)))
    absent.update(paths.rel(p) for p in _absent_import_paths())
    # Paths the program stat'ed and found absent (`os.path.exists("fast.flag")`).
    absent.update(paths.rel(p) for p in recorder.absent
                  if _kept(p, skip) and not os.path.lexists(p))
    return {**state, "env": {name: _value_digest(value) for name, value in
                             sorted(recorder.env.items())},
            "files": files, "dirs": dirs, "absent": sorted(absent - set(dirs) - set(files))}


def _unchanged_since_read(path: str, now: list, recorder: ReadRecorder) -> None:
    """Unjournalable unless the file is as the run found it: a file the run opened has
    the identity it had then and had not just been changed (within a tick: a change
    after the open could have kept that identity); any other (a module loaded from its
    bytecode, a library) was not changed since a tick before the run began."""
    opened = recorder.opened.get(path)
    if opened is not None:
        then, at_ns = opened
        if then != now or racy(then, at_ns):
            raise Unjournalable(f"{path} changed while the run read it")
    elif racy(now, recorder.started_ns):
        raise Unjournalable(f"{path} changed while the run read it")


def _file_record(path: str, used: str | None) -> list:
    """[identity..., digest or None] of a file, read once; `used` (the digest of the bytes
    the run used) must be what it holds now."""
    with open(path, "rb") as fh:
        info = os.fstat(fh.fileno())
        if info.st_size > HASHED_BYTES and used is None:
            return identity(info) + [None]
        data = fh.read()
    found = digest(data)
    if used is not None and found != used:
        raise Unjournalable(f"{path} changed after the run read it")
    return identity(info) + [found]


def _input_files(recorder: ReadRecorder, skip: tuple) -> set:
    found = set(recorder.opened)
    for module in sys.modules.copy().values():
        path = getattr(module, "__file__", None)
        if isinstance(path, str):
            found.add(os.path.abspath(path))
    found.update(_mapped_files())
    found.add(os.path.realpath(sys.executable))
    return {p for p in found if _kept(p, skip) and not _bytecode(p)}


def _kept(path: str, skip: tuple) -> bool:
    return not path.startswith(_SKIPPED) and not any(
        path == s or path.startswith(s + os.sep) for s in skip)


def _bytecode(path: str) -> bool:
    # A .pyc is checked by Python against its source, which is journaled.
    return path.endswith(".pyc") and f"{os.sep}__pycache__{os.sep}" in path


def _mapped_files() -> set:
    """The files this process has mapped: the interpreter, its extensions, and the
    compiler libraries (NVVM, nvJitLink) whose versions are in every key."""
    found = set()
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/") \
                        and not parts[5].rstrip().endswith("(deleted)"):
                    found.add(parts[5].rstrip("\n"))
    except OSError:
        pass
    return found


def _listed(recorder: ReadRecorder, skip: tuple) -> dict:
    """Folder -> how its names matter: every folder the import system has a finder for
    (listed before the recorder started, too) and every folder the run listed."""
    found = {}
    for path, finder in list(sys.path_importer_cache.items()):
        if isinstance(finder, importlib.machinery.FileFinder):
            found[os.path.abspath(finder.path or ".")] = "import"
    for path, kind in recorder.listed.items():
        found[path] = combined(found.get(path), kind)
    return {p: k for p, k in found.items() if _kept(p, skip)}


def _absent_import_paths() -> list:
    """`sys.path` entries where there was nothing to import from (a folder made later
    could shadow what was imported from a later one)."""
    return [os.path.abspath(p or ".") for p, finder in list(sys.path_importer_cache.items())
            if finder is None and isinstance(p, str) and not os.path.exists(p or ".")]


def _names(path: str, kind: str) -> str | None:
    """The digest of what matters in a folder's listing: for the import system, the
    names a module could be imported from (an editor's `.x.py.swp` is none); for a
    program, every name; for importlib.metadata, distributions. None when it is no
    folder now."""
    try:
        with os.scandir(path) as entries:
            if kind == "program":
                names = sorted(e.name for e in entries)
            else:
                kinds = kind.split("+")
                names = sorted(e.name for e in entries if ("import" in kinds and _importable(e))
                               or ("metadata" in kinds and e.name.endswith(_DISTRIBUTIONS)))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return digest("\0".join(names).encode("utf-8", "surrogateescape"))


def _importable(entry) -> bool:
    stem = entry.name.partition(".")[0]
    if not stem.isidentifier() or entry.name == "__pycache__":
        return False
    if entry.name.endswith(_IMPORTABLE) or entry.name.endswith(".pth"):
        return True
    try:
        return entry.is_dir()
    except OSError:
        return False


def tick(record) -> int:
    """The clock tick of the file system that stamped `record` (an identity): a file
    system that keeps whole seconds shows it in both stamps."""
    whole = record[3] % 1_000_000_000 == 0 and record[4] % 1_000_000_000 == 0
    return COARSE_TICK_NS if whole else FINE_TICK_NS


def racy(record, reference_ns: int) -> bool:
    """Whether a recorded identity was changed too shortly before `reference_ns` (when it
    was taken: the journal's own mtime, or when the run opened the file) for a later
    change to be sure to show in it."""
    return max(record[3], record[4]) >= reference_ns - tick(record)


def _python() -> dict:
    flags = sys.flags
    return {"version": sys.version, "executable": os.path.realpath(sys.executable),
            "prefix": sys.prefix, "cache_tag": sys.implementation.cache_tag,
            "flags": [flags.optimize, flags.isolated, flags.no_site, flags.no_user_site,
                      flags.ignore_environment,
                      int(getattr(flags, "safe_path", False))]}  # -P: 3.11+


def _type_name(obj) -> str:
    """`module.qualname` of a finder or hook (a class, a function, or an instance)."""
    named = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(named, '__module__', '?')}.{named.__qualname__}"


def _env_digest(values: dict) -> str:
    return digest(json.dumps(sorted(values.items())).encode("utf-8", "surrogateescape"))


def _value_digest(value) -> str | None:
    return None if value is None else digest(str(value).encode("utf-8", "surrogateescape"))


# -- checking ---------------------------------------------------------------------------------

@dataclass
class Check:
    """A journal's inputs checked against this process and the file system now: `changed`
    names the first difference (None: none); `refreshed` holds new identities of files
    and folders whose content was found the same (a touch, a copy), for the journal to
    be written again with them."""

    paths: Paths
    reference_ns: int  # the journal file's mtime
    changed: str | None = None
    refreshed: dict = field(default_factory=lambda: {"files": {}, "dirs": {}})

    def run(self, inputs: dict, recorder_state: dict) -> Check:
        for what in (self._state, self._env, self._absent, self._files, self._dirs):
            reason = what(inputs, recorder_state)
            if reason:
                self.changed = reason
                break
        return self

    def _state(self, inputs, state) -> str | None:
        for name in ("python", "cwd", "sys_path", "meta_path", "path_hooks"):
            if inputs.get(name) != state[name]:
                return {"python": "the Python interpreter changed",
                        "cwd": "the working directory is another",
                        "sys_path": "sys.path changed (PYTHONPATH?)",
                        "meta_path": "the import system's finders changed",
                        "path_hooks": "the import system's path hooks changed"}[name]
        if inputs.get("watched") != state["watched"]:
            return "a NUMBA_*, CUDA_* or library path variable changed"
        return None

    def _env(self, inputs, state) -> str | None:
        environ = os.environ
        for name, value in inputs["env"].items():
            if _value_digest(environ.get(name)) != value:
                return f"environment variable {name} changed"
        return None

    def _absent(self, inputs, state) -> str | None:
        for path in inputs["absent"]:
            if os.path.exists(self.paths.abs(path)):
                return f"{self._show(path)} appeared"
        return None

    def _files(self, inputs, state) -> str | None:
        for rel, record in inputs["files"].items():
            path = self.paths.abs(rel)
            try:
                info = os.stat(path)
            except OSError:
                return f"{self._show(rel)} is gone"
            if identity(info) == record[:5] and not racy(record, self.reference_ns):
                continue
            now = _same_bytes(path, record[5])
            if now is None:
                return f"{self._show(rel)} changed"
            self.refreshed["files"][rel] = now + [record[5]]
        return None

    def _dirs(self, inputs, state) -> str | None:
        for rel, record in inputs["dirs"].items():
            path = self.paths.abs(rel)
            try:
                info = os.stat(path)
            except OSError:
                return f"folder {self._show(rel)} is gone"
            if identity(info) == record[:5] and not racy(record, self.reference_ns):
                continue
            if _names(path, record[5]) != record[6]:
                return f"a file was added to or removed from {self._show(rel)}"
            self.refreshed["dirs"][rel] = identity(info) + record[5:]
        return None

    def _show(self, rel: str) -> str:
        return rel[2:] if rel.startswith("@/") else "the project's folder" if rel == "@" else rel


def _same_bytes(path: str, expected: str | None):
    """The identity of `path` if its bytes digest to `expected`, else None."""
    if expected is None:
        return None
    try:
        with open(path, "rb") as fh:
            info = os.fstat(fh.fileno())
            if info.st_size > HASHED_BYTES:
                return None
            data = fh.read()
    except OSError:
        return None
    return identity(info) if digest(data) == expected else None


def refreshed(inputs: dict, check: Check) -> dict:
    """`inputs` with the identities `check` found for unchanged content."""
    return {**inputs, "files": {**inputs["files"], **check.refreshed["files"]},
            "dirs": {**inputs["dirs"], **check.refreshed["dirs"]}}


__all__ = ["Check", "Paths", "Unjournalable", "racy", "refreshed", "snapshot",
           "start_state", "watched_environment"]
