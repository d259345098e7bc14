"""Run compile and link jobs in forked worker processes.

Workers are forked from the process that already imported numba and the
project's modules and keyed every target, so a worker starts compiling at
once instead of paying numba's import again. Each worker returns plain bytes
and strings; only the parent writes to the store.

The pool is a small one of kbuild's own, one socket pair per worker, because
a standard pool cannot stop one stuck job: with a time limit per job the
parent waits on every busy worker's socket with the earliest deadline as its
timeout, SIGKILLs a worker past its deadline (a compile numba types for
minutes never returns on its own) and forks a replacement for the jobs left.
A job may send notes before its result (what its compile has read so far):
a job killed for its time keeps them, to record what its failure depended on.

Workers are forked only from a process that runs no other Python thread: a fork copies
another thread stopped wherever it was, with any lock it held (Python 3.12 warns "This
process is multi-threaded, use of fork() may lead to deadlocks in the child"). The
`kbuild` command starts none before it compiles (a C library's own pool, such as
OpenBLAS's, stops itself at a fork); a program that calls kbuild with threads of its own
running (a pytest-xdist worker, an application) has its jobs run here, one at a time, as
on a system without fork. A time limit cannot stop a job run here: with one set, jobs
are still forked and Python's warning stands.

Workers die with the build: each asks the kernel for SIGKILL when its parent
dies (Linux's PR_SET_PDEATHSIG) and leaves at once if the parent is already
gone, and each closes its inherited copies of the store's lock descriptors.
A SIGKILLed build therefore leaves no orphan compiling, and no orphan holding
a lock the next build would wait on forever. A build that stops early (a
failure without -k, Ctrl-C) kills the jobs still running: their results would
be dropped anyway.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from ..errors import CompileError
from ..store.locks import close_inherited

_PR_SET_PDEATHSIG = 1

_NOTES: Connection | None = None  # in a worker whose jobs have a time limit: where notes go


class TimedOut(Exception):
    """A job's outcome when it ran past its time limit and was killed; `notes` are the
    notes it sent before."""

    def __init__(self, limit: float, notes: list):
        super().__init__(f"took longer than {limit:g}s")
        self.limit, self.notes = limit, notes


def note(value) -> None:
    """In a worker with a time limit, send `value` to the parent (kept if the job is
    killed); elsewhere nothing."""
    if _NOTES is not None:
        _NOTES.send(("note", value))


def run_in_workers(fn, items, jobs: int, *, timeout: float | None = None, started=None):
    """Yield (item, fn(item)'s outcome, seconds) as workers finish; fn returns
    (outcome, seconds) and runs in a worker forked from this process. A job running
    longer than `timeout` seconds is killed: its outcome is `TimedOut`. `started(item)`
    is called as each job is handed to a worker."""
    items = list(items)
    if not items:
        return
    if "fork" not in multiprocessing.get_all_start_methods() or \
            (timeout is None and other_threads()):
        for item in items:  # no (safe) fork: here, and without a limit
            if started is not None:
                started(item)
            yield (item,) + fn(item)
        return
    # Keep the collector off the inherited heap: a collection in a worker writes to every
    # object it visits, copying the parent's pages (numba's are many) into the worker.
    gc.freeze()
    pool = _Pool(fn, items, min(jobs, len(items)), timeout, started)
    try:
        yield from pool.results()
    finally:
        pool.close()
        gc.unfreeze()


def other_threads() -> bool:
    """Whether a Python thread besides this one is running: forking now would copy it
    stopped, with whatever lock it held."""
    current = threading.current_thread()
    return any(t is not current and t.is_alive() for t in threading.enumerate())


@dataclass
class _Worker:
    pid: int
    conn: Connection
    job: int | None = None
    since: float = 0.0
    notes: list = field(default_factory=list)


class _Pool:
    def __init__(self, fn, items, size: int, timeout, started):
        self.fn, self.items, self.size = fn, items, size
        self.timeout, self.started = timeout, started
        self.todo = deque(range(len(items)))
        self.workers: list[_Worker] = []

    def results(self):
        for _ in range(self.size):
            self._hand_out(self._fork())
        while True:
            busy = [w for w in self.workers if w.job is not None]
            if not busy:
                return
            ready = wait([w.conn for w in busy], self._wait_for(busy))
            for worker in busy:
                done = self._receive(worker) if worker.conn in ready else None
                # A job that keeps sending notes is stopped at its deadline all the same.
                if done is None and self._expired(worker):
                    done = self._stop(worker)
                if done is not None:
                    yield done

    def _wait_for(self, busy) -> float | None:
        if self.timeout is None:
            return None
        first = min(w.since for w in busy) + self.timeout
        return max(0.0, first - time.monotonic())

    def _expired(self, worker: _Worker) -> bool:
        return self.timeout is not None and time.monotonic() - worker.since >= self.timeout

    def _receive(self, worker: _Worker):
        """The finished job's (item, outcome, seconds), or None after a note."""
        item = self.items[worker.job]
        try:
            kind, value = worker.conn.recv()
        except (EOFError, OSError):
            return item, CompileError(f"worker failed: {self._death(worker)}"), 0.0
        if kind == "note":
            worker.notes.append(value)
            return None
        self._hand_out(worker)
        return (item,) + tuple(value)

    def _stop(self, worker: _Worker):
        """Kill a job past its limit; a fresh worker takes the jobs left."""
        item, notes = self.items[worker.job], worker.notes
        self._kill(worker)
        self.workers.remove(worker)
        if self.todo:
            self._hand_out(self._fork())
        return item, TimedOut(self.timeout, notes), time.monotonic() - worker.since

    def _death(self, worker: _Worker) -> str:
        """Reap a worker that died mid-job (the OOM killer, a crash in a C library)."""
        self.workers.remove(worker)
        worker.conn.close()
        status = _reap(worker.pid)
        if self.todo:
            self._hand_out(self._fork())
        if os.WIFSIGNALED(status):
            return f"killed by signal {os.WTERMSIG(status)}"
        return f"exited with status {os.waitstatus_to_exitcode(status)}"

    def _hand_out(self, worker: _Worker) -> None:
        worker.job, worker.notes = None, []
        if not self.todo:
            return
        worker.job = self.todo.popleft()
        worker.since = time.monotonic()
        if self.started is not None:
            self.started(self.items[worker.job])
        worker.conn.send(worker.job)

    def _fork(self) -> _Worker:
        ours, theirs = socket.socketpair()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker: never returns into the parent's code
            code = 1
            try:
                ours.close()
                for other in self.workers:
                    other.conn.close()
                code = _serve(Connection(theirs.detach()), parent, self.fn, self.items,
                              self.timeout is not None)
            finally:
                os._exit(code)
        theirs.close()
        worker = _Worker(pid, Connection(ours.detach()))
        self.workers.append(worker)
        return worker

    def close(self) -> None:
        """Kill the jobs still running (a build that stopped early drops them); idle
        workers leave when their socket closes."""
        for worker in self.workers:
            if worker.job is not None:
                self._kill(worker)
            else:
                worker.conn.close()
                _reap(worker.pid)
        self.workers = []

    @staticmethod
    def _kill(worker: _Worker) -> None:
        try:
            os.kill(worker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        worker.conn.close()
        _reap(worker.pid)


def _reap(pid: int) -> int:
    """Wait for a worker to be gone; its wait status (0 if someone else reaped it)."""
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:  # a program that ignores SIGCHLD: the kernel reaped it
        return 0


def _serve(conn: Connection, parent: int, fn, items, noting: bool) -> int:
    """A worker's life: jobs by index until the parent closes the socket."""
    global _NOTES
    _worker_start(parent)
    _NOTES = conn if noting else None
    while True:
        try:
            index = conn.recv()
        except (EOFError, OSError):
            return 0
        try:
            outcome = fn(items[index])
        except BaseException as exc:  # noqa: BLE001 - reported in the row, never a crash
            outcome = (CompileError(f"worker failed: {type(exc).__name__}: {exc}"), 0.0)
        try:
            conn.send(("done", outcome))
        except Exception as exc:  # noqa: BLE001 - an outcome that cannot be sent
            conn.send(("done", (CompileError(f"worker failed: {exc}"), outcome[1])))


def die_with(parent: int) -> None:
    """A worker or the background helper at start-up: be killed when `parent` dies; drop
    the parent's lock descriptors."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # no prctl: the parent-pid check below still catches a parent already gone
    if os.getppid() != parent:
        os._exit(1)
    close_inherited()


def _worker_start(parent: int) -> None:
    # Ctrl-C reaches the whole process group: the parent stops the build and reports;
    # a worker is killed by it instead of printing a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with(parent)
