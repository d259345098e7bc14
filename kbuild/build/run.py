"""The build: key every target, take what the store has, compile the rest, commit.

Targets another build is compiling are waited for (per-key locks) rather than compiled
twice. What is left compiles in two waves: the targets that make missing device
function objects first, then the ones relinked from stored objects (or compiled),
here in worker processes or on an executor's cluster.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..config import arch_cc
from ..discover import Target
from ..execute.parallel import TimedOut, run_in_workers
from ..keying.objects import Recipe, Unresolved, resolve
from ..model import Cutoff, LinkMode, RowStatus
from ..store.local import Store
from ..store.locks import KeyLock
from ..store.maintenance import record_build
from . import cluster, cutoff
from .compile import Relink, compile_target, link_target
from .cutoff import StoredObjects
from .entries import commit, current_digests, fresh_entry, launchable
from .failures import CompileTimeout, forget_failure, recorded_failure, remember_failure
from .planning import Plan
from .row import Row


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
    rows: dict[Target, Row] = {}
    todo = []
    current = current_digests(the_plan)
    for target in the_plan.targets:
        key = the_plan.keys[target].digest
        manifest = fresh_entry(the_plan, store, target, current)
        failed = None if manifest is not None or workers.retry or store.read_only else \
            recorded_failure(the_plan, store, target, current, workers.timeout)
        if manifest is not None:
            rows[target] = Row.of(target, key, RowStatus.CACHED, artifacts=launchable(manifest))
        elif failed is not None:
            rows[target] = failed
        else:
            todo.append(target)
            continue
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
    with _KeyLocks(store, the_plan, [] if stopped else todo, current) as locks:
        stop = _compile_batch(the_plan, store, locks.take_mine(rows), workers, keep_going, rows,
                              progress, executor, current)
        # Ours are committed: let go of them before waiting, or two builds that split the keys
        # between them would each wait for the other's locks forever.
        locks.release_mine()
        if not stop and not stopped:
            _compile_batch(the_plan, store, locks.wait_for_others(rows), workers, keep_going,
                           rows, progress, executor, current)
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


def _compile_batch(the_plan, store, batch, workers, keep_going, rows, progress,
                   executor=None, current=None) -> bool:
    """Compile and commit `batch`; True when a failure stops the build."""
    outcomes = _compile_all(the_plan, store, batch, workers, executor, current)
    stop = False
    for target, outcome, seconds in outcomes:
        key = the_plan.keys[target].digest
        if isinstance(outcome, Exception):
            row = Row.of(target, key, RowStatus.FAILED, seconds, error=str(outcome))
            remember_failure(the_plan, store, target, outcome, seconds, current)
        else:
            artifacts = commit(store, the_plan, target, outcome, seconds, current)
            cutoff.record(store, the_plan.config.name, target.arch, outcome, artifacts)
            forget_failure(store, key)
            row = Row.of(target, key, RowStatus.BUILT, seconds, artifacts,
                         link=_link_mode(outcome.link), note=outcome.link.get("reason"),
                         cutoff=Cutoff(outcome.cutoff) if outcome.cutoff else None)
        rows[target] = row
        _progress(progress, row, len(rows), the_plan.total)
        if row.status == RowStatus.FAILED and not keep_going:
            stop = True
            break  # stop pulling: the sequential generator compiles only on demand
    outcomes.close()
    return stop


class _KeyLocks:
    """Per-key locks for one build: compile what nobody else is compiling first,
    then wait for the others and take their entries (or compile them if they failed)."""

    def __init__(self, store: Store, the_plan: Plan, todo, current):
        self.store, self.the_plan, self.current = store, the_plan, current
        self.locks = {t: KeyLock(store.root, the_plan.keys[t].digest) for t in todo}
        self.mine = [t for t in todo if self.locks[t].try_acquire()]
        # Waiters take locks in one global order (by key), so they never wait in a cycle.
        self.others = sorted((t for t in todo if t not in self.mine),
                             key=lambda t: the_plan.keys[t].digest)

    def take_mine(self, rows) -> list:
        """Our locked targets still missing: another build may have committed one between
        our lookup and our lock."""
        return [t for t in self.mine if not self._take_cached(t, rows)]

    def release_mine(self) -> None:
        for target in self.mine:
            self.locks[target].release()

    def wait_for_others(self, rows) -> list:
        """Targets another process held: cached rows for those it finished, the rest to build."""
        left = []
        for target in self.others:
            self.locks[target].acquire()
            if self._take_cached(target, rows):
                self.locks[target].release()
            else:
                left.append(target)  # its builder failed or died: ours now, lock kept
        return left

    def _take_cached(self, target, rows) -> bool:
        manifest = fresh_entry(self.the_plan, self.store, target, self.current)
        if manifest is not None:
            rows[target] = Row.of(target, self.the_plan.keys[target].digest,
                                  RowStatus.CACHED, artifacts=launchable(manifest))
        return manifest is not None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for lock in self.locks.values():
            lock.release()


def _link_mode(link: dict) -> LinkMode | None:
    mode = link.get("mode")
    return None if mode is None else LinkMode(mode)


def _progress(progress, row, done, total):
    if progress is not None:
        progress(row, done, total)


def _compile_all(the_plan: Plan, store: Store, todo, workers, executor=None, current=None):
    """Yield (target, Artifacts or exception, seconds): relink what stored objects allow,
    compile the rest (on `executor`'s cluster when it has one that answers).

    A target whose kernel object is stored but one of whose callees changed needs that
    callee's new object; one such target per missing object is compiled first (which
    makes the object), then the others are relinked with it.
    """
    order = {t: i for i, t in enumerate(the_plan.targets)}
    todo = sorted(todo, key=lambda t: (arch_cc(t.arch), order[t]))
    if executor is not None and not (todo and executor.start(the_plan.config)):
        executor = None  # nothing to do, or no cluster: compile here
    try:
        yield from _waves(the_plan, store, todo, workers, executor, current)
    finally:
        if executor is not None:
            executor.close()  # one connection serves both waves


def _waves(the_plan: Plan, store: Store, todo, workers, executor, current=None):
    """Compile the targets that make missing objects, then relink (or compile) the rest."""
    recipes, first, waiting = {}, [], []
    makers = set()
    nodes = the_plan.nodes_by_ident()
    lookups = {}
    current = current or current_digests(the_plan)
    for target in todo:
        lookup = lookups.setdefault(target.arch, StoredObjects(store, target.arch, current))
        found = _recipe(the_plan, lookup, target, nodes)
        if isinstance(found, Relink):
            recipes[target] = found
        elif found.missing is not None and (target.arch, found.missing) not in makers:
            makers.add((target.arch, found.missing))
            first.append(target)
        elif found.missing is not None:
            waiting.append(target)
        else:
            first.append(target)
    yield from _run(the_plan, [(t, None) for t in first], workers, store, executor, lookups)
    later = []
    for target in waiting:
        found = _recipe(the_plan, lookups[target.arch], target, nodes)
        if isinstance(found, Relink):
            recipes[target] = found
        else:
            later.append(target)
    yield from _run(the_plan, [(t, recipes[t]) for t in todo if t in recipes]
                    + [(t, None) for t in later], workers, store, executor, lookups)


def relink_recipe(the_plan: Plan, store: Store, target: Target, current):
    """How to link `target` from stored objects whose observations all hold (a `Relink`
    for `link_target`), or None: it must be compiled. For one target at a time (the
    zero-config session); a build plans its waves with `_recipe` itself."""
    found = _recipe(the_plan, StoredObjects(store, target.arch, current), target,
                    the_plan.nodes_by_ident())
    return found if isinstance(found, Relink) else None


def _recipe(the_plan: Plan, lookup: StoredObjects, target: Target, nodes: dict):
    if not the_plan.separate:
        return Unresolved("separate compilation is off")
    if target.launch is not None:
        return Unresolved("built for one launch configuration")
    try:
        found = resolve(the_plan.keys[target], nodes, lookup)
    except (KeyError, TypeError, ValueError):
        # A stored object valid on its own but not as the kind the recipe needs (a device
        # object's manifest under a kernel object's key): compile instead of relinking.
        return Unresolved("a stored object does not fit the recipe")
    if not isinstance(found, Recipe):
        return found
    rows = {}
    for key, _ in found.objects:
        held = lookup.held(key)
        if not held:
            return Unresolved(f"what object {key} was compiled against changed")
        rows.update({(o.kind.value, o.name): o.digest for o in held.observations})
    return Relink(found, tuple((k, n, d) for (k, n), d in sorted(rows.items())))


def _run(the_plan: Plan, items, workers: Workers, store: Store, executor=None, lookups=None):
    """Run (target, recipe or None) jobs: a link where there is a recipe, else a compile.
    Links read objects from this store, so they always run on this machine. `lookups`
    (arch -> `StoredObjects`) are the build's memos of stored objects, shared with the
    compiles and links here."""
    lookups = lookups or {}
    if executor is not None:
        compiles = [t for t, recipe in items if recipe is None]
        if compiles:
            for target, outcome, seconds in executor.compile(
                    [(t, cluster.job_of(the_plan, t)) for t in compiles], cluster.run_job):
                yield target, cluster.checked(the_plan, target, outcome), seconds
        items = [item for item in items if item[1] is not None]
    started = workers.started or (lambda target: None)
    if workers.timeout is not None or (workers.jobs > 1 and len(items) > 1):
        compiled = [target for target, recipe in items if recipe is None]
        for backend in {id(b): b for b in (the_plan.kernels[t.name].backend
                                            for t in compiled)}.values():
            backend.prepare()  # once here, not once in every worker

        for (target, _), outcome, seconds in run_in_workers(
                lambda item: _job(the_plan, store, item, lookups), items, workers.jobs,
                timeout=workers.timeout, started=lambda item: started(item[0])):
            if isinstance(outcome, TimedOut):
                outcome = CompileTimeout(outcome.limit, outcome.notes)
            yield target, outcome, seconds
        return
    for item in items:
        started(item[0])
        yield (item[0],) + _job(the_plan, store, item, lookups)


def _job(the_plan, store, item, lookups):
    target, relink = item
    objects = lookups.get(target.arch)
    if relink is None:
        return compile_target(the_plan, target, store, objects)
    return link_target(the_plan, store, target, relink, objects)
