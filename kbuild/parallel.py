"""Compile targets in forked worker processes.

Workers are forked from the process that already imported numba and the
project's modules and keyed every target, so a worker starts compiling at
once instead of paying numba's import again. Each worker returns plain bytes
and strings; only the parent writes to the store.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed

from .errors import CompileError

_PLAN = None  # the parent's plan, inherited by forked workers


def compile_in_workers(the_plan, todo, jobs: int):
    """Yield (target, Artifacts or CompileError, seconds) as workers finish."""
    global _PLAN
    if "fork" not in multiprocessing.get_all_start_methods():
        from .build import compile_target

        for target in todo:
            yield (target,) + compile_target(the_plan, target)
        return
    _PLAN = the_plan
    the_plan._work_order = list(todo)
    context = multiprocessing.get_context("fork")
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=context)
    try:
        futures = {pool.submit(_work, i): target for i, target in enumerate(todo)}
        for future in as_completed(futures):
            target = futures[future]
            try:
                outcome, seconds = future.result()
            except Exception as exc:  # noqa: BLE001 - a worker died
                outcome, seconds = CompileError(f"worker failed: {exc}"), 0.0
            yield target, outcome, seconds
    finally:
        # A caller that stops early (a failure without -k) cancels what has not started.
        pool.shutdown(wait=True, cancel_futures=True)
        _PLAN = None


def _work(i: int):
    from .build import compile_target

    # Targets are handed out in arch-sorted order; look them up in the inherited plan.
    return compile_target(_PLAN, _PLAN._work_order[i])
