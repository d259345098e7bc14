"""What a full run read besides its modules' sources: the environment variables it asked
for, the files it opened for reading and the folders it listed.

Module-level code can read anything at import (`SCALE = float(os.environ["SCALE"])`,
`TABLE = np.load("table.npy")`, `glob` over a data folder), and a key computed from such a
value is only as current as what was read. A `ReadRecorder` is running from the start of
the command until its journal is written: an audit hook (PEP 578) sees every `open` for
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
import stat as _stat
import sys
import time

from ..environ import WatchedEnviron, stand_in_supports
from ..keying.encode import digest

# Environment variables read by C code or by the toolchain's set-up (which library is
# loaded, numba's settings): journaled as a whole, by these prefixes and names.
WATCHED_PREFIXES = ("NUMBA_", "CUDA_", "NVVM", "NVJITLINK", "NVRTC")
WATCHED_NAMES = frozenset({"LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PYTHONHOME",
                           "PYTHONOPTIMIZE", "PYTHONSAFEPATH", "PYTHONNOUSERSITE",
                           "PYTHONUSERBASE", "PYTHONPLATLIBDIR"})

_ACTIVE: ReadRecorder | None = None
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


class ReadRecorder:
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
        self.absent: set = set()  # absolute paths the program stat'ed and found absent
        # What the program did that no journal can check again (a subprocess, a scan of the
        # whole environment, a C library loaded): description -> None, in the order seen.
        self.unseen: dict = {}
        self._environ = None
        self._environb = None
        self._stats = None

    def start(self) -> ReadRecorder:
        global _ACTIVE
        self.started_ns = time.time_ns()
        self.clean = not any(name == "numba" or name.startswith("numba.")
                             for name in sys.modules.copy())
        self.watched = watched_environment()
        _install_hook()
        self._environ = os.environ
        os.environ = _RecordingEnviron(self._environ, self)
        self._environb = getattr(os, "environb", None)
        if self._environb is not None:
            os.environb = _RecordingEnvironb(self._environb, self)
        self._stats = (os.stat, os.lstat)
        os.stat, os.lstat = _recording_stat(os.stat, self), _recording_stat(os.lstat, self)
        stand_in_supports(self._stats, (os.stat, os.lstat))
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
        if self._environb is not None and isinstance(os.environb, _RecordingEnvironb) \
                and os.environb.recorder is self:
            os.environb = self._environb
        self._environb = None
        if self._stats is not None and getattr(os.stat, "recorder", None) is self:
            stand_in_supports((os.stat, os.lstat), self._stats)
            os.stat, os.lstat = self._stats
        self._stats = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def read_env(self, name, value) -> None:
        if isinstance(name, str) and name not in self.env:
            self.env[name] = value

    def not_seen(self, what: str) -> None:
        """The program did something whose result the journal cannot check again."""
        if len(self.unseen) < 8:
            self.unseen.setdefault(what, None)

    def stat(self, path, found) -> None:
        """The program stat'ed `path` (`os.path.exists`, `getsize`, `isfile`, ...): a file
        is an input by its identity, a folder by its names, an absent path must stay so."""
        if isinstance(path, int) or not isinstance(path, (str, bytes, os.PathLike)):
            return
        where = os.path.abspath(os.fsdecode(path))
        if found is None:
            self.absent.add(where)
        elif _stat.S_ISDIR(found.st_mode):
            self.listed[where] = combined(self.listed.get(where), "program")
        elif _stat.S_ISREG(found.st_mode) and where not in self.opened:
            self.opened[where] = _identity_now(where)


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
    elif event in _UNSEEN_EVENTS:
        if by_program(sys._getframe(1)):
            recorder.not_seen(_UNSEEN_EVENTS[event](args))
    elif event in ("os.listdir", "os.scandir"):
        path = args[0]
        frame = sys._getframe(1)
        if isinstance(path, int) or _by_store(frame):
            return
        where = os.path.abspath(os.fsdecode(path) if path else ".")
        recorder.listed[where] = combined(recorder.listed.get(where), _listing_kind(frame))


def _command(args) -> str:
    argv = args[1] if len(args) > 1 else None
    if isinstance(argv, (list, tuple)) and argv:
        argv = argv[0]
    name = os.path.basename(os.fsdecode(argv)) if isinstance(argv, (str, bytes)) else "?"
    return f"ran a subprocess ({name})"


# Audit events whose result the journal cannot check: what a command printed, what a C
# library loaded by the program reads itself.
_UNSEEN_EVENTS = {
    "subprocess.Popen": _command,
    "os.system": lambda args: "ran a shell command (os.system)",
    "os.posix_spawn": lambda args: "spawned a process (os.posix_spawn)",
    "os.spawn": lambda args: "spawned a process (os.spawn*)",
    "os.exec": lambda args: "ran os.exec*",
    "ctypes.dlopen": lambda args: f"loaded a C library ({os.path.basename(str(args[0]))})",
}

# Code whose reads are not the program's: the toolchain's (pinned by its version and
# files, journaled as such) and kbuild's own.
_TOOLCHAIN = frozenset({"kbuild", "numba", "numba_cuda", "numba_cuda_mlir", "llvmlite",
                        "numpy", "cuda", "importlib_metadata"})


def by_program(frame) -> bool:
    """Whether the nearest caller outside the standard library (`os.path.exists` runs in
    `genericpath`, `check_output` in `subprocess`) is the project's or a package of its,
    not the toolchain's or kbuild's."""
    while frame is not None:
        top = str(frame.f_globals.get("__name__", "")).partition(".")[0]
        if top in _TOOLCHAIN:
            return False
        if top not in sys.stdlib_module_names and top not in ("", "__main__"):
            return True
        frame = frame.f_back
    return False


def _recording_stat(original, recorder: ReadRecorder):
    def stat(path, *args, **kwargs):
        try:
            found = original(path, *args, **kwargs)
        except OSError:
            if by_program(sys._getframe(1)):
                recorder.stat(path, None)
            raise
        if by_program(sys._getframe(1)):
            recorder.stat(path, found)
        return found

    stat.recorder = recorder
    return stat


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


class _ScanNotSeen:
    """A scan of the whole environment (iterating, keys, items, values, copy) by the
    program: something the journal cannot check (`scanned_name` says which mapping)."""

    scanned_name = ""

    def scanned(self) -> None:
        if by_program(sys._getframe(2)):
            self.recorder.not_seen(f"scanned the whole environment ({self.scanned_name})")


class _RecordingEnviron(_ScanNotSeen, WatchedEnviron):
    """`os.environ`, noting each variable read by name (scans and copies read no one
    variable: the watched ones are journaled as a whole)."""

    def __init__(self, environ, recorder: ReadRecorder):
        super().__init__(environ)
        self.recorder = recorder

    def read(self, name) -> None:
        if name not in self.recorder.env:
            self.recorder.read_env(name, self._environ.get(name))

    # The value before this process set it is what the next one sees.
    written = read

    scanned_name = "os.environ"


class _RecordingEnvironb(_ScanNotSeen, WatchedEnviron):
    """`os.environb`: a variable read by name is noted as `os.environ`'s are; a scan is
    something the journal cannot check."""

    def __init__(self, environb, recorder: ReadRecorder):
        super().__init__(environb)
        self.recorder = recorder

    def read(self, name) -> None:
        if by_program(sys._getframe(2)):
            text = os.fsdecode(name) if isinstance(name, (bytes, str)) else None
            if text is not None and text not in self.recorder.env:
                value = self._environ.get(os.fsencode(text))
                self.recorder.read_env(text, None if value is None else os.fsdecode(value))

    written = read

    scanned_name = "os.environb"
