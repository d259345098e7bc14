"""Redis's protocol (RESP2), spoken by kbuild itself so that no reply is trusted.

A remote cache is written by others, so its server is as untrusted as its
contents. redis-py reads whatever a server declares (a 1.2 GB bulk string is
1.2 GB of memory) with a timeout per socket read (a server that trickles a byte
now and then is never timed out). This client reads every reply against two
bounds: its size, checked at its header before the value is read (the caller
says how many bytes it asked for), and a deadline for the whole call, so a
trickling server is dropped when the call's time is up. A reply of another type
than the command can give, an error, a line without end or a connection closed
mid-reply raises, and the connection, whose state is then unknown, is closed.

Only what the remote tier needs: connect (TCP, TLS or a Unix socket, with
redis-py's reading of the URL), AUTH, SELECT, and commands whose replies are
simple strings, bulk strings and flat arrays of those.
"""

from __future__ import annotations

import socket
import time

LINE_MAX = 1024  # bytes of a simple string, an error or a length line
_READ = 1 << 16


class ProtocolError(Exception):
    """The server broke the protocol or a bound; the connection is closed."""


class ReplyError(Exception):
    """The server answered with an error reply (``-ERR ...``)."""


class Deadline(TimeoutError):
    """The call's time ran out while the server was still sending (or silent)."""


_KINDS = {b":": "an integer", b"*": "an array", b"+": "a simple string", b"$": "a string"}


class Connection:
    """One socket to a Redis server, with a bounded reader over it."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buffer = bytearray()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, commands, deadline: float) -> None:
        """Write the commands (each a sequence of str/bytes/int arguments) at once."""
        self.sock.settimeout(_left(deadline))
        self.sock.sendall(b"".join(pack(*command) for command in commands))

    def read_string(self, cap: int, deadline: float, what: str) -> bytes:
        """A bulk string of at most `cap` bytes (nil, another type, or more is an error)."""
        kind, value = self._reply(cap, deadline, what)
        if kind != b"$" or value is None:
            raise ProtocolError(f"answered {what} with {_named(kind, value)}, not a string")
        return value

    def read_status(self, deadline: float, what: str, expect: bytes = b"OK") -> None:
        """A simple string reply `expect` (+OK, +QUEUED)."""
        kind, value = self._reply(LINE_MAX, deadline, what)
        if kind != b"+" or value != expect:
            raise ProtocolError(f"answered {what} with {_named(kind, value)}, "
                                f"not {expect.decode()}")

    def read_integer(self, deadline: float, what: str) -> int:
        """An integer reply (what DEL gives)."""
        kind, value = self._reply(LINE_MAX, deadline, what)
        if kind != b":":
            raise ProtocolError(f"answered {what} with {_named(kind, value)}, not an integer")
        return value

    def read_statuses(self, count: int, deadline: float, what: str) -> None:
        """An array of `count` +OK replies (what EXEC gives for `count` SETs)."""
        kind, value = self._reply(LINE_MAX, deadline, what, items=count)
        if kind != b"*" or value is None or len(value) != count:
            raise ProtocolError(f"answered {what} with {_named(kind, value)}, "
                                f"not {count} replies")
        for item_kind, item in value:
            if item_kind != b"+" or item != b"OK":
                raise ProtocolError(f"answered {what} with {_named(item_kind, item)}, not OK")

    # -- the reader -----------------------------------------------------------------------

    def _reply(self, cap: int, deadline: float, what: str, items: int = 0):
        """(type byte, value) of one reply: an error raises ReplyError; a string longer than
        `cap` or an array of more than `items` elements (nested: none) raises at its
        header, before what it declares is read."""
        line = self._line(deadline)
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            raise ReplyError(rest.decode("utf-8", "replace")[:300] or "an empty error")
        if kind == b"+":
            return kind, rest
        if kind == b":":
            return kind, _number(rest)
        if kind == b"$":
            size = _number(rest)
            if size == -1:
                return kind, None
            if size < 0:
                raise ProtocolError(f"answered {what} with a string of length {size}")
            if size > cap:
                raise ProtocolError(f"answered {what} with a string of {size} bytes, larger "
                                    f"than the {cap} asked for")
            return kind, self._exact(size, deadline)
        if kind == b"*":
            count = _number(rest)
            if count == -1:
                return kind, None
            if not 0 <= count <= items:
                raise ProtocolError(f"answered {what} with an array of {count} elements, "
                                    f"where {items or 'none'} were expected")
            return kind, [self._reply(cap, deadline, what) for _ in range(count)]
        raise ProtocolError(f"answered {what} with a reply of unknown type {bytes(kind)!r}")

    def _line(self, deadline: float) -> bytes:
        start = 0
        while True:
            end = self._buffer.find(b"\r\n", start)
            if end >= 0:
                break
            if len(self._buffer) > LINE_MAX:
                raise ProtocolError(f"sent a reply line longer than {LINE_MAX} bytes")
            start = max(len(self._buffer) - 1, 0)
            self._fill(deadline)
        if end > LINE_MAX:
            raise ProtocolError(f"sent a reply line longer than {LINE_MAX} bytes")
        line = bytes(self._buffer[:end])
        del self._buffer[:end + 2]
        return line

    def _exact(self, size: int, deadline: float) -> bytes:
        while len(self._buffer) < size + 2:
            self._fill(deadline, size + 2 - len(self._buffer))
        if self._buffer[size:size + 2] != b"\r\n":
            raise ProtocolError("sent a string not followed by CRLF")
        value = bytes(self._buffer[:size])
        del self._buffer[:size + 2]
        return value

    def _fill(self, deadline: float, wanted: int = _READ) -> None:
        """Read what the server sent (at most what the reply still needs, so the buffer
        never holds more than the bounded reply), within the call's deadline."""
        self.sock.settimeout(_left(deadline))
        try:
            chunk = self.sock.recv(max(min(wanted, 1 << 20), 1))
        except socket.timeout:
            raise Deadline("the server did not finish its reply in time") from None
        if not chunk:
            raise ProtocolError("closed the connection mid-reply")
        self._buffer += chunk


def pack(*args) -> bytes:
    """A command as RESP: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise Deadline("the call's time ran out")
    return left


def _number(text: bytes) -> int:
    if not 0 < len(text) <= 20 or not text.lstrip(b"-").isdigit():
        raise ProtocolError(f"sent a malformed length or integer {text[:40]!r}")
    return int(text)


def _named(kind: bytes, value) -> str:
    if value is None:
        return "nil"
    return _KINDS.get(kind, "a reply")
