"""What compile-time Python asks the operating system, however it asks it.

An `@overload`, an `@intrinsic`'s code generator, a typing or lowering function (and
anything they call, a library included) may decide what numba compiles from the
system: a file read through `open`, `pathlib`, `os.open` or numpy; a path tested with
`os.path.exists`/`isfile`/`getsize`; a folder listed (`os.listdir`, `os.scandir`, `glob`,
`os.walk`); or something whose result no key can hold (a subprocess's output, a shell
command, a C library loaded with `ctypes`). Python reports each of these as an audit
event (PEP 578), whoever makes the call; `stat` has no event, so `os.stat`/`os.lstat`
are stood in for while a compile runs.

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

from ..environ import stand_in_supports
from ..keying.observed import Kind
from .libraries import is_library

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
_STATS: list = []  # the os.stat and os.lstat stood in for while any compile runs
_HOOKED = False
_LOCK = threading.Lock()


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
    """Whether `frame` runs a module's body at its import (or reload): what it reads is
    pinned by the module's source. Code that `exec` and `eval` run is named `<module>`
    too, but runs in a module that is done importing (or in a namespace of its own)."""
    code = frame.f_code
    if code.co_name != "<module>":
        return False
    scope = frame.f_globals
    return bool(getattr(scope.get("__spec__"), "_initializing", False)) \
        or code.co_filename == scope.get("__file__")


@contextlib.contextmanager
def watching(observer, bystander, installed):
    """Within the block, the compiling thread's calls to the system are observed: a read
    when the project asked for it, walking past `bystander(frame)` installed code; a
    command or a C library when the project's own code ran it, walking past all
    `installed(frame)` code."""
    _install()
    me = threading.get_ident()
    with _LOCK:
        if not _WATCHING:
            _STATS.append((os.stat, os.lstat))
            os.stat, os.lstat = _recording_stat(os.stat), _recording_stat(os.lstat)
            stand_in_supports(_STATS[-1], (os.stat, os.lstat))
        _WATCHING.setdefault(me, []).append((observer, bystander, installed))
    try:
        yield
    finally:
        with _LOCK:
            _WATCHING[me].pop()
            if not _WATCHING[me]:
                del _WATCHING[me]
            if not _WATCHING:
                stats = _STATS.pop()
                stand_in_supports((os.stat, os.lstat), stats)
                os.stat, os.lstat = stats


def _install() -> None:
    global _HOOKED
    with _LOCK:
        if not _HOOKED:
            sys.addaudithook(_audit)
            _HOOKED = True


def _current():
    found = _WATCHING.get(threading.get_ident())
    return found[-1] if found else None


def _audit(event: str, args) -> None:
    if not _WATCHING:
        return
    handler = _EVENTS.get(event)
    if handler is None:
        return
    current = _current()
    if current is None:
        return
    observer, bystander, installed = current
    try:
        if asked_by_project(sys._getframe(1), bystander if handler in _READS else installed):
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


def _unseen(describe):
    def handler(observer, args) -> None:
        observer.add(Kind.UNSEEN, describe(args))

    return handler


_EVENTS = {
    "open": _opened,
    "os.listdir": _listed,
    "os.scandir": _listed,
    "subprocess.Popen": _unseen(lambda args: f"ran a subprocess ({_command(args)})"),
    "os.system": _unseen(lambda args: "ran a shell command (os.system)"),
    "os.posix_spawn": _unseen(lambda args: "spawned a process (os.posix_spawn)"),
    "os.spawn": _unseen(lambda args: "spawned a process (os.spawn*)"),
    "os.exec": _unseen(lambda args: "ran os.exec*"),
    "ctypes.dlopen": _unseen(
        lambda args: f"loaded a C library ({os.path.basename(os.fsdecode(args[0] or '?'))})"),
}


_READS = frozenset({_opened, _listed})


def _recording_stat(original):
    def stat(path, *args, **kwargs):
        current = _current() if _WATCHING else None
        if current is None or isinstance(path, int):
            return original(path, *args, **kwargs)
        observer, bystander, _ = current
        mine = asked_by_project(sys._getframe(1), bystander)
        if mine and isinstance(path, (str, bytes, os.PathLike)):
            observer.file(os.fsdecode(path), Kind.STAT)
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
