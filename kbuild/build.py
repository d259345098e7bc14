"""The build: key every target, take what the store has, compile the rest, commit."""

from __future__ import annotations

import functools
import os
import re
import time
from dataclasses import dataclass, field

from .config import ProjectConfig, arch_cc, validate_arch
from .discover import ImportFailure, ResolvedKernel, Target, resolve_kernel
from .errors import CompileError, KeyingError, TargetError
from .keying import observed as obs
from .keying.keys import Keyer, KeyNode
from .keying.objects import Recipe, Unresolved, resolve
from .sources import ProjectSources
from .store.local import CorruptBlob, Store
from .store.manifest import built_problem
from .backend.toolchain import codegen_config, toolchain


@dataclass
class Row:
    """The outcome for one target, as `kbuild build --json` reports it."""

    target: str
    signature: str
    arch: str
    key: str | None  # None: the target's module failed to import
    status: str  # built | cached | failed | skipped
    seconds: float = 0.0
    artifacts: dict = field(default_factory=dict)
    error: str | None = None
    link: str | None = None  # built rows: lto | relink | whole
    note: str | None = None  # why a built target was linked as one program
    recorded: bool = False  # failed rows: the failure was recorded by an earlier build
    # Relinked rows: the device functions that alone changed since the target's nearest
    # earlier build (set by `Project.build`); None when unknown or not relinked.
    changed: list | None = None
    # The launch configuration a launch-config-sensitive target is built for (JSON form).
    launch: dict | None = None

    def as_json(self) -> dict:
        found = {"target": self.target, "signature": self.signature, "arch": self.arch,
                 "key": self.key, "status": self.status, "seconds": round(self.seconds, 4),
                 "artifacts": self.artifacts, "error": self.error, "link": self.link,
                 "note": self.note, "recorded": self.recorded, "changed": self.changed}
        return found if self.launch is None else dict(found, launch=self.launch)


@dataclass
class Plan:
    """Every requested target with its resolved kernel and key tree."""

    config: ProjectConfig
    kernels: dict  # target name -> ResolvedKernel
    targets: list  # [Target]
    keys: dict  # Target -> KeyNode
    keyer: Keyer
    separate: bool = True  # compile device functions into objects of their own (see lto)
    # Targets that could not be imported (`ImportFailure`) or keyed (`KeyingError`: a value
    # kbuild cannot hash), never in `targets` or `keys`: Target -> the error. Each fails
    # alone; a failed import also stops the build without -k, as a failed compile does.
    failed: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Every requested target, keyed or not."""
        return len(self.targets) + len(self.failed)

    @property
    def import_failed(self) -> bool:
        return any(isinstance(error, ImportFailure) for error in self.failed.values())

    def resolved(self, name: str) -> ResolvedKernel:
        """The resolved kernel of target `name`, or its import failure raised."""
        if name not in self.kernels:
            raise next(e for t, e in self.failed.items() if t.name == name)
        return self.kernels[name]

    def nodes_by_ident(self) -> dict:
        """Every separately compiled device function's current tree, by identity."""
        return {n.ident: n for n in self.keyer.nodes.values() if n.ident}


def plan(config: ProjectConfig, names=None, archs=None, keyer: Keyer | None = None) -> Plan:
    """Resolve the requested targets (default: all) and compute their keys.

    Plans that share a `keyer` key each function once between them.
    """
    specs = select_specs(config, names)
    kernels, broken = _resolve_all(config, specs)
    # A signature or arch named twice is one target, built once.
    every = list(dict.fromkeys(Target(spec.name, sig, arch, launch)
                               for spec in specs for sig in spec.signatures
                               for arch in (archs or spec.archs)
                               for launch in (spec.launches or (None,))))
    targets = [t for t in every if t.name in kernels]
    keyer = keyer or Keyer(ProjectSources(config.paths))
    keys, unkeyable = {}, {}
    for t in targets:
        try:
            keys[t] = target_key(keyer, kernels[t.name], t)
        except KeyingError as exc:
            unkeyable[t] = exc
    failed = {t: broken[t.name] for t in every if t.name in broken}
    return Plan(config, kernels, [t for t in targets if t in keys], keys, keyer,
                failed={**failed, **unkeyable})


def _resolve_all(config: ProjectConfig, specs):
    """(name -> ResolvedKernel, name -> ImportFailure): a module that raises at import
    fails its own targets only, and is imported once, not once per kernel."""
    kernels, broken, bad_modules = {}, {}, {}
    for spec in specs:
        module = spec.name.partition(":")[0]
        if module in bad_modules:
            broken[spec.name] = bad_modules[module].for_target(spec.name)
            continue
        try:
            kernels[spec.name] = resolve_kernel(config, spec)
        except ImportFailure as exc:
            broken[spec.name] = bad_modules[exc.module] = exc
    return kernels, broken


def select_specs(config: ProjectConfig, names):
    """The kernel specs named (by full or unique short name), or all of them."""
    if not names:
        return list(config.kernels)
    by_name = {s.name: s for s in config.kernels}
    chosen = []
    for name in names:
        spec = by_name.get(name) or _by_short_name(config, name)
        if spec not in chosen:
            chosen.append(spec)
    return chosen


def _by_short_name(config: ProjectConfig, name: str):
    matches = [s for s in config.kernels if s.name.rpartition(":")[2] == name
               or s.name.rpartition(":")[2].rpartition(".")[2] == name]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise TargetError(f"target '{name}' is ambiguous in {config.path.name}: "
                          f"{', '.join(s.name for s in matches)}")
    raise TargetError(f"unknown target '{name}': {config.path.name} declares "
                      f"{_declared(config)}{_did_you_mean(config, name)}")


def _declared(config: ProjectConfig, shown: int = 8) -> str:
    names = [s.name for s in config.kernels]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _did_you_mean(config: ProjectConfig, name: str) -> str:
    """'; did you mean 'X'?' for the declared target (full or short name) closest to `name`."""
    import difflib

    # What a user may have meant -> the name to suggest: a full name, a short name
    # (`kernel`, `obj.kernel`), or a module's last part (`saxpy` of `examples.saxpy:k`).
    meant = {}
    for full in (s.name for s in config.kernels):
        module, _, attr = full.partition(":")
        last = attr.rpartition(".")[2]
        for alias, suggestion in ((full, full), (attr, attr), (last, last),
                                  (module.rpartition(".")[2], full)):
            meant.setdefault(alias, suggestion)
    close = difflib.get_close_matches(name, sorted(meant), n=1, cutoff=0.6)
    return f"; did you mean '{meant[close[0]]}'?" if close else ""


def parse_archs(text: str | None, where: str = "--arch"):
    if not text:
        return None
    return tuple(validate_arch(a.strip(), where) for a in text.split(",") if a.strip())


def target_key(keyer: Keyer, resolved: ResolvedKernel, target: Target) -> KeyNode:
    from .keying.launch import with_launch

    node = keyer.target_node(resolved.kernel, target.name, resolved.argtypes[target.signature],
                             target.signature, target.arch, toolchain(), codegen_config())
    return with_launch(node, target.launch)


def build(the_plan: Plan, store: Store, *, keep_going: bool = False, jobs: int = 1,
          progress=None, executor=None, target_timeout: float | None = None,
          retry_failed: bool = False) -> list[Row]:
    """Build what is out of date; return one row per target, in plan order.

    `executor` (e.g. a `distributed.DaskExecutor`) compiles instead of local processes.
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


def expected(target: Target, kernel=None) -> dict:
    """What a target's entry must name (and, given its `kernel`, the kernel its entry
    symbol must be): the lookup of its key refuses any other's."""
    from .backend.binaries import kernel_entry_prefix

    found = {"target": target.name, "signature": target.signature, "arch": target.arch}
    if target.launch is not None:
        from .keying.launch import launch_json

        found["launch"] = launch_json(target.launch)
    prefix = kernel_entry_prefix(kernel) if kernel is not None else None
    return dict(found, entry_prefix=prefix) if prefix else found


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
            rows[target] = Row(target.name, target.signature, target.arch, key, "cached",
                               artifacts=launchable(manifest))
        elif failed is not None:
            rows[target] = failed
        else:
            todo.append(target)
            continue
        _progress(progress, rows[target], len(rows), the_plan.total)
    if todo and store.read_only:
        for target in todo:
            rows[target] = Row(target.name, target.signature, target.arch,
                               the_plan.keys[target].digest, "failed",
                               error="not in the read-only store (build it where the store "
                                     "is writable)")
        todo = []
    if todo:
        store.ensure_writable()
    # Targets that could not be imported or keyed: a failed row each, reported like any other.
    for target, error in the_plan.failed.items():
        rows[target] = Row(target.name, target.signature, target.arch, None, "failed",
                           error=str(error))
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
            rows[target] = Row(target.name, target.signature, target.arch,
                               the_plan.keys[target].digest, "skipped",
                               error="not built: an earlier target failed (use -k to keep going)")
            _progress(progress, rows[target], len(rows), the_plan.total)
    ordered = [rows[t] for t in [*the_plan.targets, *the_plan.failed]]
    for target in the_plan.targets:
        if target.launch is not None:
            from .keying.launch import launch_json

            rows[target].launch = launch_json(target.launch)
    from .store.maintenance import record_build

    record_build(store, {s: sum(r.status == s for r in ordered)
                         for s in ("built", "cached", "failed", "skipped")})
    return ordered


def _compile_batch(the_plan, store, batch, workers, keep_going, rows, progress,
                   executor=None, current=None) -> bool:
    """Compile and commit `batch`; True when a failure stops the build."""
    outcomes = _compile_all(the_plan, store, batch, workers, executor, current)
    stop = False
    for target, outcome, seconds in outcomes:
        key = the_plan.keys[target].digest
        if isinstance(outcome, Exception):
            row = Row(target.name, target.signature, target.arch, key, "failed",
                      seconds, error=str(outcome))
            remember_failure(the_plan, store, target, outcome, seconds, current)
        else:
            artifacts = commit(store, the_plan, target, outcome, seconds, current)
            forget_failure(store, key)
            row = Row(target.name, target.signature, target.arch, key, "built", seconds,
                      artifacts, link=outcome.link.get("mode"), note=outcome.link.get("reason"))
        rows[target] = row
        _progress(progress, row, len(rows), the_plan.total)
        if row.status == "failed" and not keep_going:
            stop = True
            break  # stop pulling: the sequential generator compiles only on demand
    outcomes.close()
    return stop


class _KeyLocks:
    """Per-key locks for one build: compile what nobody else is compiling first,
    then wait for the others and take their entries (or compile them if they failed)."""

    def __init__(self, store: Store, the_plan: Plan, todo, current):
        from .store.locks import KeyLock

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
            rows[target] = Row(target.name, target.signature, target.arch,
                               self.the_plan.keys[target].digest, "cached",
                               artifacts=launchable(manifest))
        return manifest is not None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for lock in self.locks.values():
            lock.release()


def _progress(progress, row, done, total):
    if progress is not None:
        progress(row, done, total)


def commit(store: Store, the_plan: Plan, target: Target, artifacts, seconds,
           current=None) -> dict:
    """Store the objects, then the artifacts' blobs, then the manifest; return the
    launchable artifacts' hashes.

    The manifest goes under the static key, with the record of every observation set
    seen for that key (newest first). The variant it replaces, built for other
    observations, moves to its full key, where `fresh_entry` finds it if those
    observations hold again (an environment switched back, say).
    """
    built_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    current = current or current_digests(the_plan)
    observed = [obs.Observation(obs.Kind(k), n, d) for k, n, d in artifacts.observed]
    # A target built for one launch configuration may have objects made for it alone: none
    # are kept (another launch configuration must never be linked from them).
    for obj in (artifacts.objects if target.launch is None else ()):
        # Objects are keyed statically and carry what their compile observed, so a relink
        # can check it; one compiled again because an observation changed replaces the old.
        if _object_holds(store, obj.key, current):
            continue
        record = obs.Record(obj.key, (obs.observation_set(obj.key, observed),))
        store.commit(obj.key, dict(obj.manifest, artifacts={
            "ltoir": store.put_blob(obj.ltoir),
            "observed": store.put_blob(obs.to_json(record))},
            arch=target.arch, project=the_plan.config.name, built_at=built_at))
    node = the_plan.keys[target]
    newest = obs.observation_set(node.digest, observed)
    previous = store.lookup(node.digest)
    before = previous and observed_record(store, previous)
    record = obs.merged(before, node.digest, newest)
    if before and before.sets and before.sets[0].key != newest.key \
            and not store.has_entry(before.sets[0].key):
        store.commit(before.sets[0].key, previous)
    hashes = {"ptx": store.put_blob(artifacts.ptx), "cubin": store.put_blob(artifacts.cubin),
              "observed": store.put_blob(obs.to_json(record))}
    manifest = {
        "target": target.name, "signature": target.signature, "arch": target.arch,
        "artifacts": hashes, "entry": artifacts.entry, "cooperative": artifacts.cooperative,
        "link": artifacts.link if target.launch is None or "objects" not in artifacts.link
        else dict(artifacts.link, objects=[]),
        "inputs": [[list(path), text, d] for path, text, d in node.flatten()],
        "built_at": built_at,
        "seconds": round(seconds, 4), "project": the_plan.config.name,
    }
    if target.launch is not None:
        from .keying.launch import launch_json

        manifest["launch"] = launch_json(target.launch)
    store.commit(node.digest, manifest)
    return launchable(manifest)


# -- failed compiles, recorded by key -------------------------------------------------

class CompileFailed(CompileError):
    """A compile error, with the observation rows of what the compile had read (None when
    they cannot be keyed by content: then the failure is not recorded)."""

    def __init__(self, message: str, observed=None):
        super().__init__(message)
        self.observed = observed


class CompileTimeout(CompileError):
    """A compile stopped at the time limit; `notes` are the (kind, name) pairs it had read."""

    def __init__(self, limit: float, notes=()):
        super().__init__(f"compile took longer than {limit:g}s (--target-timeout / [build] "
                         "target_timeout); stopped it: raise the limit to let it finish")
        self.limit, self.notes = limit, notes


_EARLIER = "(failed earlier with this key; --retry-failed to compile again)"


def remember_failure(the_plan: Plan, store: Store, target: Target, error, seconds,
                     current) -> None:
    """Record a failed compile under its key, with what it had read, so the unchanged
    target fails at once next time. Only compile errors and timeouts: a worker that died
    (out of memory?) may live next time. Nothing is recorded when something the compile
    read cannot be keyed by content (it could change unseen)."""
    from .store import failures

    if isinstance(error, CompileTimeout):
        observed, limit = _digests(error.notes, current), error.limit
    elif isinstance(error, CompileFailed):
        observed, limit = error.observed, None
    else:
        return
    if observed is None or store.read_only or any(d.startswith(obs.UNKEYABLE)
                                                  for _, _, d in observed):
        return
    failures.remember(store, the_plan.keys[target].digest, failures.Failure(
        target.name, target.signature, target.arch, str(error), tuple(observed), limit,
        seconds, the_plan.config.name))


def forget_failure(store: Store, key: str) -> None:
    from .store import failures

    failures.forget(store, key)


def recorded_failure(the_plan: Plan, store: Store, target: Target, current,
                     limit: float | None) -> Row | None:
    """The failed row of a target whose failure was recorded for its key and still holds:
    everything its compile had read has the digest it had, and, for a compile stopped at
    a time limit, the limit now is no longer than that one. None: compile it."""
    from .store import failures

    key = the_plan.keys[target].digest
    failure = failures.recorded(store, key, expected(target))
    if failure is None:
        return None
    if failure.limit is not None and (limit is None or limit > failure.limit):
        return None  # a longer limit may see it through
    for kind, name, digest in failure.observed:
        try:
            now = current(obs.Kind(kind), name)
        except ValueError:  # a kind this kbuild does not know: not a record to trust
            return None
        if now != digest or digest.startswith(obs.UNKEYABLE):
            return None
    return Row(target.name, target.signature, target.arch, key, "failed",
               error=f"{failure.error} {_EARLIER}", recorded=True)


def _observed_rows(the_plan: Plan, observer):
    """The (kind, name, digest) rows of what `observer` saw, or None when that cannot be
    said (a failed compile is then not recorded)."""
    try:
        return tuple(tuple(o.as_row()) for o in current_digests(the_plan).observations(observer))
    except Exception:  # noqa: BLE001 - a failure not recorded only costs its next compile
        return None


def _digests(notes, current):
    """Observation rows of the (kind, name) pairs a killed compile sent, digested now."""
    try:
        return tuple((kind, name, current(obs.Kind(kind), name)) for kind, name in notes)
    except Exception:  # noqa: BLE001 - as above
        return None


@functools.cache
def _noting(observer_class):
    """`observer_class`, also sending each new name it records to the parent process
    (`parallel.note`): a compile killed for its time still says what it had read."""
    from .execute.parallel import note

    class Noting(observer_class):
        def add(self, kind, name):
            if (kind, name) not in self.names:
                note((kind.value, name))
            super().add(kind, name)

    return Noting


def _object_holds(store: Store, key: str, current) -> bool:
    """Whether a stored object's record of what its compile observed still holds."""
    if not store.has_entry(key):
        return False
    manifest = store.lookup(key)
    record = manifest and observed_record(store, manifest)
    return bool(record) and obs.matching_set(record, current) is not None


def launchable(manifest: dict) -> dict:
    """A target entry's PTX and cubin blobs (what a row reports; the observation record
    beside them is the build's bookkeeping)."""
    return {k: v for k, v in manifest["artifacts"].items() if k != "observed"}


# -- freshness: the static key, then what the compile observed -------------------------

def current_digests(the_plan: Plan):
    """`(kind, name) -> digest now` for observed names, memoized: make one per build."""
    from .backend.observe import Current

    return Current(the_plan.keyer.sources, the_plan.config.root)


def fresh_entry(the_plan: Plan, store: Store, target: Target, current=None) -> dict | None:
    """The entry to launch for `target`, or None when it must be built.

    Two levels, as ccache's manifest: the static key's entry must exist and hold the
    record of what its compiles observed; a recorded observation set whose every name
    still has its digest gives the full key of the entry built with those. An entry
    with no record (made before observations were kept) is not fresh.
    """
    key = the_plan.keys[target].digest
    bound = expected(target, the_plan.kernels[target.name].kernel)
    manifest = store.lookup(key, bound)
    if manifest is None:
        return None
    record = observed_record(store, manifest)
    if record is None or record.static_key != key:
        return None
    found = obs.matching_set(record, current or current_digests(the_plan))
    if found is None:
        return None
    return manifest if found is record.sets[0] else store.lookup(found.key, bound)


def observed_record(store: Store, manifest: dict) -> obs.Record | None:
    """The observation record an entry names (verified against its hash), or None."""
    name = manifest.get("artifacts", {}).get("observed")
    if name is None:
        return None
    try:
        return obs.from_json(store.read_blob(name))
    except (CorruptBlob, OSError):
        return None


def observation_changes(the_plan: Plan, store: Store, target: Target, current=None):
    """Why a target whose static key has an entry is stale anyway: the observations of
    its newest build that changed (`observed global lab.consts.SCALE changed`)."""
    manifest = store.lookup(the_plan.keys[target].digest)
    record = manifest and observed_record(store, manifest)
    if not record or not record.sets:
        return ["built before kbuild recorded what the compiler read; a build records it"]
    return obs.changes(record.sets[0], current or current_digests(the_plan))


def _compile_all(the_plan: Plan, store: Store, todo, workers, executor=None, current=None):
    """Yield (target, Artifacts or exception, seconds): relink what stored objects allow,
    compile the rest (on `executor`'s cluster when it has one that answers).

    A target whose kernel object is stored but one of whose callees changed needs that
    callee's new object; one such target per missing object is compiled first (which
    makes the object), then the others are relinked with it.
    """
    order = {t: i for i, t in enumerate(the_plan.targets)}
    todo = sorted(todo, key=lambda t: (arch_cc(t.arch), order[t]))
    if executor is not None and not (todo and executor.start(the_plan)):
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
        lookup = lookups.setdefault(target.arch, _Objects(store, target.arch, current))
        found = _recipe(the_plan, lookup, target, nodes)
        if isinstance(found, _Relink):
            recipes[target] = found
        elif found.missing is not None and (target.arch, found.missing) not in makers:
            makers.add((target.arch, found.missing))
            first.append(target)
        elif found.missing is not None:
            waiting.append(target)
        else:
            first.append(target)
    yield from _run(the_plan, [(t, None) for t in first], workers, store, executor)
    later = []
    for target in waiting:
        found = _recipe(the_plan, lookups[target.arch], target, nodes)
        if isinstance(found, _Relink):
            recipes[target] = found
        else:
            later.append(target)
    yield from _run(the_plan, [(t, recipes[t]) for t in todo if t in recipes]
                    + [(t, None) for t in later], workers, store, executor)


class _Objects:
    """The lookup of one arch's stored objects for a build's recipes, remembering hits: an
    object shared by many targets is read and verified once per build, and so is its record
    of what its compile observed. Misses, and records that no longer hold, are asked again
    (the first wave commits new objects)."""

    def __init__(self, store: Store, arch: str, current):
        self.store, self.arch, self.current = store, arch, current
        self.hits, self.holding = {}, {}

    def __call__(self, key: str) -> dict | None:
        if key not in self.hits:
            manifest = self.store.lookup(key, {"kind": "object", "arch": self.arch})
            if manifest is None:
                return None
            self.hits[key] = manifest
        return self.hits[key]

    def held(self, key: str):
        """The observation set of the stored object `key` that still holds, or None."""
        if key not in self.holding:
            record = observed_record(self.store, self(key))
            found = record and obs.matching_set(record, self.current)
            if not found:
                return None
            self.holding[key] = found
        return self.holding[key]


@dataclass(frozen=True)
class _Relink:
    """A link recipe whose objects' observations all hold, and those observations."""

    recipe: Recipe
    observed: tuple  # (kind, name, digest) rows, the union of the objects'


def relink_recipe(the_plan: Plan, store: Store, target: Target, current):
    """How to link `target` from stored objects whose observations all hold (a `_Relink`
    for `link_target`), or None: it must be compiled. For one target at a time (the
    zero-config session); a build plans its waves with `_recipe` itself."""
    found = _recipe(the_plan, _Objects(store, target.arch, current), target,
                    the_plan.nodes_by_ident())
    return found if isinstance(found, _Relink) else None


def _recipe(the_plan: Plan, lookup: _Objects, target: Target, nodes: dict):
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
    return _Relink(found, tuple((k, n, d) for (k, n), d in sorted(rows.items())))


def _run(the_plan: Plan, items, workers: Workers, store: Store, executor=None):
    """Run (target, recipe or None) jobs: a link where there is a recipe, else a compile.
    Links read objects from this store, so they always run on this machine."""
    if executor is not None:
        compiles = [t for t, recipe in items if recipe is None]
        if compiles:
            yield from executor.compile(the_plan, compiles)
        items = [item for item in items if item[1] is not None]
    started = workers.started or (lambda target: None)
    if workers.timeout is not None or (workers.jobs > 1 and len(items) > 1):
        from .backend.compiler import prepare
        from .execute.parallel import TimedOut, run_in_workers

        if any(recipe is None for _, recipe in items):
            prepare()  # once here, not once in every worker

        for (target, _), outcome, seconds in run_in_workers(
                lambda item: _job(the_plan, store, item), items, workers.jobs,
                timeout=workers.timeout, started=lambda item: started(item[0])):
            if isinstance(outcome, TimedOut):
                outcome = CompileTimeout(outcome.limit, outcome.notes)
            yield target, outcome, seconds
        return
    for item in items:
        started(item[0])
        yield (item[0],) + _job(the_plan, store, item)


def _job(the_plan, store, item):
    target, relink = item
    if relink is None:
        return compile_target(the_plan, target)
    return link_target(the_plan, store, target, relink)


def compile_target(the_plan: Plan, target: Target):
    """(Artifacts or CompileError, seconds) for one target, in this process."""
    from .backend.compiler import compile_kernel
    from .backend.dispatch import forget_compiled, launched_as
    from .backend.observe import Observer

    resolved = the_plan.kernels[target.name]
    start = time.perf_counter()
    apart = (the_plan.keyer.nodes, the_plan.keys[target]) if the_plan.separate else None
    observer = _noting(Observer)(the_plan.keyer.nodes, the_plan.config.root)
    if target.launch is not None:  # callees typed for another launch configuration
        for disp in the_plan.keyer.device_functions:
            forget_compiled(disp)
    try:
        with launched_as(resolved.kernel, target.launch):
            artifacts = compile_kernel(resolved.kernel, resolved.argtypes[target.signature],
                                       arch_cc(target.arch), the_plan.keyer.device_functions,
                                       the_plan.keyer.stable_ids, apart, observer)
    except Exception as exc:  # noqa: BLE001 - numba's message goes into the row
        # Out of memory or a file it could not read may not happen again: not recorded.
        observed = None if isinstance(exc, (MemoryError, OSError)) else \
            _observed_rows(the_plan, observer)
        return CompileFailed(_compile_message(exc), observed), time.perf_counter() - start
    try:
        artifacts = _with_observations(the_plan, artifacts, observer)
    except CompileError as exc:
        return exc, time.perf_counter() - start
    return artifacts, time.perf_counter() - start


def _with_observations(the_plan: Plan, artifacts, observer):
    """`artifacts` with the digests of what the compile observed; a dependency that cannot
    be keyed by content fails this target, naming it (never keyed by identity)."""
    from dataclasses import replace

    observed = current_digests(the_plan).observations(observer)
    bad = obs.unkeyable(observed)
    if bad:
        o = bad[0]
        raise CompileError(
            f"observed {o.kind.value} {obs.display_name(o.kind, o.name)} was read while "
            f"compiling, but kbuild cannot key it by content ({o.digest}); make it a number, "
            "string, tuple, numpy array or dtype, enum, or a function")
    try:
        obs.observation_set("", observed)
    except ValueError as exc:
        raise CompileError(f"{exc}; kbuild keeps at most {obs.MAX_OBSERVATIONS}") from None
    return replace(artifacts, observed=tuple(tuple(o.as_row()) for o in observed))


def link_target(the_plan: Plan, store: Store, target: Target, relink: _Relink):
    """(Artifacts, seconds) of a target linked from stored objects; compiled if that fails
    (a blob gone bad since the recipe was made, say)."""
    recipe = relink.recipe
    from .backend.compiler import Artifacts
    from .backend.lto import link

    start = time.perf_counter()
    options = the_plan.kernels[target.name].kernel.targetoptions
    try:
        ltoirs = [store.read_blob(blob) for _, blob in recipe.objects]
        ptx, cubin = link(ltoirs, arch_cc(target.arch),
                          max_registers=options.get("max_registers"))
    except Exception:  # noqa: BLE001 - a bad blob (CorruptBlob) or link: compile it instead
        return compile_target(the_plan, target)
    if built_problem(target.arch, recipe.entry, {"ptx": ptx, "cubin": cubin}):
        return compile_target(the_plan, target)  # objects that link into another kernel
    artifacts = Artifacts(ptx=ptx, cubin=cubin, entry=recipe.entry, cooperative=recipe.cooperative,
                          link={"mode": "relink", "objects": [k for k, _ in recipe.objects]},
                          observed=relink.observed)
    return artifacts, time.perf_counter() - start


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _compile_message(exc: Exception) -> str:
    # numba highlights its messages with terminal escapes; rows are data, not terminal output.
    text = _ANSI.sub("", str(exc)).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else (os.cpu_count() or 1))
