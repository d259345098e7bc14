"""A project's own remote backend, named `module:Class` (or plugin://module:Class).

The class implements `base.Remote` (get, put, remove; it may subclass it to
inherit the rest) and is made with one argument, the `remote_settings.RemoteSettings`
(its `url` is what the user wrote). The module is imported from the project's
import roots first, then from sys.path. What it returns is checked by the tier
as any remote's is: a plugin cannot make kbuild trust a binary.
"""

from __future__ import annotations

import importlib
import sys

from ...errors import ConfigError
from .base import Remote
from .urls import redact

_NEEDED = ("get", "put", "remove")


def load_plugin(settings, module_name: str, class_name: str) -> Remote:
    """An instance of `module_name`'s `class_name`; ConfigError naming what is wrong."""
    label = f"{settings.where}: remote {redact(settings.url)}"
    cls = getattr(_import(module_name, settings.paths, label), class_name, None)
    if not isinstance(cls, type):
        raise ConfigError(f"{label}: module '{module_name}' has no class '{class_name}'")
    missing = [m for m in _NEEDED if not callable(getattr(cls, m, None))
               or getattr(cls, m) is getattr(Remote, m)]
    if missing:
        raise ConfigError(f"{label}: {module_name}:{class_name} does not implement "
                          f"{', '.join(missing)}; see kbuild.store.remotes.base.Remote")
    try:
        backend = cls(settings)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: its failure, named
        raise ConfigError(f"{label}: {module_name}:{class_name}(settings) failed: "
                          f"{type(exc).__name__}: {exc}") from None
    if not isinstance(backend, Remote):
        backend = _Adapted(backend)
    if not isinstance(getattr(backend, "name", None), str) or backend.name == Remote.name:
        backend.name = f"{module_name}:{class_name}"
    return backend


def _import(module_name: str, paths, label: str):
    added = [p for p in paths if p not in sys.path]
    sys.path[:0] = added
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{label}: cannot import '{module_name}' ({exc}); put it in the "
                          "project's import roots or install it") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed to import
        raise ConfigError(f"{label}: importing '{module_name}' failed: "
                          f"{type(exc).__name__}: {exc}") from None
    finally:
        for p in added:
            if p in sys.path:
                sys.path.remove(p)


class _Adapted(Remote):
    """A plugin that implements get/put/remove without subclassing `Remote`: the
    batches come from Remote's loops over its three calls."""

    def __init__(self, inner):
        self.inner, self.name = inner, getattr(inner, "name", Remote.name)

    def get(self, kind, name, cap, deadline):
        return self.inner.get(kind, name, cap, deadline)

    def put(self, kind, name, data, deadline):
        return self.inner.put(kind, name, data, deadline)

    def remove(self, kind, name, deadline):
        return self.inner.remove(kind, name, deadline)
