"""`os.environ` watched for the variables a run reads by name, and `os` functions stood in for.

Two watchers stand in for `os.environ` (and `os.stat`) while something runs: direct
mode's recorder (what a full keying read, for the journal) and the compile observer
(what a compile read, for its record). Both need the same stand-ins; each says what a
read means to it.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping


class WatchedEnviron(MutableMapping):
    """`environ` (the real `os.environ`), calling `read(name)` before each read of one
    variable by name, `written(name)` before each change of one, and `scanned()` before
    each iteration, copy or scan of them all (which reads no one variable by name)."""

    def __init__(self, environ):
        self._environ = environ

    def read(self, name) -> None:
        """A variable is about to be read by name."""

    def written(self, name) -> None:
        """A variable is about to be set or removed."""

    def scanned(self) -> None:
        """Every variable is about to be read (an iteration, a copy, `items()`, ...); the
        caller is two frames up."""

    def __getitem__(self, name):
        self.read(name)
        return self._environ[name]

    def __contains__(self, name):
        self.read(name)
        return name in self._environ

    def get(self, name, default=None):
        self.read(name)
        return self._environ.get(name, default)

    def __setitem__(self, name, value):
        self.written(name)
        self._environ[name] = value

    def __delitem__(self, name):
        self.written(name)
        del self._environ[name]

    def __iter__(self):
        self.scanned()
        return iter(self._environ)

    def __len__(self):
        return len(self._environ)

    def copy(self):
        self.scanned()
        return self._environ.copy()

    def keys(self):
        self.scanned()
        return self._environ.keys()

    def items(self):
        self.scanned()
        return self._environ.items()

    def values(self):
        self.scanned()
        return self._environ.values()

    def __repr__(self):
        return repr(self._environ)


def stand_in_supports(old, new) -> None:
    """`old` os functions replaced by `new` stand-ins (or put back): `os.stat in
    os.supports_fd` (shutil, pathlib ask it) must say the same of a stand-in."""
    for group in (os.supports_fd, os.supports_dir_fd, os.supports_follow_symlinks,
                  os.supports_effective_ids):
        for before, after in zip(old, new):
            if before in group:
                group.discard(before)
                group.add(after)


__all__ = ["WatchedEnviron", "stand_in_supports"]
