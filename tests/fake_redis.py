"""A tiny server that speaks Redis's protocol (RESP) badly on purpose, for the hostile-remote
tests: it answers every command with what a test tells it to, and counts what it sent.

`FakeRedis(answer)` listens on a free loopback port in a daemon thread; each connection
gets its own thread. `answer(command)` receives the command as a list of bytes
(``[b"GETRANGE", b"kbuild:v1:entry:<key>", b"0", b"4194304"]``) and returns the reply:
bytes sent at once, or an iterable of byte chunks sent one after the other (a generator
that sleeps between chunks trickles; one that never ends would trickle forever), or None
to close the connection without a word (a None inside the iterable closes it there,
mid-reply). The server stops sending as soon as the client
goes away, so `sent` (bytes the client took off the wire, at most a socket buffer more)
says how much of a hostile reply the client read.
"""

from __future__ import annotations

import socket
import threading
import time


def bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


OK = b"+OK\r\n"
NIL = b"$-1\r\n"


def trickle(data: bytes, pause: float = 0.05, forever: bool = False):
    """`data` one byte at a time, `pause` seconds apart (and then spaces, if `forever`)."""
    for i in range(len(data)):
        time.sleep(pause)
        yield data[i:i + 1]
    while forever:
        time.sleep(pause)
        yield b" "


def endless(header: bytes, chunk: int = 1 << 16):
    """`header`, then zero bytes without end, as fast as the client takes them."""
    yield header
    block = bytes(chunk)
    while True:
        yield block


class FakeRedis:
    """A RESP server on 127.0.0.1 that answers each command with `answer(command)`."""

    def __init__(self, answer):
        self.answer = answer
        self.commands: list[list[bytes]] = []
        self.sent = 0
        self.connections = 0
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def url(self, prefix: str = "kbuild:") -> str:
        return f"redis://127.0.0.1:{self.port}/0?prefix={prefix}"

    def stop(self) -> None:
        """Stop accepting; the listener's descriptor is closed only once the accepting
        thread has returned. Closed under a thread about to call accept(), its number could
        be another test's socket by then, whose connections this server would take."""
        self.closed.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept()
        except OSError:
            pass
        self._acceptor.join(timeout=10)
        self._listener.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            while not self.closed.is_set():
                command = _read_command(reader)
                if command is None:
                    return
                self.commands.append(command)
                reply = self.answer(command)
                if reply is None:
                    return
                for chunk in [reply] if isinstance(reply, bytes) else reply:
                    if chunk is None:
                        return
                    conn.sendall(chunk)
                    with self._lock:
                        self.sent += len(chunk)
        except OSError:
            return  # the client went away: stop sending
        finally:
            reader.close()
            conn.close()


def _read_command(reader) -> list[bytes] | None:
    """One command as a client sends it: an array of bulk strings."""
    line = reader.readline()
    if not line.startswith(b"*"):
        return None
    args = []
    for _ in range(int(line[1:])):
        size = int(reader.readline()[1:])
        args.append(reader.read(size + 2)[:-2])
    return args


class Honest:
    """An `answer` that keeps strings as Redis does (GET, GETRANGE, SET, MULTI/EXEC, AUTH,
    SELECT, PING), for tests that change one reply and keep the rest true. `override(command)`
    is asked first; what it returns other than None is the reply."""

    def __init__(self, override=None):
        self.data: dict[bytes, bytes] = {}
        self.override = override
        self._queued: list | None = None

    def __call__(self, command):
        if self.override is not None:
            reply = self.override(command)
            if reply is not None:
                return reply
        name = command[0].upper()
        if self._queued is not None and name not in (b"EXEC", b"DISCARD"):
            self._queued.append(command)
            return b"+QUEUED\r\n"
        if name == b"MULTI":
            self._queued = []
            return OK
        if name == b"EXEC":
            queued, self._queued = self._queued or [], None
            return b"*%d\r\n" % len(queued) + b"".join(self._run(c) for c in queued)
        return self._run(command)

    def _run(self, command) -> bytes:
        name, args = command[0].upper(), command[1:]
        if name == b"SET":
            self.data[args[0]] = args[1]
            return OK
        if name == b"GET":
            return bulk(self.data[args[0]]) if args[0] in self.data else NIL
        if name == b"GETRANGE":
            value = self.data.get(args[0], b"")
            return bulk(value[int(args[1]):int(args[2]) + 1])
        if name == b"HELLO":  # redis-py 8 asks for RESP3 first
            return b"%1\r\n$5\r\nproto\r\n:3\r\n"
        if name == b"PING":
            return b"+PONG\r\n"
        return OK  # AUTH, SELECT, CLIENT ...
