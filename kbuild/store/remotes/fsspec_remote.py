"""An fsspec location as the remote: s3://bucket/prefix, gs://..., file:///path, memory://...

Objects (or files) <root>/v1/entries/ab/<key>.json and <root>/v1/blobs/ab/cd/<hash>,
the local store's layout. Options of the filesystem come in the URL's query
(`s3://bucket/prefix?endpoint_url=http://127.0.0.1:9000&region=eu-west-1`): see
`OPTIONS`; credentials come from the environment as the filesystem reads them.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ...errors import ConfigError
from .. import tree
from ..layout import LAYOUT, atomic_write, blob_relpath, entry_relpath
from .base import ENTRY, Deadline, Remote
from .urls import redact

_CHUNK = 1 << 20
_BOOL = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def _flag(text: str) -> bool:
    if text.lower() not in _BOOL:
        raise ValueError("must be true or false")
    return _BOOL[text.lower()]


# The query arguments an object store's URL may carry, and how each reaches its fsspec
# filesystem (s3fs, gcsfs): (option, how to read the text). Credentials stay in the
# environment or the tool's own files (AWS_ACCESS_KEY_ID, ~/.aws, gcloud), not in a URL
# that kbuild.toml or a CI log would hold.
OPTIONS = {
    "s3": {"endpoint_url": ("endpoint_url", str), "region": ("region_name", str),
           "profile": ("profile", str), "anon": ("anon", _flag),
           "requester_pays": ("requester_pays", _flag)},
    "gs": {"project": ("project", str), "endpoint_url": ("endpoint_url", str),
           "anon": ("token", lambda v: "anon" if _flag(v) else None),
           "requester_pays": ("requester_pays", _flag)},
}
OPTIONS.update(s3a=OPTIONS["s3"], gcs=OPTIONS["gs"])


class FsspecRemote(Remote):
    """Entries and blobs as objects (or files) under a root, in the local store's layout."""

    def __init__(self, settings):
        self.name = redact(settings.url)
        try:
            import fsspec
            from fsspec.implementations.local import LocalFileSystem
        except ImportError:
            raise ConfigError(f"{settings.where}: remote {self.name} needs the fsspec package; "
                              "pip install 'kbuild[remote]'") from None
        try:
            url, options = storage_options(settings.url, settings.where, self.name)
            self.fs, root = fsspec.core.url_to_fs(url, **options)
        except ImportError as exc:  # a known protocol whose package is not installed
            raise ConfigError(f"{settings.where}: remote {self.name}: {exc}") from None
        except ValueError as exc:
            scheme = urlsplit(settings.url).scheme
            raise ConfigError(f"{settings.where}: remote {self.name}: unknown scheme '{scheme}' "
                              f"({exc}); use redis://, rediss://, or an fsspec protocol such as "
                              "s3://, gs://, file://, memory://") from None
        self.root = root.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)

    def _path(self, kind: str, name: str) -> str:
        rel = entry_relpath(name) if kind == ENTRY else blob_relpath(name)
        return f"{self.root}/{LAYOUT}/{rel}"

    def get(self, kind: str, name: str, cap: int, deadline: float) -> bytes | None:
        return self._cat(self._path(kind, name), cap, deadline)

    def put(self, kind: str, name: str, data: bytes, deadline: float) -> None:
        self._write(self._path(kind, name), data)

    def exists(self, kind: str, name: str, deadline: float) -> bool:
        path = self._path(kind, name)
        if self.local:
            info = tree.lstat(Path(self.root), self._rel(path))
            return info is not None and stat.S_ISREG(info.st_mode)
        return self.fs.exists(path)

    def remove(self, kind: str, name: str, deadline: float) -> bool:
        path = self._path(kind, name)
        try:
            if self.local:
                os.unlink(path)  # a link there goes, not what it points to
            else:
                self.fs.rm_file(path)
        except FileNotFoundError:
            return False
        return True

    def _cat(self, path: str, cap: int, deadline: float) -> bytes | None:
        """At most cap + 1 bytes of `path`, read in chunks that stop at `deadline`: a read
        the tier gave up on stops too, instead of filling memory in the background."""
        if self.local:
            return self._read_local(path, cap)
        chunks, total = [], 0
        try:
            with self.fs.open(path, "rb") as fh:
                while total <= cap:
                    if time.monotonic() > deadline:
                        raise Deadline(f"reading {path} ran past its timeout")
                    chunk = fh.read(min(_CHUNK, cap + 1 - total))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    total += len(chunk)
        except FileNotFoundError:
            return None
        return b"".join(chunks)

    def _read_local(self, path: str, cap: int) -> bytes | None:
        """A shared folder is read as the store is: no link followed anywhere below the
        root, no FIFO or device opened; any of those, or a file over the cap, is a miss."""
        try:
            return tree.read_file(Path(self.root), self._rel(path), cap + 1)[0]
        except (FileNotFoundError, NotADirectoryError, tree.NotPlain):
            return None

    def _write(self, path: str, data: bytes) -> None:
        if not self.local:
            self.fs.pipe_file(path, data)  # an object PUT is atomic
            return
        # A shared directory (NFS) is read while written: temp file and rename, as the store
        # does, and no write through a link below the root (one there is refused, not
        # replaced: the folder is shared, and the link may be someone's).
        target = Path(path)
        atomic_write(target, data, target.parent, prefix=".tmp-", root=Path(self.root))

    def _rel(self, path: str) -> str:
        return path[len(self.root) + 1:]


def storage_options(url: str, where: str, name: str) -> tuple[str, dict]:
    """(the URL without its query, the filesystem's options from the query) for the
    object stores of `OPTIONS`; other URLs are returned whole, with no options."""
    parts = urlsplit(url)
    known = OPTIONS.get(parts.scheme.lower())
    if known is None or not parts.query:
        return url, {}
    options = {}
    for key, text in parse_qsl(parts.query, keep_blank_values=True):
        if key not in known:
            raise ConfigError(f"{where}: remote {name}: unknown option '{key}' for "
                              f"{parts.scheme}://; use {', '.join(sorted(known))}")
        option, read = known[key]
        try:
            value = read(text)
        except ValueError as exc:
            raise ConfigError(f"{where}: remote {name}: {key} {exc}, not {text!r}") from None
        if option == "region_name":
            options.setdefault("client_kwargs", {})["region_name"] = value
        elif value is not None:
            options[option] = value
    return urlunsplit(parts._replace(query="")), options
