"""`kbuild build`: a row for every target of a plan, through the build service.

What the store holds fresh is a `cached` row, a failure recorded for an unchanged key a
`failed` one; the rest go to the build service (`service`), which waits for targets
another build is compiling (per-key locks) rather than compiling them twice, and
compiles what is left in two waves (the targets that make missing device function
objects first, then the ones relinked from stored objects), here in worker processes
or on an executor's cluster. This module orders the rows, stops after a failure (unless
`keep_going`), reports progress and records the build's counts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ..discover import Target
from ..model import RowStatus
from ..store.local import Store
from ..store.maintenance import record_build
from .failures import recorded_failure
from .planning import Plan
from .row import Row
from .service import BuildService


def build(the_plan: Plan, store: Store, *, keep_going: bool = False, jobs: int = 1,
          progress=None, executor=None, target_timeout: float | None = None,
          retry_failed: bool = False) -> list[Row]:
    """Build what is out of date; return one row per target, in plan order.

    `executor` (e.g. an `execute.distributed.DaskExecutor`) compiles instead of local
    processes; its workers run `cluster.run_job`.
    `progress(row, done, total)` is called as each row is known; a `progress.started(target)`
    method, where the callback has one, as each compile or link starts. `target_timeout`
    (seconds; default the config's, 0 for none) stops a compile that runs longer: it fails
    alone. A failure recorded for an unchanged key fails at once unless `retry_failed`.
    """
    limit = the_plan.config.target_timeout if target_timeout is None else target_timeout
    workers = Workers(jobs, limit or None, getattr(progress, "started", None), retry_failed)
    if not store.read_only:
        store.check_root()  # a file at the store path fails here, not with a warning per target
        with store.shared():  # gc and clean wait for the build; it never loses what it made
            return _build(the_plan, store, keep_going, workers, progress, executor)
    return _build(the_plan, store, keep_going, workers, progress, executor)


@dataclass(frozen=True)
class Workers:
    """How targets compile: `jobs` at once, each stopped after `timeout` seconds (None:
    never; with a limit even one job runs in a worker process, which can be killed),
    `started(target)` told as each begins; `retry` compiles recorded failures again."""

    jobs: int = 1
    timeout: float | None = None
    started: object = None
    retry: bool = False


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else (os.cpu_count() or 1))


def _build(the_plan, store, keep_going, workers, progress, executor) -> list[Row]:
    service = BuildService(the_plan, store)
    rows: dict[Target, Row] = {}
    todo = []
    for target in the_plan.targets:
        row = service.cached(target)
        if row is None and not (workers.retry or store.read_only):
            row = recorded_failure(the_plan, store, target, service.current, workers.timeout)
        if row is None:
            todo.append(target)
            continue
        rows[target] = row
        _progress(progress, rows[target], len(rows), the_plan.total)
    if todo and store.read_only:
        for target in todo:
            rows[target] = Row.of(
                target, the_plan.keys[target].digest, RowStatus.FAILED,
                error="not in the read-only store (build it where the store is writable)")
        todo = []
    if todo:
        store.ensure_writable()
    # Targets that could not be imported or keyed: a failed row each, reported like any other.
    for target, error in the_plan.failed.items():
        rows[target] = Row.of(target, None, RowStatus.FAILED, error=str(error))
        _progress(progress, rows[target], len(rows), the_plan.total)
    # The rest are skipped after an import failure or a recorded one, as after any failure.
    stopped = (the_plan.import_failed or any(r.recorded for r in rows.values())) \
        and not keep_going
    with service.locks([] if stopped else todo) as locks:
        stop = _compile_batch(service, locks.take_mine(rows), workers, keep_going, rows,
                              progress, executor)
        # Ours are committed: let go of them before waiting, or two builds that split the keys
        # between them would each wait for the other's locks forever.
        locks.release_mine()
        if not stop and not stopped:
            stop = _compile_batch(service, locks.wait_for_others(rows), workers, keep_going,
                                  rows, progress, executor)
    # What read state compiles fill out of their order (compiled in another worker than
    # the compile filling it, served from a build where that compile failed): compiled
    # again, in order, its objects replacing those it was linked from.
    again = [] if stop or stopped or store.read_only else service.out_of_order()
    if again:
        _finish_all(service, service.in_order(again, replace(workers, jobs=1)), keep_going,
                    rows, progress, replace_objects=True)
    for target in todo:
        if target not in rows:
            rows[target] = Row.of(
                target, the_plan.keys[target].digest, RowStatus.SKIPPED,
                error="not built: an earlier target failed (use -k to keep going)")
            _progress(progress, rows[target], len(rows), the_plan.total)
    ordered = [rows[t] for t in [*the_plan.targets, *the_plan.failed]]
    record_build(store, {s.value: sum(r.status == s for r in ordered) for s in RowStatus},
                 project=the_plan.config.name)
    return ordered


def _compile_batch(service, batch, workers, keep_going, rows, progress, executor=None) -> bool:
    """Compile and commit `batch` (through the build service); True when a failure stops
    the build."""
    return _finish_all(service, service.compile_all(batch, workers, executor), keep_going,
                       rows, progress)


def _finish_all(service, outcomes, keep_going, rows, progress, *,
                replace_objects: bool = False) -> bool:
    """Commit each of `outcomes` (see `_compile_batch`) as it comes."""
    stop = False
    for target, outcome, seconds in outcomes:
        row = rows[target] = service.finish(target, outcome, seconds,
                                            replace_objects=replace_objects)
        _progress(progress, row, len(rows), service.plan.total)
        if row.status == RowStatus.FAILED and not keep_going:
            stop = True
            break  # stop pulling: the sequential generator compiles only on demand
    outcomes.close()
    return stop


def _progress(progress, row, done, total):
    if progress is not None:
        progress(row, done, total)
