"""The remote tier: a cache shared by machines, behind the local store.

Read-through: a key the local store lacks is asked of the remote, and a hit
fills the local store (blobs first, manifest last) before it is used.
Write-back: an entry a build commits is pushed. Backends are existing engines,
never a server of our own:

    redis://[:password@]host:port/db[?prefix=kbuild:]   (rediss:// for TLS)
        STRING keys <prefix>v1:entry:<key> (manifest JSON) and
        <prefix>v1:blob:<hash> (bytes); eviction is Redis's (allkeys-lru).
    s3://bucket/prefix, gs://..., file:///path, memory://... (fsspec)
        <root>/v1/entries/ab/<key>.json and <root>/v1/blobs/ab/cd/<hash>.

Nothing from a remote is trusted: a manifest is validated as the store
validates its own files and every blob is checked against its name. An entry
whose blob is gone (evicted) is a plain miss. A remote that fails, hangs or
refuses costs one warning and is not asked again in this process; every call
runs under a timeout, so a dead remote never fails nor stalls a build.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..keying.encode import digest
from ..errors import ConfigError
from .local import LAYOUT, _manifest_problem, atomic_write, blob_relpath, entry_relpath

DEFAULT_TIMEOUT = 5.0
DEFAULT_PREFIX = "kbuild:"
REDIS_SCHEMES = ("redis", "rediss", "unix")
_FAILED = object()


@dataclass(frozen=True)
class RemoteSettings:
    """Which remote a command uses, and how: the outcome of CLI > env > kbuild.toml."""

    url: str
    where: str  # what named it, for error messages
    read_only: bool = False
    timeout: float = DEFAULT_TIMEOUT


def remote_settings(config=None, *, url=None, no_remote=False, read_only=False, timeout=None,
                    env=None) -> RemoteSettings | None:
    """The remote named by `url` (--remote), else $KBUILD_REMOTE, else `[store] remote`.

    None when none is named or `no_remote`. Read-only comes from --remote-read-only
    or KBUILD_REMOTE_READ_ONLY=1, the timeout from `remote_timeout`.
    """
    env = os.environ if env is None else env
    chosen = _first((url, "--remote"), (env.get("KBUILD_REMOTE"), "KBUILD_REMOTE"),
                    (getattr(config, "remote", None), f"{_toml(config)} remote"))
    if no_remote or chosen is None:
        return None
    return RemoteSettings(url=chosen[0], where=chosen[1],
                          read_only=read_only or env.get("KBUILD_REMOTE_READ_ONLY") == "1",
                          timeout=remote_timeout(config, timeout, env))


def remote_timeout(config=None, timeout=None, env=None) -> float:
    """Seconds per remote call: --remote-timeout, $KBUILD_REMOTE_TIMEOUT, `[store] remote_timeout`."""
    env = os.environ if env is None else env
    chosen = _first((timeout, "--remote-timeout"),
                    (env.get("KBUILD_REMOTE_TIMEOUT"), "KBUILD_REMOTE_TIMEOUT"),
                    (getattr(config, "remote_timeout", None), f"{_toml(config)} remote_timeout"))
    return DEFAULT_TIMEOUT if chosen is None else parse_timeout(*chosen)


def _first(*candidates):
    """The first (value, where) whose value is set: CLI, then environment, then kbuild.toml."""
    return next(((value, where) for value, where in candidates if value not in (None, "")), None)


def _toml(config) -> str:
    return f"{config.path}: [store]" if config is not None else "kbuild.toml [store]"


def parse_timeout(value, where: str) -> float:
    """A positive number of seconds, or ConfigError naming `where`."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if isinstance(value, bool) or not 0 < seconds < float("inf"):
        raise ConfigError(f"{where}: timeout must be a positive number of seconds, not {value!r}")
    return seconds


def open_remote(settings: RemoteSettings | None) -> RemoteTier | None:
    """The tier for `settings`; a URL no backend takes is a ConfigError (nothing is contacted)."""
    if settings is None:
        return None
    scheme = urlsplit(settings.url).scheme.lower()
    if not scheme or "://" not in settings.url:
        raise ConfigError(f"{settings.where}: remote {redact(settings.url)!r} is not a URL; write "
                          "redis://HOST:PORT/DB, s3://BUCKET/PREFIX, gs://... or file:///PATH")
    backend = (RedisRemote if scheme in REDIS_SCHEMES else FsspecRemote)(settings)
    return RemoteTier(backend, timeout=settings.timeout, read_only=settings.read_only)


def redact(url: str) -> str:
    """`url` without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")[2]
    user = f"{parts.username}:" if parts.username else ":"
    return urlunsplit(parts._replace(netloc=f"{user}***@{netloc}"))


# -- the tier -----------------------------------------------------------------------------

class RemoteTier:
    """A backend, its timeout and this process's counts; what `Store.remote` holds."""

    def __init__(self, backend, *, timeout: float = DEFAULT_TIMEOUT, read_only: bool = False):
        self.backend, self.timeout, self.read_only = backend, timeout, read_only
        self.name = backend.name
        self.down = False  # set by the first failure: the remote is not asked again
        self._absent: set[str] = set()  # keys it lacked: a second lookup costs no round trip
        self._counts = dict.fromkeys(("hits", "misses", "rejected", "errors",
                                      "bytes_fetched", "bytes_pushed"), 0)

    def fetch(self, store, key: str) -> dict | None:
        """The remote's entry for `key`, verified and committed to `store`; else None."""
        if self.down or key in self._absent:
            return None
        raw = self._call(store, "read", self.backend.get_entry, key)
        manifest = None if raw is _FAILED or raw is None else self._manifest(store, key, raw)
        blobs = self._verified_blobs(store, key, manifest) if manifest is not None else None
        if blobs is None:
            if not self.down:
                self._absent.add(key)
                self._counts["misses"] += 1
            return None
        store.ensure_writable()
        for data in blobs.values():
            store.put_blob(data)
        store.commit(key, {k: v for k, v in manifest.items() if k not in ("schema", "key")},
                     push=False)
        self._counts["hits"] += 1
        self._counts["bytes_fetched"] += len(raw) + sum(map(len, blobs.values()))
        return manifest

    def _manifest(self, store, key: str, raw: bytes) -> dict | None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        problem = "not UTF-8 text" if text is None else _manifest_problem(key, text)
        if problem:
            self._reject(store, f"entry {key} is invalid ({problem})")
            return None
        return json.loads(text)

    def _verified_blobs(self, store, key: str, manifest: dict) -> dict | None:
        names = sorted(set(manifest["artifacts"].values()))
        found = self._call(store, "read", self.backend.get_blobs, names)
        if found is _FAILED or any(found.get(name) is None for name in names):
            return None  # evicted behind its manifest: a plain miss
        for name in names:
            if digest(found[name]) != name:
                self._reject(store, f"blob {name} of entry {key} ({manifest.get('target')}) "
                                    "does not match its hash")
                return None
        return {name: found[name] for name in names}

    def push(self, store, key: str, text: str) -> None:
        """Send a committed entry: its blobs (read back verified from `store`), then its manifest."""
        if self.down or self.read_only:
            return
        names = sorted(set(json.loads(text)["artifacts"].values()))
        blobs = {name: store.read_blob(name) for name in names}
        data = text.encode("utf-8")
        if self._call(store, "write", self.backend.put_entry, key, data, blobs) is not _FAILED:
            self._absent.discard(key)
            self._counts["bytes_pushed"] += len(data) + sum(map(len, blobs.values()))

    def take_counts(self) -> dict:
        """This process's counts since the last call (one build's), as `remote_*` fields."""
        counts = {f"remote_{name}": value for name, value in self._counts.items()}
        self._counts = dict.fromkeys(self._counts, 0)
        return counts

    def _reject(self, store, problem: str) -> None:
        self._counts["rejected"] += 1
        store.warnings.append(f"remote {self.name}: {problem}; ignored, building it here")

    def _call(self, store, what: str, fn, *args):
        """fn(*args) in a thread joined for at most `timeout`; _FAILED (and one warning) on failure.

        A thread and not only socket timeouts: fsspec backends have no common timeout
        setting, and a hung call must not hold the build. The thread is a daemon, so one
        left behind never delays the exit.
        """
        if self.down:
            return _FAILED
        box = {}

        def run():
            try:
                box["value"] = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - reported below, in the caller's thread
                box["error"] = exc

        thread = threading.Thread(target=run, name="kbuild-remote", daemon=True)
        thread.start()
        thread.join(self.timeout)
        if "value" in box:
            return box["value"]
        problem = (f"did not answer within {self.timeout:g}s" if thread.is_alive() else
                   f"failed: {type(box['error']).__name__}: {_first_line(box['error'])}")
        self.down = True
        self._counts["errors"] += 1
        store.warnings.append(f"remote {self.name} {problem} (on {what}); "
                              "building with the local store only")
        return _FAILED


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"


# -- backends -------------------------------------------------------------------------------

class RedisRemote:
    """Entries and blobs as Redis strings under a prefix; Redis evicts (allkeys-lru)."""

    def __init__(self, settings: RemoteSettings):
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ConfigError(f"{settings.where}: remote {redact(settings.url)} needs the redis "
                              "package; pip install 'kbuild[remote]'") from None
        self.name = redact(settings.url)
        url, self.prefix = _split_prefix(settings.url)
        try:
            # No retries: the tier gives up on the first failure, and a retry loop only
            # multiplies the wait on a dead server.
            self.client = redis.Redis.from_url(
                url, socket_timeout=settings.timeout, socket_connect_timeout=settings.timeout,
                retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0)
        except ValueError as exc:
            raise ConfigError(f"{settings.where}: remote {self.name} is not a valid Redis URL "
                              f"({exc})") from None

    def _entry(self, key: str) -> str:
        return f"{self.prefix}{LAYOUT}:entry:{key}"

    def _blob(self, name: str) -> str:
        return f"{self.prefix}{LAYOUT}:blob:{name}"

    def get_entry(self, key: str) -> bytes | None:
        return self.client.get(self._entry(key))

    def get_blobs(self, names) -> dict:
        return dict(zip(names, self.client.mget([self._blob(n) for n in names])))

    def put_entry(self, key: str, text: bytes, blobs: dict) -> None:
        # One MULTI/EXEC: no reader sees the manifest without the blobs it names.
        with self.client.pipeline(transaction=True) as pipe:
            for name, data in blobs.items():
                pipe.set(self._blob(name), data)
            pipe.set(self._entry(key), text)
            pipe.execute()


def _split_prefix(url: str) -> tuple[str, str]:
    """(the URL redis-py reads, the key prefix from its `prefix=` query argument)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefix = next((v for k, v in reversed(query) if k == "prefix"), DEFAULT_PREFIX)
    rest = urlencode([(k, v) for k, v in query if k != "prefix"])
    return urlunsplit(parts._replace(query=rest)), prefix


class FsspecRemote:
    """Entries and blobs as objects (or files) under a root, in the local store's layout."""

    def __init__(self, settings: RemoteSettings):
        self.name = redact(settings.url)
        try:
            import fsspec
            from fsspec.implementations.local import LocalFileSystem
        except ImportError:
            raise ConfigError(f"{settings.where}: remote {self.name} needs the fsspec package; "
                              "pip install 'kbuild[remote]'") from None
        try:
            self.fs, root = fsspec.core.url_to_fs(settings.url)
        except ImportError as exc:  # a known protocol whose package is not installed
            raise ConfigError(f"{settings.where}: remote {self.name}: {exc}") from None
        except ValueError as exc:
            scheme = urlsplit(settings.url).scheme
            raise ConfigError(f"{settings.where}: remote {self.name}: unknown scheme '{scheme}' "
                              f"({exc}); use redis://, rediss://, or an fsspec protocol such as "
                              "s3://, gs://, file://, memory://") from None
        self.root = root.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)

    def _entry(self, key: str) -> str:
        return f"{self.root}/{LAYOUT}/{entry_relpath(key)}"

    def _blob(self, name: str) -> str:
        return f"{self.root}/{LAYOUT}/{blob_relpath(name)}"

    def get_entry(self, key: str) -> bytes | None:
        return self._cat(self._entry(key))

    def get_blobs(self, names) -> dict:
        return {name: self._cat(self._blob(name)) for name in names}

    def put_entry(self, key: str, text: bytes, blobs: dict) -> None:
        for name, data in blobs.items():
            self._write(self._blob(name), data)
        self._write(self._entry(key), text)  # last: the manifest is the commit

    def _cat(self, path: str) -> bytes | None:
        try:
            return self.fs.cat_file(path)
        except FileNotFoundError:
            return None

    def _write(self, path: str, data: bytes) -> None:
        if not self.local:
            self.fs.pipe_file(path, data)  # an object PUT is atomic
            return
        # A shared directory (NFS) is read while written: temp file and rename, as the store does.
        target = Path(path)
        atomic_write(target, data, target.parent, prefix=".tmp-")
