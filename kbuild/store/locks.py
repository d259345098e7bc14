"""Locks on a store: per-key build locks, and one store-wide lock that gc and clean need.

A lock is an `flock` on a file under ``STORE/v1/locks/``: the kernel drops it
when the last descriptor of its open file goes, however its holder exits
(SIGKILL included). Forked workers would hold inherited copies, so every
descriptor here is listed in `HELD` and a worker closes them as it starts
(see `execute.parallel`): a lock then lives exactly as long as the build that took it.

Builds hold the store lock shared; `gc` and `clean` take it exclusive, so they
never delete what a running build has just committed or is about to use.
Per-key locks only save duplicate work; correctness comes from atomic writes.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from ..errors import StoreError
from . import tree

HELD: set[int] = set()  # every lock descriptor this process holds, for forked workers to close
STORE_LOCK_WAIT = 600.0  # seconds gc/clean wait for running builds (and builds for gc)


def _open_lock(root: Path, rel: str) -> int:
    folders, name = rel.rsplit("/", 1)
    with tree.opened_dir(root, folders.split("/"), create=True) as dirfd:
        return os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                       dir_fd=dirfd)


def _close(fd: int) -> None:
    HELD.discard(fd)
    os.close(fd)


class KeyLock:
    """An exclusive lock on one target key in one store."""

    def __init__(self, root: Path, key: str):
        self.root, self.rel = Path(root), f"v1/locks/{key}.lock"
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; never waits."""
        return self._lock(fcntl.LOCK_EX | fcntl.LOCK_NB)

    def acquire(self) -> None:
        """Take the lock, waiting for its holder to finish."""
        self._lock(fcntl.LOCK_EX)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            _close(self._fd)
            self._fd = None

    def _lock(self, flags) -> bool:
        if self._fd is not None:
            return True
        try:
            fd = _open_lock(self.root, self.rel)
        except OSError as exc:
            raise StoreError(f"store {self.root}: cannot open lock {self.rel} "
                             f"({exc.strerror or exc}); is the store writable?") from None
        HELD.add(fd)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            _close(fd)
            return False
        self._fd = fd
        return True

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


class StoreLock:
    """The store-wide lock: shared by builds, exclusive for gc and clean; re-entrant."""

    REL = "v1/locks/store.lock"

    def __init__(self, root: Path):
        self.root = Path(root)
        self._fd: int | None = None
        self._mode: int | None = None
        self._depth = 0

    def hold(self, mode: int, what: str, optional: bool = False):
        """A context holding the lock in `mode` (fcntl.LOCK_SH / LOCK_EX). An `optional`
        lock that cannot be made (a read-only store: nothing can be deleted from it either)
        is skipped."""
        return _Held(self, mode, what, optional)

    def _enter(self, mode: int, what: str, optional: bool = False) -> None:
        if self._depth and (self._mode == fcntl.LOCK_EX or mode == self._mode
                            or self._fd is None):
            self._depth += 1
            return
        if self._fd is None:
            try:
                self._fd = _open_lock(self.root, self.REL)
            except OSError as exc:
                if optional:
                    self._depth += 1
                    return
                raise StoreError(f"store {self.root}: cannot open {self.REL} "
                                 f"({exc.strerror or exc}); is the store writable?") from None
            HELD.add(self._fd)
        self._wait(mode, what)
        self._mode, self._depth = mode, self._depth + 1

    def _wait(self, mode: int, what: str) -> None:
        deadline = time.monotonic() + STORE_LOCK_WAIT
        while True:
            try:
                fcntl.flock(self._fd, mode | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StoreError(f"store {self.root} stayed in use by another kbuild "
                                     f"process for {STORE_LOCK_WAIT:g}s; {what} gave up; "
                                     "try again when it finishes") from None
                time.sleep(0.05)

    def _exit(self) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            _close(self._fd)
            self._fd = self._mode = None


class _Held:
    def __init__(self, lock: StoreLock, mode: int, what: str, optional: bool):
        self.lock, self.mode, self.what, self.optional = lock, mode, what, optional

    def __enter__(self):
        self.lock._enter(self.mode, self.what, self.optional)
        return self.lock

    def __exit__(self, *exc):
        self.lock._exit()


def close_inherited() -> None:
    """In a forked worker: drop the copies of the parent's lock descriptors (the locks
    stay the parent's, and die with it)."""
    for fd in list(HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    HELD.clear()
