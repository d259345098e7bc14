"""Per-key build locks, so concurrent builds on one store compile each key once.

A lock is an `flock` on ``STORE/v1/locks/<key>.lock``: the kernel drops it
when its holder exits, however it exits (SIGKILL included), so a crashed build
never leaves a key locked. Locks only save duplicate work; correctness comes
from atomic writes (a reader never sees half an entry either way).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class KeyLock:
    """An exclusive lock on one target key in one store."""

    def __init__(self, directory: Path, key: str):
        self.path = Path(directory) / f"{key}.lock"
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
            os.close(self._fd)
            self._fd = None

    def _lock(self, flags) -> bool:
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
