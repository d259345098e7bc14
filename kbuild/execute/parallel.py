"""Run compile and link jobs in forked worker processes.

Workers are forked from the process that already imported numba and the
project's modules and keyed every target, so a worker starts compiling at
once instead of paying numba's import again. Each worker returns plain bytes
and strings; only the parent writes to the store.

Workers die with the build: each asks the kernel for SIGKILL when its parent
dies (Linux's PR_SET_PDEATHSIG) and leaves at once if the parent is already
gone, and each closes its inherited copies of the store's lock descriptors.
A SIGKILLed build therefore leaves no orphan compiling, and no orphan holding
a lock the next build would wait on forever.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed

from ..errors import CompileError
from ..store.locks import close_inherited

_PR_SET_PDEATHSIG = 1

_JOB = None  # (function, items): inherited by forked workers, which are handed indices


def run_in_workers(fn, items, jobs: int):
    """Yield (item, fn(item)'s outcome, seconds) as workers finish; fn returns
    (outcome, seconds) and runs in a worker forked from this process."""
    global _JOB
    items = list(items)
    if "fork" not in multiprocessing.get_all_start_methods():
        for item in items:
            yield (item,) + fn(item)
        return
    _JOB = (fn, items)
    # Keep the collector off the inherited heap: a collection in a worker writes to every
    # object it visits, copying the parent's pages (numba's are many) into the worker.
    gc.freeze()
    context = multiprocessing.get_context("fork")
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=context,
                               initializer=_worker_start, initargs=(os.getpid(),))
    try:
        futures = {pool.submit(_work, i): item for i, item in enumerate(items)}
        for future in as_completed(futures):
            item = futures[future]
            try:
                outcome, seconds = future.result()
            except Exception as exc:  # noqa: BLE001 - a worker died
                outcome, seconds = CompileError(f"worker failed: {exc}"), 0.0
            yield item, outcome, seconds
    finally:
        # A caller that stops early (a failure without -k) cancels what has not started.
        pool.shutdown(wait=True, cancel_futures=True)
        gc.unfreeze()
        _JOB = None


def _die_with(parent: int) -> None:
    """Worker start-up: be killed when `parent` dies; drop the parent's lock descriptors."""
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
    _die_with(parent)
    # Ctrl-C reaches the whole process group: the parent stops the build and reports;
    # a worker finishes its job quietly instead of printing a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _work(i: int):
    fn, items = _JOB
    return fn(items[i])
