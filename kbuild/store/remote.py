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
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from ..keying.encode import digest
from ..errors import ConfigError
from . import resp, tree
from .local import LAYOUT, MAX_BLOB, atomic_write, blob_relpath, entry_relpath
from .manifest import MAX_JSON_BYTES, EntryProblem, parse_manifest
from .signing import sign, signature_problem, signing_key

DEFAULT_TIMEOUT = 5.0
DEFAULT_BUDGET = 30.0  # seconds one build may spend waiting on the remote, all calls together
_SECRET_PARAMS = ("password", "passwd", "pass", "pwd", "token", "secret", "key", "auth",
                  "credential", "signature", "sig")
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
    budget: float = DEFAULT_BUDGET
    signing_key: bytes | None = field(default=None, repr=False)


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
    budget = env.get("KBUILD_REMOTE_BUDGET")
    return RemoteSettings(url=chosen[0], where=chosen[1],
                          read_only=read_only or env.get("KBUILD_REMOTE_READ_ONLY") == "1",
                          timeout=remote_timeout(config, timeout, env),
                          budget=parse_timeout(budget, "KBUILD_REMOTE_BUDGET") if budget
                          else DEFAULT_BUDGET,
                          signing_key=signing_key(config, env))


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
    return RemoteTier(backend, timeout=settings.timeout, read_only=settings.read_only,
                      budget=settings.budget, signing_key=settings.signing_key,
                      secrets=url_secrets(settings.url))


def redact(url: str) -> str:
    """`url` without its password or secret query arguments (?password=, ?token=...)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<a malformed URL>"
    if password is not None:
        netloc = parts.netloc.rpartition("@")[2]
        user = f"{parts.username}:" if parts.username else ":"
        parts = parts._replace(netloc=f"{user}***@{netloc}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(_secret_param(k) for k, _ in query):
        parts = parts._replace(query=urlencode(
            [(k, "***" if _secret_param(k) else v) for k, v in query], safe="*:"))
    return urlunsplit(parts)


def _secret_param(name: str) -> bool:
    name = name.lower()
    return any(word in name for word in _SECRET_PARAMS) and name != "prefix"


def url_secrets(url: str) -> tuple:
    """The secret strings in `url` (password, secret query values), to scrub from messages."""
    try:
        parts = urlsplit(url)
        found = [parts.password] if parts.password else []
    except ValueError:
        return ()
    found += [v for k, v in parse_qsl(parts.query, keep_blank_values=True)
              if _secret_param(k) and v]
    return tuple(sorted({x for s in found for x in (s, quote(s, safe=""), unquote(s)) if x},
                        key=len, reverse=True))


def scrub(text: str, secrets) -> str:
    """`text` with every secret replaced by ***: driver messages may echo a password."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


# -- the tier -----------------------------------------------------------------------------

class RemoteTier:
    """A backend, its timeout, this build's time budget and counts; what `Store.remote` holds."""

    def __init__(self, backend, *, timeout: float = DEFAULT_TIMEOUT, read_only: bool = False,
                 budget: float = DEFAULT_BUDGET, signing_key: bytes | None = None, secrets=()):
        self.backend, self.timeout, self.read_only = backend, timeout, read_only
        self.budget, self.signing_key, self.secrets = budget, signing_key, tuple(secrets)
        self.name = backend.name
        self.down = False  # set by the first failure: the remote is not asked again
        self.spent = 0.0  # seconds waited on the remote so far
        self._absent: set[str] = set()  # keys it lacked: a second lookup costs no round trip
        self._counts = dict.fromkeys(("hits", "misses", "rejected", "errors",
                                      "bytes_fetched", "bytes_pushed"), 0)

    def fetch(self, store, key: str, expect: dict | None = None) -> dict | None:
        """The remote's entry for `key`, verified (bound to `expect`, signed when a key is
        set, its artifacts its own) and committed to `store`; else None."""
        if self.down or key in self._absent:
            return None
        raw = self._call(store, "read", self.backend.get_entry, key, MAX_JSON_BYTES)
        manifest = None if raw is _FAILED or not raw else self._manifest(store, key, raw, expect)
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

    def _manifest(self, store, key: str, raw: bytes, expect) -> dict | None:
        try:
            manifest = parse_manifest(key, raw.decode("utf-8"), expect)
            problem = signature_problem(manifest, self.signing_key)
        except UnicodeDecodeError:
            problem = "not UTF-8 text"
        except EntryProblem as exc:
            problem = str(exc)
        if problem:
            self._reject(store, f"entry {key} is invalid ({problem})")
            return None
        return manifest

    def _verified_blobs(self, store, key: str, manifest: dict) -> dict | None:
        sizes = manifest.get("sizes", {})
        wanted = {name: sizes.get(kind, MAX_BLOB) for kind, name in manifest["artifacts"].items()}
        names = sorted(wanted)
        found = self._call(store, "read", self.backend.get_blobs, names,
                           [min(wanted[n], MAX_BLOB) for n in names])
        if found is _FAILED or any(not found.get(name) for name in names):
            return None  # evicted behind its manifest: a plain miss
        for name in names:
            if digest(found[name]) != name:
                self._reject(store, f"blob {name} of entry {key} "
                                    f"({str(manifest.get('target'))[:80]}) does not match its hash")
                return None
        problem = store.artifacts_problem(manifest, found)
        if problem:
            self._reject(store, f"entry {key} ({str(manifest.get('target'))[:80]}) {problem}")
            return None
        return {name: found[name] for name in names}

    def push(self, store, key: str, text: str) -> None:
        """Send a committed entry (signed when a key is set): its blobs (read back verified
        from `store`), then its manifest."""
        if self.down or self.read_only:
            return
        manifest = json.loads(text)
        names = sorted(set(manifest["artifacts"].values()))
        blobs = {name: store.read_blob(name) for name in names}
        data = json.dumps(sign(manifest, self.signing_key), sort_keys=True, indent=1).encode()
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
        store.warnings.append(scrub(f"remote {self.name}: {problem}; ignored, building it here",
                                    self.secrets))

    def _call(self, store, what: str, fn, *args):
        """fn(*args) in a thread joined for at most `timeout` (and what is left of the
        build's budget); _FAILED (and one warning) on failure.

        A thread and not only socket timeouts: fsspec backends have no common timeout
        setting, and a hung call must not hold the build. The thread is a daemon, so one
        left behind never delays the exit, and the backends read in chunks against the
        same deadline, so one left behind stops reading when its time is up.
        """
        if self.down:
            return _FAILED
        wait = min(self.timeout, self.budget - self.spent)
        box = {}
        deadline = time.monotonic() + wait

        def run():
            try:
                box["value"] = fn(*args, deadline=deadline)
            except BaseException as exc:  # noqa: BLE001 - reported below, in the caller's thread
                box["error"] = exc

        started = time.monotonic()
        thread = threading.Thread(target=run, name="kbuild-remote", daemon=True)
        thread.start()
        thread.join(max(wait, 0.0))
        self.spent += time.monotonic() - started
        if "value" in box:
            if self.spent >= self.budget:
                self._give_up(store, what, f"used up this build's budget of {self.budget:g}s")
            return box["value"]
        # A reader that stopped at the deadline itself is a timeout too, not a failure.
        late = thread.is_alive() or isinstance(box.get("error"), TimeoutError)
        if late and wait < self.timeout:
            problem = f"used up this build's budget of {self.budget:g}s"
        elif late:
            problem = f"did not answer within {self.timeout:g}s"
        else:
            problem = f"failed: {type(box['error']).__name__}: {_first_line(box['error'])}"
        self._give_up(store, what, problem)
        return _FAILED

    def _give_up(self, store, what: str, problem: str) -> None:
        self.down = True
        self._counts["errors"] += 1
        store.warnings.append(scrub(f"remote {self.name} {problem} (on {what}); "
                                    "building with the local store only", self.secrets))


class _Deadline(TimeoutError):
    """A backend read ran past its deadline; raised in the worker thread to stop it."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "no message"


# -- backends -------------------------------------------------------------------------------

class RedisRemote:
    """Entries and blobs as Redis strings under a prefix; Redis evicts (allkeys-lru).

    The URL is read as redis-py reads it (`parse_url`: host, port, db, user, password,
    rediss:// for TLS with its ssl_* options, unix://), but the protocol is spoken by
    `resp`: every reply is bounded in size at its header and by the call's deadline while
    it streams, and must be of the type the command gives (redis-py would read any size,
    time out only a silent socket, and hand back an integer where a string was asked).
    """

    def __init__(self, settings: RemoteSettings):
        try:
            from redis.connection import parse_url
        except ImportError:
            raise ConfigError(f"{settings.where}: remote {redact(settings.url)} needs the redis "
                              "package; pip install 'kbuild[remote]'") from None
        self.name = redact(settings.url)
        url, self.prefix = _split_prefix(settings.url)
        try:
            params = parse_url(url)
        except ValueError as exc:
            raise ConfigError(f"{settings.where}: remote {self.name} is not a valid Redis URL "
                              f"({exc})") from None
        self.params = _redis_params(params, settings.where, self.name)
        self._connection = None  # (pid, resp.Connection): a forked child opens its own
        self._lock = threading.Lock()

    def _entry(self, key: str) -> str:
        return f"{self.prefix}{LAYOUT}:entry:{key}"

    def _blob(self, name: str) -> str:
        return f"{self.prefix}{LAYOUT}:blob:{name}"

    def get_entry(self, key: str, cap: int, deadline: float) -> bytes | None:
        # GETRANGE, not GET: an honest server cuts a huge value at the cap (which then
        # fails its checks); a reply longer than that is refused before it is read.
        def read(conn):
            conn.send([("GETRANGE", self._entry(key), 0, cap)], deadline)
            return conn.read_string(cap + 1, deadline, "an entry read") or None
        return self._with_connection(read, deadline)

    def get_blobs(self, names, caps, deadline: float) -> dict:
        def read(conn):
            conn.send([("GETRANGE", self._blob(n), 0, cap) for n, cap in zip(names, caps)],
                      deadline)
            return {n: conn.read_string(cap + 1, deadline, "a blob read") or None
                    for n, cap in zip(names, caps)}
        return self._with_connection(read, deadline)

    def put_entry(self, key: str, text: bytes, blobs: dict, deadline: float) -> None:
        # One MULTI/EXEC: no reader sees the manifest without the blobs it names.
        sets = [("SET", self._blob(name), data) for name, data in blobs.items()]
        sets.append(("SET", self._entry(key), text))

        def write(conn):
            conn.send([("MULTI",), *sets, ("EXEC",)], deadline)
            conn.read_status(deadline, "MULTI")
            for _ in sets:
                conn.read_status(deadline, "SET in a transaction", b"QUEUED")
            conn.read_statuses(len(sets), deadline, "EXEC")
        self._with_connection(write, deadline)

    def _with_connection(self, use, deadline: float):
        """use(connection) on this process's connection (opened on first use); any failure
        closes it: after a broken reply its state is unknown."""
        with self._lock:
            held = self._connection
            if held is None or held[0] != os.getpid():
                held = self._connection = (os.getpid(), self._connect(deadline))
            try:
                return use(held[1])
            except BaseException:
                self._connection = None
                held[1].close()
                raise

    def _connect(self, deadline: float) -> resp.Connection:
        """A connection, authenticated and on its database, all within `deadline`."""
        conn = resp.Connection(self._socket(deadline))
        p = self.params
        try:
            if p.get("password") is not None:
                user = [p["username"]] if p.get("username") else []
                conn.send([("AUTH", *user, p["password"])], deadline)
                conn.read_status(deadline, "AUTH")
            if p["db"]:
                conn.send([("SELECT", p["db"])], deadline)
                conn.read_status(deadline, "SELECT")
        except BaseException:
            conn.close()
            raise
        return conn

    def _socket(self, deadline: float) -> socket.socket:
        """A socket to the server (TCP, TLS or Unix); failures read as redis-py's did."""
        p = self.params
        where = p["path"] if p.get("path") else f"{p['host']}:{p['port']}"
        timeout = max(deadline - time.monotonic(), 0.001)
        try:
            if p.get("path"):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(timeout)
                sock.connect(p["path"])
                return sock
            sock = socket.create_connection((p["host"], p["port"]), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return _tls_context(p).wrap_socket(sock, server_hostname=p["host"]) \
                if p["tls"] else sock
        except TimeoutError:
            raise resp.Deadline(f"connecting to {where} timed out") from None
        except OSError as exc:
            number = f" {exc.errno}" if exc.errno is not None else ""
            detail = f" {exc.strerror}." if exc.strerror else f" {exc}." if str(exc) else ""
            raise ConnectionError(f"Error{number} connecting to {where}.{detail}") from None


# What parse_url may give that kbuild reads. Other options are ignored, as redis-py ignores
# what it does not know (timeouts and retries are kbuild's, replies are RESP2 bytes), except
# a TLS option kbuild does not implement: dropping one could weaken what the user asked for.
_REDIS_PARAMS = ("host", "port", "db", "username", "password", "path", "connection_class",
                 "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile",
                 "ssl_password", "ssl_check_hostname")
_CERT_REQS = {"none": "CERT_NONE", "optional": "CERT_OPTIONAL", "required": "CERT_REQUIRED"}


def _redis_params(params: dict, where: str, name: str) -> dict:
    """What kbuild's client needs from redis-py's reading of the URL."""
    unknown = sorted(k for k in set(params) - set(_REDIS_PARAMS) if k.startswith("ssl"))
    if unknown:
        raise ConfigError(f"{where}: remote {name}: TLS option '{unknown[0]}' is not supported "
                          "by kbuild's Redis client; remove it from the URL")
    cls = getattr(params.get("connection_class"), "__name__", "")
    reqs = str(params.get("ssl_cert_reqs", "required")).lower()
    if reqs not in _CERT_REQS:
        raise ConfigError(f"{where}: remote {name}: ssl_cert_reqs must be none, optional or "
                          f"required, not {reqs!r}")
    out = {k: v for k, v in params.items() if k in _REDIS_PARAMS and k != "connection_class"}
    return dict(out, host=params.get("host", "localhost"), port=int(params.get("port", 6379)),
                db=int(params.get("db", 0) or 0), tls=cls == "SSLConnection",
                ssl_cert_reqs=reqs)


def _tls_context(params: dict):
    import ssl

    context = ssl.create_default_context(cafile=params.get("ssl_ca_certs"),
                                         capath=params.get("ssl_ca_path"))
    reqs = params["ssl_cert_reqs"]
    context.check_hostname = reqs != "none" and params.get("ssl_check_hostname", True) \
        not in (False, "false", "False", "0")
    context.verify_mode = getattr(ssl, _CERT_REQS[reqs])
    if params.get("ssl_certfile"):
        context.load_cert_chain(params["ssl_certfile"], params.get("ssl_keyfile"),
                                params.get("ssl_password"))
    return context


def _split_prefix(url: str) -> tuple[str, str]:
    """(the URL redis-py reads, the key prefix from its `prefix=` query argument)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefix = next((v for k, v in reversed(query) if k == "prefix"), DEFAULT_PREFIX)
    rest = urlencode([(k, v) for k, v in query if k != "prefix"])
    return urlunsplit(parts._replace(query=rest)), prefix


_CHUNK = 1 << 20


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

    def get_entry(self, key: str, cap: int, deadline: float) -> bytes | None:
        return self._cat(self._entry(key), cap, deadline)

    def get_blobs(self, names, caps, deadline: float) -> dict:
        return {name: self._cat(self._blob(name), cap, deadline) for name, cap in zip(names, caps)}

    def put_entry(self, key: str, text: bytes, blobs: dict, deadline: float) -> None:
        for name, data in blobs.items():
            self._write(self._blob(name), data)
        self._write(self._entry(key), text)  # last: the manifest is the commit

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
                        raise _Deadline(f"reading {path} ran past its timeout")
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
