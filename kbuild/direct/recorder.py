"""What a full run read besides its modules' sources: the environment variables it asked
for, the files it opened for reading and the folders it listed.

Module-level code can read anything at import (`SCALE = float(os.environ["SCALE"])`,
`TABLE = np.load("table.npy")`, `glob` over a data folder), and a key computed from such a
value is only as current as what was read. A `Recorder` is running from the start of the
command until its journal is written: an audit hook (PEP 578) sees every `open` for
reading and every `os.listdir` / `os.scandir`, and `os.environ` is replaced by a mapping
that notes each variable read by name (and every module compiled from its source is
noted with the digest of the bytes compiled) with the value it had before this process changed
it. What C code reads itself (`getenv`, `fopen` in an extension) is not seen: the
variables that decide which compiler libraries load are watched as a whole instead
(`WATCHED_ENV`), and the libraries themselves are journaled as files.

Audit hooks cannot be removed: the hook stays, idle, after the recorder stops (and in
forked workers, where it is switched off).
"""

from __future__ import annotations

import os
import sys
import time

from ..environ import WatchedEnviron
from ..keying.encode import digest

# Environment variables read by C code or by the toolchain's set-up (which library is
# loaded, numba's settings): journaled as a whole, by these prefixes and names.
WATCHED_PREFIXES = ("NUMBA_", "CUDA_", "NVVM", "NVJITLINK", "NVRTC")
WATCHED_NAMES = frozenset({"LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PYTHONHOME",
                           "PYTHONOPTIMIZE", "PYTHONSAFEPATH", "PYTHONNOUSERSITE",
                           "PYTHONUSERBASE", "PYTHONPLATLIBDIR"})

_ACTIVE: Recorder | None = None
_HOOKED = False
_IMPORT_FRAMES = frozenset({"<frozen importlib._bootstrap_external>",
                            "<frozen importlib._bootstrap>"})
# Reads by kbuild's store (entries, blobs, keying facts, locks, mostly through folder
# descriptors and relative names) are the ledger's business, not inputs.
_STORE_MODULE = "kbuild.store."
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def watched(name: str) -> bool:
    return name in WATCHED_NAMES or name.startswith(WATCHED_PREFIXES)


def watched_environment(environ=None) -> dict:
    """The watched variables now (the process's starting values when called first)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if watched(k)}


class Recorder:
    """What this process reads, from `start()` to `stop()`.

    `clean` says whether the run can be journaled at all: nothing of numba was imported
    before the recorder started (its import-time reads would not be seen).
    """

    def __init__(self):
        self.started_ns = 0
        self.clean = False
        self.env: dict = {}  # name -> value before this process changed it (None: unset)
        self.watched: dict = {}  # the watched variables when recording started
        # absolute path opened for reading -> (its identity then, when: ns), first open
        self.opened: dict = {}
        self.listed: dict = {}  # absolute folder -> "import" (the import system) or "program"
        self.compiled: dict = {}  # absolute path -> digest of the source bytes compiled from it
        self._environ = None

    def start(self) -> Recorder:
        global _ACTIVE
        self.started_ns = time.time_ns()
        self.clean = not any(name == "numba" or name.startswith("numba.")
                             for name in sys.modules)
        self.watched = watched_environment()
        _install_hook()
        self._environ = os.environ
        os.environ = _RecordingEnviron(self._environ, self)
        _ACTIVE = self
        return self

    def stop(self) -> None:
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        if self._environ is not None and isinstance(os.environ, _RecordingEnviron) \
                and os.environ.recorder is self:
            os.environ = self._environ
        self._environ = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def read_env(self, name, value) -> None:
        if isinstance(name, str) and name not in self.env:
            self.env[name] = value


def _install_hook() -> None:
    global _HOOKED
    if not _HOOKED:
        sys.addaudithook(_audit)
        os.register_at_fork(after_in_child=_forget_in_child)
        _HOOKED = True


def _forget_in_child() -> None:
    global _ACTIVE
    _ACTIVE = None  # a worker's reads are its compile's (observed there), not the journal's


def _audit(event: str, args) -> None:
    recorder = _ACTIVE
    if recorder is None:
        return
    if event == "open":
        path, mode, flags = args
        if mode is None and flags & _DIRECTORY:
            return  # a folder opened to walk through it (the store's reads): no input
        if _reads(mode, flags) and isinstance(path, (str, bytes)) and path \
                and not _by_store(sys._getframe(1)):
            where = os.path.abspath(os.fsdecode(path))
            if where not in recorder.opened and not where.endswith(".pyc"):
                recorder.opened[where] = _identity_now(where)
    elif event == "compile":
        # A module compiled from its source: the bytes used are known exactly.
        source, filename = args
        if isinstance(source, bytes) and isinstance(filename, str) and filename.endswith(".py"):
            recorder.compiled.setdefault(os.path.abspath(filename), digest(source))
    elif event in ("os.listdir", "os.scandir"):
        path = args[0]
        frame = sys._getframe(1)
        if isinstance(path, int) or _by_store(frame):
            return
        where = os.path.abspath(os.fsdecode(path) if path else ".")
        recorder.listed[where] = combined(recorder.listed.get(where), _listing_kind(frame))


def combined(kind: str | None, other: str) -> str:
    """The kind of a folder listed for both reasons: "program" takes every name; the
    import system's and importlib.metadata's filters add up ("import+metadata")."""
    if kind is None or kind == other:
        return other
    if "program" in (kind, other):
        return "program"
    return "+".join(sorted(set(kind.split("+")) | set(other.split("+"))))


def _by_store(frame) -> bool:
    return str(frame.f_globals.get("__name__", "")).startswith(_STORE_MODULE)


def _listing_kind(frame) -> str:
    """Why a folder was listed: "import" (the import system looking for a module: the
    names a module can be imported from matter), "metadata" (`importlib.metadata`
    looking for a distribution: `*.dist-info`, `*.egg-info`), else "program" (every name)."""
    if frame.f_code.co_filename in _IMPORT_FRAMES:
        return "import"
    if str(frame.f_globals.get("__name__", "")).startswith("importlib.metadata"):
        return "metadata"
    return "program"


def _identity_now(path: str):
    """(the file's identity, the time) as it is opened; (None, time) when it cannot be
    stat'ed (the open fails too, or it is no file: not an input either way)."""
    at = time.time_ns()
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None, at
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns], at


def _reads(mode, flags) -> bool:
    if isinstance(mode, str):
        return not any(c in mode for c in "wax+")
    return isinstance(flags, int) and flags & os.O_ACCMODE == os.O_RDONLY


_UNSET = object()


class _RecordingEnviron(WatchedEnviron):
    """`os.environ`, noting each variable read by name (scans and copies read no one
    variable: the watched ones are journaled as a whole)."""

    def __init__(self, environ, recorder: Recorder):
        super().__init__(environ)
        self.recorder = recorder

    def read(self, name) -> None:
        if name not in self.recorder.env:
            self.recorder.read_env(name, self._environ.get(name))

    # The value before this process set it is what the next one sees.
    written = read
