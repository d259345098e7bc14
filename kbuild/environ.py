"""`os.environ` watched for the variables a run reads by name.

Two watchers stand in for `os.environ` while something runs: direct mode's recorder (what a
full keying read, for the journal) and the compile observer (what a compile read, for its
record). Both need the same stand-in; each says what a read means to it.
"""

from __future__ import annotations

from collections.abc import MutableMapping


class WatchedEnviron(MutableMapping):
    """`environ` (the real `os.environ`), calling `read(name)` before each read of one
    variable by name and `written(name)` before each change of one. Iterating, copying and
    scanning read no one variable: they call neither."""

    def __init__(self, environ):
        self._environ = environ

    def read(self, name) -> None:
        """A variable is about to be read by name."""

    def written(self, name) -> None:
        """A variable is about to be set or removed."""

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
        return iter(self._environ)

    def __len__(self):
        return len(self._environ)

    def copy(self):
        return self._environ.copy()

    def keys(self):
        return self._environ.keys()

    def items(self):
        return self._environ.items()

    def values(self):
        return self._environ.values()

    def __repr__(self):
        return repr(self._environ)


__all__ = ["WatchedEnviron"]
