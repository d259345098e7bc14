"""The remote backends, one per module, and the URL that picks one (`open_backend`)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from ...errors import ConfigError
from .urls import redact

# `module:Class` (as Triton names its cache managers) or plugin://module:Class
PLUGIN = re.compile(r"\A(?:plugin://)?(?P<module>[A-Za-z_][\w.]*):(?P<cls>[A-Za-z_]\w*)"
                    r"(?P<rest>[/?].*)?\Z", re.S)
_REDIS = ("redis", "rediss", "unix")
_HTTP = ("http", "https")


def open_backend(settings):
    """The backend for `settings.url` (a `remote_settings.RemoteSettings`); ConfigError for a URL no
    backend takes. Nothing is contacted."""
    url = settings.url
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    plugin = PLUGIN.match(url)
    if plugin and scheme in ("", "plugin"):
        from .plugin import load_plugin

        return load_plugin(settings, plugin["module"], plugin["cls"])
    if not scheme:
        raise ConfigError(f"{settings.where}: remote {redact(url)!r} is not a URL; write "
                          "redis://HOST:PORT/DB, http://HOST:PORT/PREFIX, s3://BUCKET/PREFIX, "
                          "gs://..., file:///PATH or module:Class")
    if scheme in _REDIS:
        from .redis_remote import RedisRemote

        return RedisRemote(settings)
    if scheme in _HTTP:
        from .http_remote import HttpRemote

        return HttpRemote(settings)
    from .fsspec_remote import FsspecRemote

    return FsspecRemote(settings)
