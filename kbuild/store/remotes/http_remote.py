"""An HTTP cache as the remote, in Bazel's remote-cache HTTP protocol:
http(s)://[user:password@]host[:port][/prefix].

    GET/PUT <prefix>/cas/<sha256 of the bytes>   a blob
    GET/PUT <prefix>/ac/<sha256 of kbuild's key>  an entry

so bazel-remote, BuildBuddy, an nginx WebDAV location, and the HTTP storage
ccache and sccache share serve kbuild unchanged. A blob is named by the
SHA-256 of its bytes, as those servers require (bazel-remote refuses a CAS
upload whose bytes have another hash); kbuild names blobs by its own hash, so
an entry's object in the action cache is a header line, the JSON
{"cas": {kbuild hash: sha256}, "kbuild": "v1"}, then the manifest's bytes.

Every read is bounded before it is read (a Content-Length over the caller's cap
is refused unread) and while it streams (by the call's deadline); a blob whose
bytes are not its SHA-256 is refused (`Tampered`) before the tier checks them
against kbuild's own hash. Basic auth comes from the URL's user and password,
which no message shows. One keep-alive connection per process (a forked child
opens its own).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import socket
import threading
from urllib.parse import unquote, urlsplit

from ...errors import ConfigError
from ..layout import LAYOUT
from ..manifest import HEX32, EntryProblem, load_json
from .base import BLOB, ENTRY, Deadline, Remote, Tampered, check_deadline
from .urls import redact

HEADER_MAX = 1 << 20  # bytes of an action-cache header line (a sha256 per blob)
_CHUNK = 1 << 20
_ERROR_BODY = 4096  # bytes of an error reply read (and dropped) to keep the connection
_SHA256 = re.compile(r"\A[0-9a-f]{64}\Z")
_PUT_OK = (200, 201, 204)
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
          http.client.CannotSendRequest, http.client.ResponseNotReady)


class HttpError(Exception):
    """The server answered a request with a status that is neither success nor absence."""


def entry_address(key: str) -> str:
    """The action-cache name of kbuild's entry `key`: a SHA-256, as the servers require."""
    return hashlib.sha256(f"kbuild {LAYOUT} entry {key}".encode()).hexdigest()


class HttpRemote(Remote):
    """Entries under /ac/, blobs under /cas/, on a Bazel-protocol HTTP cache."""

    def __init__(self, settings):
        self.name = redact(settings.url)
        parts = urlsplit(settings.url)
        label = f"{settings.where}: remote {self.name}"
        try:
            self.host, self.port = parts.hostname, parts.port
        except ValueError as exc:
            raise ConfigError(f"{label}: {exc}") from None
        if not self.host or parts.query or parts.fragment:
            raise ConfigError(f"{label}: write http(s)://[USER:PASSWORD@]HOST[:PORT][/PREFIX], "
                              "without a query")
        self.https = parts.scheme.lower() == "https"
        self.prefix = parts.path.rstrip("/")
        self.headers = {"User-Agent": "kbuild"}
        if parts.username is not None or parts.password is not None:
            pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
            self.headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        self._cas: dict[str, str] = {}  # kbuild hash -> sha256, from the entries met
        self._connection = None  # (pid, HTTPConnection)
        self._lock = threading.Lock()

    # -- the interface ---------------------------------------------------------------------

    def get(self, kind: str, name: str, cap: int, deadline: float) -> bytes | None:
        if kind == ENTRY:
            return self._get_entry(name, cap, deadline)
        sha = self._cas.get(name)
        if sha is None:
            return None  # no entry read here names it: nothing says where it is
        data = self._request("GET", f"/cas/{sha}", deadline, cap=cap)
        if data is not None and len(data) <= cap and hashlib.sha256(data).hexdigest() != sha:
            raise Tampered(f"blob {name} at {self.prefix}/cas/{sha} does not match its SHA-256")
        return data

    def put(self, kind: str, name: str, data: bytes, deadline: float) -> None:
        if kind == BLOB:
            sha = hashlib.sha256(data).hexdigest()
            self._request("PUT", f"/cas/{sha}", deadline, body=data)
            self._cas[name] = sha
            return
        names = sorted(set(json.loads(data)["artifacts"].values()))
        unsent = [n for n in names if n not in self._cas]
        if unsent:
            raise ValueError(f"entry {name} names blob {unsent[0]}, which was not sent first")
        header = json.dumps({"cas": {n: self._cas[n] for n in names}, "kbuild": LAYOUT},
                            sort_keys=True, separators=(",", ":")).encode()
        self._request("PUT", f"/ac/{entry_address(name)}", deadline, body=header + b"\n" + data)

    def remove(self, kind: str, name: str, deadline: float) -> bool:
        path = f"/ac/{entry_address(name)}" if kind == ENTRY else f"/cas/{self._cas.get(name)}"
        if kind == BLOB and name not in self._cas:
            return False
        return self._request("DELETE", path, deadline) is not None

    def exists(self, kind: str, name: str, deadline: float) -> bool:
        if kind == BLOB and name not in self._cas:
            return False
        path = f"/ac/{entry_address(name)}" if kind == ENTRY else f"/cas/{self._cas[name]}"
        return self._request("HEAD", path, deadline) is not None

    def _get_entry(self, key: str, cap: int, deadline: float) -> bytes | None:
        """The manifest of entry `key`; its blobs' SHA-256s are remembered for their reads."""
        path = f"/ac/{entry_address(key)}"
        data = self._request("GET", path, deadline, cap=cap + HEADER_MAX + 1)
        if data is None:
            return None
        line, newline, manifest = data.partition(b"\n")
        try:
            header = load_json(line.decode("utf-8"), "header", HEADER_MAX) if newline else None
        except (EntryProblem, UnicodeDecodeError):
            header = None
        cas = header.get("cas") if isinstance(header, dict) else None
        if not isinstance(cas, dict) or header.get("kbuild") != LAYOUT or not all(
                isinstance(s, str) and _SHA256.match(s) for s in cas.values()):
            raise Tampered(f"entry {key} at {self.prefix}{path} is not a kbuild {LAYOUT} entry")
        # Only for blobs this manifest names: an entry must not redirect another's reads.
        self._cas.update((n, sha) for n, sha in cas.items()
                         if isinstance(n, str) and HEX32.match(n) and n.encode() in manifest)
        return manifest[:cap + 1]  # longer than asked: cut, for the tier to refuse

    # -- HTTP ---------------------------------------------------------------------------------

    def _request(self, method: str, path: str, deadline: float, *, body: bytes | None = None,
                 cap: int = 0) -> bytes | None:
        """The body of a 2xx answer (b"" for PUT, DELETE and HEAD), None for 404; HttpError
        for another status. A connection the server closed while idle is opened again once."""
        with self._lock:
            for attempt in (1, 2):
                conn, fresh = self._connect(deadline)
                try:
                    conn.sock.settimeout(check_deadline(deadline, f"{method} {path}"))
                    conn.request(method, self.prefix + path, body=body, headers=self.headers)
                    response = conn.getresponse()
                    result = self._answer(response, method, path, cap, deadline)
                except _STALE:
                    self._drop()
                    if fresh or attempt == 2:
                        raise
                    continue
                except socket.timeout:
                    self._drop()
                    raise Deadline(f"{method} {path} ran past its timeout") from None
                except BaseException:
                    self._drop()
                    raise
                result, complete = result
                if response.will_close or not complete:
                    self._drop()
                return result
        raise AssertionError("unreachable")

    def _answer(self, response, method: str, path: str, cap: int, deadline: float):
        """(the result, whether the body was read to its end: else the connection goes)."""
        status = response.status
        if method == "GET" and status == 200:
            return self._read(response, cap, deadline, path, strict=True), True
        detail = self._read(response, _ERROR_BODY, deadline, path, strict=False)
        complete = len(detail) <= _ERROR_BODY
        if status == 404:
            return None, complete
        if method != "GET" and status in _PUT_OK:
            return b"", complete
        plain = (response.getheader("Content-Type") or "").startswith("text/plain")
        text = detail[:200].decode("utf-8", "replace").strip().splitlines()[:1] if plain else []
        hint = "; check the user and password in the URL" if status in (401, 403) else ""
        raise HttpError(f"{method} {self.prefix}{path} answered {status} {response.reason}"
                        f"{': ' + text[0] if text else ''}{hint}")

    def _read(self, response, cap: int, deadline: float, path: str, strict: bool) -> bytes:
        """At most `cap` bytes of the body, in chunks against `deadline`. When `strict` (an
        object), a declared or streamed length over `cap` is refused (`Tampered`) before
        the rest is read; otherwise (an error page) cap + 1 bytes come back."""
        declared = response.getheader("Content-Length")
        if strict and declared is not None and declared.isdigit() and int(declared) > cap:
            raise Tampered(f"{self.prefix}{path} is {declared} bytes, more than the {cap} "
                           "expected")
        chunks, total = [], 0
        while total <= cap:
            self._timeout(deadline, path)
            chunk = response.read(min(_CHUNK, cap + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if strict and total > cap:
            raise Tampered(f"{self.prefix}{path} is more than the {cap} bytes expected")
        return b"".join(chunks)

    def _timeout(self, deadline: float, path: str) -> None:
        conn = self._connection[1] if self._connection else None
        if conn is not None and conn.sock is not None:
            conn.sock.settimeout(check_deadline(deadline, f"reading {self.prefix}{path}"))

    def _connect(self, deadline: float):
        """(this process's connection, whether it was opened now)."""
        held = self._connection
        if held is not None and held[0] == os.getpid() and held[1].sock is not None:
            return held[1], False
        timeout = check_deadline(deadline, f"connecting to {self.host}")
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=timeout)
        try:
            conn.connect()
        except socket.timeout:
            raise Deadline(f"connecting to {self.host}:{conn.port} timed out") from None
        self._connection = (os.getpid(), conn)
        return conn, True

    def _drop(self) -> None:
        held, self._connection = self._connection, None
        if held is not None and held[0] == os.getpid():
            held[1].close()

