"""What compile-time Python asks the operating system, however it asks it.

An `@overload`, an `@intrinsic`'s code generator, a typing or lowering function (and
anything they call, a library included) may decide what numba compiles from the
system: a file read through `open`, `pathlib`, `os.open` or numpy; a path tested with
`os.path.exists`/`isfile`/`getsize`; a folder listed (`os.listdir`, `os.scandir`, `glob`,
`os.walk`); a database sqlite opens; or something whose result no key can hold (a
subprocess's output, a shell command, a C library loaded with `ctypes`, a socket).
Python reports each of these as an audit event (PEP 578), whoever makes the call;
`stat` has no event, so `os.stat`/`os.lstat` are stood in for while a compile runs, and
so is multiprocessing's way of starting a process (`os.fork` has an event). A thread
that compiling code starts (a `Thread`, a thread pool made while it compiles) observes
for that compile until it ends, and so does work it hands a thread pool made earlier
(`ThreadPoolExecutor.submit` or `map`, `asyncio.to_thread`) while that work runs. Another
thread of the program (a server's, a scheduler's heartbeat) is no part of the compile:
what it does meanwhile is not observed. Work handed over by other means (a queue a
long-lived thread of the project's reads) is not followed.

Whose call it is decides whether it is observed: walking out from the call, frames of
the standard library, of pinned libraries (numpy) and of installed packages that do not
build on numba (cffi, a parser) are go-betweens; the first other frame decides. The
project's code, or an installed numba extension's (its overloads, typing and lowering
read what the project's would: not a module body running at its import, whose results
are observed by value) asks: observed. numba's, kbuild's, or the import system's while
it finds or loads a module, are the toolchain's: not observed (a loader handing the
project a package's data file is a go-between). A command run or a C library loaded by
an installed package, a numba extension's too, is its installation's, pinned with it:
only the project's own fail its target.

The audit hook is added once and stays (hooks cannot be removed); outside a compile,
and in threads that are not compiling, it returns at its first test.
"""

from __future__ import annotations

import contextlib
import os
import stat as _stat
import sys
import threading
from concurrent.futures import ThreadPoolExecutor as _POOL

from ..environ import stand_in_supports
from ..keying.observed import Kind
from .libraries import is_library, namespace_module

# The toolchain's own code: what it reads is pinned by its versions and files.
_TOOLCHAIN = frozenset({"kbuild", "numba", "numba_cuda", "numba_cuda_mlir", "llvmlite", "cuda"})
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# The import statement's machinery (the frozen core, under either name): every import,
# `importlib.import_module` and `find_spec` pass through it. The loaders beside it
# (`importlib._bootstrap_external`, `zipimport`) are go-betweens like the rest of the
# standard library: `pkgutil.get_data` or `importlib.resources` asking a loader for a
# package's data file is the project's read, found by walking on.
_IMPORTING = frozenset({"importlib._bootstrap", "_frozen_importlib"})

# thread ident -> the observers of the compiles running in it (innermost last)
_WATCHING: dict = {}
_STANDING: list = []  # the originals of what is stood in for while any compile runs
_HOOKED = False
_LOCK = threading.Lock()

try:  # where processes are started without an audit event (POSIX only)
    import _posixsubprocess as _FORK_EXEC
except ImportError:  # pragma: no cover - Windows
    _FORK_EXEC = None


def asked_by_project(frame, go_between) -> bool:
    """Whether the call `frame` made is the project's: the first frame, walking out, that
    is not the standard library's, a pinned library's or a go-between installed package's
    (`go_between(frame)`) is the project's code, and no module body at its import."""
    while frame is not None:
        name = frame.f_globals.get("__name__")
        top = name.partition(".")[0] if isinstance(name, str) else ""
        if top in _TOOLCHAIN or name in _IMPORTING:
            return False  # the toolchain's, or the import system finding or loading a module
        if not (is_library(name) or go_between(frame)):
            return not importing(frame)
        frame = frame.f_back
    return False


def importing(frame) -> bool:
    """Whether `frame` runs a module's body at its import (or reload): what it reads
    becomes the module's values, which are observed as the project's code reads them.
    Code that `exec` and `eval` run is named `<module>` too, but runs in a module that is
    done importing or in a namespace of its own; so does a file `runpy` runs (`run_path`,
    `run_module`), in a stand-in module without a spec or a dict no module keeps: what it
    reads is what the caller gets back, and is observed."""
    code = frame.f_code
    if code.co_name != "<module>":
        return False
    scope = frame.f_globals
    spec = scope.get("__spec__")
    if getattr(spec, "_initializing", False):
        return True
    # A reload runs the body again in the module's own namespace, with its spec.
    return spec is not None and code.co_filename == scope.get("__file__") and \
        namespace_module(scope) is not None


class _Watch:
    """One compile's observing: its observer, whose installed code the walk passes for a
    read (`bystander`) and for a command (`installed`), and whether it still runs."""

    __slots__ = ("observer", "bystander", "installed", "running")

    def __init__(self, observer, bystander, installed):
        self.observer, self.bystander, self.installed = observer, bystander, installed
        self.running = True


@contextlib.contextmanager
def watching(observer, bystander, installed):
    """Within the block, the compiling thread's calls to the system are observed, and those
    of the threads it starts (a `threading.Thread`, a thread pool or `asyncio.to_thread`
    made while it compiles): a read when the project asked for it, walking past
    `bystander(frame)` installed code; a command, a process or a C library when the
    project's own code started it, walking past all `installed(frame)` code."""
    _install()
    watch = _Watch(observer, bystander, installed)
    me = threading.get_ident()
    _enter(me, watch)
    try:
        yield
    finally:
        watch.running = False
        with _LOCK:
            for ident in list(_WATCHING):  # its threads' too: they observe no more
                _leave(ident, watch)


def observes(observer) -> bool:
    """Whether this thread observes for `observer`'s compile: the thread that compiles, or
    one it started while it compiles. What any other thread of the program does meanwhile
    (a server's, a scheduler's heartbeat) is no input of the compile."""
    return any(watch.observer is observer and watch.running
               for watch in _WATCHING.get(threading.get_ident(), ()))


def _enter(ident, watch) -> bool:
    """`watch` on `ident`'s list (once); whether it was not on it before."""
    with _LOCK:
        if not _WATCHING:
            _STANDING.append(_stand_in())
        found = _WATCHING.setdefault(ident, [])
        if watch in found:
            return False
        found.append(watch)
        return True


def _leave(ident, watch) -> None:
    """`watch` off `ident`'s list, under the lock; the stand-ins put back after the last."""
    found = _WATCHING.get(ident, [])
    if watch in found:
        found.remove(watch)
        if not found:
            del _WATCHING[ident]
        if not _WATCHING:
            _put_back(_STANDING.pop())


def _stand_in() -> tuple:
    """Stand in, while any compile runs, for what no audit event reports: `os.stat` and
    `os.lstat`; `threading.Thread.start` (a thread started by a compiling thread observes
    for its compile); and `_posixsubprocess.fork_exec` (multiprocessing's spawn and
    forkserver start processes through it, unaudited). Returns the originals."""
    originals = (os.stat, os.lstat, threading.Thread.start, _FORK_EXEC and _FORK_EXEC.fork_exec,
                 _POOL.submit)
    os.stat, os.lstat = _recording_stat(os.stat), _recording_stat(os.lstat)
    stand_in_supports(originals[:2], (os.stat, os.lstat))
    threading.Thread.start = _inheriting_start(originals[2])
    if _FORK_EXEC is not None:
        _FORK_EXEC.fork_exec = _recording_fork_exec(originals[3])
    _POOL.submit = _handing_submit(originals[4])
    return originals


def _put_back(originals: tuple) -> None:
    stand_in_supports((os.stat, os.lstat), originals[:2])
    os.stat, os.lstat, threading.Thread.start = originals[:3]
    if _FORK_EXEC is not None:
        _FORK_EXEC.fork_exec = originals[3]
    _POOL.submit = originals[4]


def _observed_by(watch, run):
    """`run`, observing for `watch`'s compile in whichever thread runs it (while it runs)."""
    def observed(*args, **kwargs):
        me = threading.get_ident()
        entered = watch.running and _enter(me, watch)
        try:
            return run(*args, **kwargs)
        finally:
            if entered:
                with _LOCK:
                    _leave(me, watch)

    return observed


def _inheriting_start(original):
    def start(self, *args, **kwargs):
        watch = _current() if _WATCHING else None
        if watch is not None:
            self.run = _observed_by(watch, self.run)
        return original(self, *args, **kwargs)

    return start


def _handing_submit(original):
    def submit(self, fn, /, *args, **kwargs):
        watch = _current() if _WATCHING else None
        if watch is not None:
            fn = _observed_by(watch, fn)
        return original(self, fn, *args, **kwargs)

    return submit


def _recording_fork_exec(original):
    def fork_exec(*args, **kwargs):
        watch = _current() if _WATCHING else None
        caller = sys._getframe(1)
        # subprocess.Popen's own call is reported by its audit event.
        if watch is not None and caller.f_globals.get("__name__") != "subprocess" and \
                asked_by_project(caller, watch.installed):
            watch.observer.add(Kind.UNSEEN, "started a process (multiprocessing)")
        return original(*args, **kwargs)

    return fork_exec


def _install() -> None:
    global _HOOKED
    with _LOCK:
        if not _HOOKED:
            sys.addaudithook(_audit)
            _HOOKED = True


def _current():
    """The innermost running compile observing this thread, or None."""
    for watch in reversed(_WATCHING.get(threading.get_ident(), ())):
        if watch.running:
            return watch
    return None


def _audit(event: str, args) -> None:
    if not _WATCHING:
        return
    handler = _EVENTS.get(event)
    if handler is None:
        return
    watch = _current()
    if watch is None:
        return
    observer = watch.observer
    try:
        if asked_by_project(sys._getframe(1),
                            watch.bystander if handler in _FILE_EVENTS else watch.installed):
            handler(observer, args)
    except Exception as exc:  # noqa: BLE001 - never break the program's own call
        observer.add(Kind.UNSEEN, f"{event} (kbuild could not observe it: "
                                  f"{type(exc).__name__})")


def _opened(observer, args) -> None:
    path, mode, flags = args
    if isinstance(path, int) or not path:
        return
    if mode is None and isinstance(flags, int) and flags & _DIRECTORY:
        return  # a folder opened to walk through it: its listing is the input
    if isinstance(mode, str):
        reading = not any(c in mode for c in "wax+")
    else:
        reading = isinstance(flags, int) and flags & os.O_ACCMODE == os.O_RDONLY
    if reading:
        observer.file(os.fsdecode(path), Kind.FILE)
    else:
        observer.made(path)


def _database(observer, args) -> None:
    """sqlite reads its database file itself, in C: the file is read, by its bytes as the
    compile leaves it (an in-memory or URI database is no file to name)."""
    path = args[0] if args else None
    if isinstance(path, (str, bytes, os.PathLike)):
        name = os.fsdecode(path)
        if name and name != ":memory:" and not name.startswith("file:"):
            observer.file(name, Kind.FILE)


def _made(observer, args) -> None:
    if args and not isinstance(args[0], int):
        observer.made(args[0])


def _renamed(observer, args) -> None:
    if len(args) > 1 and not isinstance(args[1], int):
        observer.made(args[1])


def _listed(observer, args) -> None:
    path = args[0] if args else None
    if isinstance(path, int):
        return
    observer.file(os.fsdecode(path) if path else ".", Kind.LISTING)


def _command(args) -> str:
    argv = args[1] if len(args) > 1 else None
    if isinstance(argv, (list, tuple)) and argv:
        argv = argv[0]
    if isinstance(argv, (str, bytes, os.PathLike)):
        return os.path.basename(os.fsdecode(argv).split()[0]) if os.fsdecode(argv).strip() \
            else "?"
    return "?"


def _address(args) -> str:
    address = args[1] if len(args) > 1 else None
    if isinstance(address, tuple) and len(address) >= 2:
        return f"a socket ({address[0]}:{address[1]})"
    return "a socket"


def _unseen(describe):
    def handler(observer, args) -> None:
        observer.add(Kind.UNSEEN, describe(args))

    return handler


_EVENTS = {
    "open": _opened,
    "os.listdir": _listed,
    "sqlite3.connect": _database,
    "os.mkdir": _made,
    "os.rename": _renamed,
    "os.scandir": _listed,
    "subprocess.Popen": _unseen(lambda args: f"ran a subprocess ({_command(args)})"),
    "os.system": _unseen(lambda args: "ran a shell command (os.system)"),
    "os.posix_spawn": _unseen(lambda args: "spawned a process (os.posix_spawn)"),
    "os.spawn": _unseen(lambda args: "spawned a process (os.spawn*)"),
    "os.exec": _unseen(lambda args: "ran os.exec*"),
    "os.fork": _unseen(lambda args: "forked a process (os.fork)"),
    "socket.connect": _unseen(lambda args: f"connected to {_address(args)}"),
    "socket.sendto": _unseen(lambda args: f"sent to {_address(args)}"),
    "ctypes.dlopen": _unseen(
        lambda args: f"loaded a C library ({os.path.basename(os.fsdecode(args[0] or '?'))})"),
}


# The file events: a bystander's asking is its caller's (commands: see `watching`).
_FILE_EVENTS = frozenset({_opened, _listed, _database, _made, _renamed})


def _recording_stat(original):
    def stat(path, *args, **kwargs):
        watch = _current() if _WATCHING else None
        if watch is None or isinstance(path, int):
            return original(path, *args, **kwargs)
        if asked_by_project(sys._getframe(1), watch.bystander) and \
                isinstance(path, (str, bytes, os.PathLike)):
            watch.observer.file(os.fsdecode(path), Kind.STAT)
        return original(path, *args, **kwargs)

    stat.original = original
    return stat


def stat_digest_form(path) -> tuple | None:
    """What a stat of `path` tells a program that decides by it: absent (None), a folder,
    or a file by its bytes (its size is theirs; its times are no input of a build)."""
    try:
        found = os.stat(path)
    except (OSError, ValueError):
        return None
    if _stat.S_ISDIR(found.st_mode):
        return ("dir",)
    if _stat.S_ISREG(found.st_mode):
        with open(path, "rb") as fh:
            return ("file", fh.read())
    return ("other", _stat.S_IFMT(found.st_mode))


def listing_form(path) -> tuple | None:
    """A folder's names, sorted (None when it cannot be listed)."""
    try:
        return ("listing", tuple(sorted(os.listdir(path))))
    except (OSError, ValueError):
        return None
