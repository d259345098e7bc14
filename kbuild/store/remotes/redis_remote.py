"""A Redis server as the remote: redis://[:password@]host:port/db[?prefix=kbuild:]
(rediss:// for TLS, unix:// for a socket).

STRING keys <prefix>v1:entry:<key> (manifest JSON) and <prefix>v1:blob:<hash>
(bytes); eviction is Redis's (allkeys-lru).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...errors import ConfigError
from .. import resp
from ..layout import LAYOUT
from .base import BLOB, ENTRY, Remote
from .urls import redact

DEFAULT_PREFIX = "kbuild:"
SCHEMES = ("redis", "rediss", "unix")


class RedisRemote(Remote):
    """Entries and blobs as Redis strings under a prefix; Redis evicts (allkeys-lru).

    The URL is read as redis-py reads it (`parse_url`: host, port, db, user, password,
    rediss:// for TLS with its ssl_* options, unix://), but the protocol is spoken by
    `resp`: every reply is bounded in size at its header and by the call's deadline while
    it streams, and must be of the type the command gives (redis-py would read any size,
    time out only a silent socket, and hand back an integer where a string was asked).
    """

    def __init__(self, settings):
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

    def _name(self, kind: str, name: str) -> str:
        return f"{self.prefix}{LAYOUT}:{kind}:{name}"

    def get(self, kind: str, name: str, cap: int, deadline: float) -> bytes | None:
        # GETRANGE, not GET: an honest server cuts a huge value at the cap (which then
        # fails its checks); a reply longer than that is refused before it is read.
        def read(conn):
            conn.send([("GETRANGE", self._name(kind, name), 0, cap)], deadline)
            return conn.read_string(cap + 1, deadline, f"a{'n' * (kind == ENTRY)} {kind} read") \
                or None
        return self._with_connection(read, deadline)

    def put(self, kind: str, name: str, data: bytes, deadline: float) -> None:
        def write(conn):
            conn.send([("SET", self._name(kind, name), data)], deadline)
            conn.read_status(deadline, "SET")
        self._with_connection(write, deadline)

    def remove(self, kind: str, name: str, deadline: float) -> bool:
        def delete(conn):
            conn.send([("DEL", self._name(kind, name))], deadline)
            return conn.read_integer(deadline, "DEL") > 0
        return self._with_connection(delete, deadline)

    def get_blobs(self, names, caps, deadline: float) -> dict:
        def read(conn):
            conn.send([("GETRANGE", self._name(BLOB, n), 0, cap) for n, cap in zip(names, caps)],
                      deadline)
            return {n: conn.read_string(cap + 1, deadline, "a blob read") or None
                    for n, cap in zip(names, caps)}
        return self._with_connection(read, deadline)

    def put_entry(self, key: str, data: bytes, blobs: dict, deadline: float) -> None:
        # One MULTI/EXEC: no reader sees the manifest without the blobs it names.
        sets = [("SET", self._name(BLOB, name), data) for name, data in blobs.items()]
        sets.append(("SET", self._name(ENTRY, key), data))

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
