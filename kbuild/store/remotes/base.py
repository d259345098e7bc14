"""What a remote cache backend is: named byte strings of two kinds, and three calls.

A backend holds *entries* (a manifest's JSON, named by its key) and *blobs* (a
binary, named by kbuild's hash of its bytes). It gets, puts and removes one of
them; everything else (checking what comes back, signatures, timeouts, the
build's time budget, warnings) is the tier's (`store.remote.RemoteTier`), once,
above every backend. A backend trusts nothing it reads either: each read is
bounded by the caller's `cap` and `deadline`, and whatever it returns is
verified by the tier before it is used.

Redis, fsspec object stores and HTTP caches are backends (each in a module of
its own); a project may plug in its own class by `module:Class` (`plugin.py`).
"""

from __future__ import annotations

import time

ENTRY, BLOB = "entry", "blob"
KINDS = (ENTRY, BLOB)


class Deadline(TimeoutError):
    """A backend call ran past its deadline; raised in the worker thread to stop it."""


class Tampered(Exception):
    """An object the remote holds is not what its name says (a CAS blob whose bytes have
    another SHA-256): that entry is refused, the remote stays in use."""


class Remote:
    """The interface of a remote backend; subclasses implement `get`, `put` and `remove`.

    `kind` is ENTRY ('entry', `name` a key) or BLOB ('blob', `name` kbuild's hash of
    the bytes). Every call gets `deadline` (a `time.monotonic()` value): a call past
    it raises `Deadline` (or any TimeoutError). A failure is an exception, which the
    tier reports once and then stops asking this remote. `name` (the URL with its
    secrets redacted) is what messages call the remote.
    """

    name = "remote"

    def get(self, kind: str, name: str, cap: int, deadline: float) -> bytes | None:
        """The bytes stored under (kind, name); None when absent. What holds more than
        `cap` bytes may come back cut at cap + 1 bytes, as None, or as an exception: the
        tier refuses each (a backend must not read it all)."""
        raise NotImplementedError

    def put(self, kind: str, name: str, data: bytes, deadline: float) -> None:
        """Store `data` under (kind, name), replacing what is there."""
        raise NotImplementedError

    def remove(self, kind: str, name: str, deadline: float) -> bool:
        """Remove (kind, name); whether it was there (False when the remote cannot tell)."""
        raise NotImplementedError

    # What the tier calls; a backend with batches of its own (Redis pipelines, a
    # transaction) overrides these, the others inherit the loops.

    def exists(self, kind: str, name: str, deadline: float) -> bool:
        """Whether (kind, name) is stored (by default: a read of at most one byte)."""
        return self.get(kind, name, 0, deadline) is not None

    def get_blobs(self, names, caps, deadline: float) -> dict:
        """name -> bytes or None, for each of `names` (each read up to its cap)."""
        return {name: self.get(BLOB, name, cap, deadline) for name, cap in zip(names, caps)}

    def put_entry(self, key: str, data: bytes, blobs: dict, deadline: float) -> None:
        """An entry's blobs, then its manifest: a reader never meets a manifest whose
        blobs were not sent (they may be evicted later: a plain miss)."""
        for name in sorted(blobs):
            self.put(BLOB, name, blobs[name], deadline)
        self.put(ENTRY, key, data, deadline)


def check_deadline(deadline: float, what: str) -> float:
    """Seconds left before `deadline`; `Deadline` naming `what` when none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise Deadline(f"{what} ran past its timeout")
    return left
