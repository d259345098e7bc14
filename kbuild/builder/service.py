"""The one build service: from "this target, of this plan" to a committed, fresh entry.

Every route that turns a kernel and its types into a binary goes through here:
`kbuild build` (`run.build`, many targets, in waves and worker processes), zero-config
(`zeroconf.session`, one kernel at a time, in the program's own process) and a
`Project`'s launcher (`launch.KernelLauncher`, whose miss is a `Project.build`). One
`BuildService` per plan owns the sequence, as ninja's one `Builder` does:

1. `fresh(target)`: the store's verified entry whose observations still hold (two
   levels: the static key, then what its compile observed; see `entries.fresh_entry`);
2. on a miss, the key's lock (`locks` for a build's many targets, `ensure` for one);
3. the look-up again under the lock: another process may have committed it meanwhile;
4. relink from stored objects when a recipe says they hold, else compile (`produce` in
   this process; `compile_all` in waves, in worker processes or on a cluster);
5. `finish`: commit (objects, blobs, manifest last), the early-cutoff records, the
   failure record, and the `Row` a build reports.

Nothing else in kbuild commits a target or starts a compile: tests/test_architecture.py
keeps it so (`ONE_BUILDER`).

The compile side (`compile`, `cluster`, worker processes) is imported on the first miss:
a warm zero-config process imports this module for its look-ups alone.
"""

from __future__ import annotations

from dataclasses import replace

from ..artifacts import arch_cc
from ..discover import Target
from ..keying import made
from ..keying.encode import digest
from ..keying.launch import with_launch
from ..keying.objects import Recipe, Unresolved, resolve
from ..keying.observed import Kind, Observation, read_in_order, unmarked
from ..model import Cutoff, LinkMode, RowStatus
from ..store.local import Store
from ..store.locks import KeyLock
from . import cutoff
from .cutoff import StoredObjects
from .entries import commit, current_digests, digests_now, expected, fresh_match, \
    handed_fills, launchable, matched_at, observed_record
from .failures import CompileTimeout, forget_failure, remember_failure
from .planning import Plan
from .row import Row


class BuildService:
    """Look-up, lock, look-up again, relink or compile, commit: for the targets of one
    plan against one store. `current` (what observed names digest to now) is taken once."""

    def __init__(self, the_plan: Plan, store: Store, current=None, *,
                 in_program: bool = False):
        self.plan, self.store = the_plan, store
        self._current = current
        # Looking up for a running program (zero-config): the state compiles filled is the
        # program's now, and only a set of observations that read it as it is now holds
        # (`fresh`); a build checks its targets against its own order after it instead.
        self.in_program = in_program
        self.lookups: dict = {}  # arch -> StoredObjects: the build's memo of stored objects
        # target -> (the holders its compile filled, what it observed (Observations), its
        # static key's record or None: read when needed), for each served or built: see
        # `out_of_order`
        self.seen: dict = {}

    @property
    def current(self):
        """What observed names digest to now (`entries.current_digests`), made when first
        asked: a bundle's plan, whose entries are not checked by observation, has no keyer."""
        if self._current is None:
            self._current = current_digests(self.plan)
        return self._current

    def key(self, target: Target) -> str:
        return self.plan.keys[target].digest

    # -- 1, 3: the look-up -----------------------------------------------------------

    def fresh(self, target: Target) -> dict | None:
        """The entry to launch for `target`, or None when it must be built."""
        manifest, found, record = fresh_match(self.plan, self.store, target, self.current,
                                              program_fills() if self.in_program else None)
        if manifest is not None:
            fills = made.stored_fills(manifest)
            self.seen[target] = (fills, found.observations, record)
            if fills is not None:
                _not_run_here(self.plan, target, fills)
        return manifest

    def held(self, target: Target) -> dict | None:
        """The verified entry under `target`'s key, what its compile observed unchecked: a
        package's bundle, whose installed sources were checked against it as a whole."""
        key = self.key(target)
        if not key:
            return None
        resolved = self.plan.kernels[target.name]
        return self.store.lookup(key, expected(target, resolved.kernel, resolved.backend))

    def cached(self, target: Target) -> Row | None:
        """A `cached` row for `target` when the store holds a fresh entry, else None."""
        manifest = self.fresh(target)
        if manifest is None:
            return None
        return Row.of(target, self.key(target), RowStatus.CACHED,
                      artifacts=launchable(manifest))

    def fresh_as_stored(self, target: Target):
        """(the fresh entry of `target`'s key, the target as that entry names it), or
        (None, target). Asks the remote tier on a local miss; the same types declared with
        another text (`f4[::1]`) have the same key: the entry's text is taken rather than
        the entry refused (and removed) as another target's."""
        key = self.key(target)
        try:
            held = self.store.has_entry(key)
        except OSError:  # no store there (a file in its path): nothing held
            held = False
        if not held:
            if self.store.remote is None:
                return None, target
            # Fetched from the remote (verified, kept here) whatever text it names.
            if self.store.lookup(key, {"target": target.name, "arch": target.arch}) is None:
                return None, target
        stored = self.store.entry_field(key, "signature")
        if isinstance(stored, str) and stored != target.signature:
            target = _retexted(self.plan, target, stored)
        return self.fresh(target), target

    def fresh_in_launch(self, target: Target, launch=None, launch_first: bool = False):
        """`fresh_as_stored` of `target` or, during a launch with configuration `launch`,
        of `target` built for that configuration (tried first when `launch_first`: its
        kernels are known to depend on their launch); (None, None) when neither is fresh."""
        tried = [target]
        if launch is not None:
            tried.append(self.for_launch(target, launch))
            if launch_first:
                tried.reverse()
        for candidate in tried:
            manifest, found = self.fresh_as_stored(candidate)
            if manifest is not None:
                return manifest, found
        return None, None

    def for_launch(self, target: Target, launch) -> Target:
        """`target` built for one launch configuration, keyed with it, added to the plan
        (see keying/launch.py)."""
        found = replace(target, launch=launch)
        if found not in self.plan.keys:
            static = self.plan.keys[replace(target, launch=None)]
            self.plan.keys[found] = with_launch(static, launch)
            self.plan.targets.append(found)
        return found

    # -- 2: the locks ------------------------------------------------------------------

    def locks(self, todo) -> "KeyLocks":
        """Per-key locks for a build's `todo` (see `KeyLocks`)."""
        return KeyLocks(self, todo)

    def ensure(self, target: Target, *, lookup=None, produce=None, place=None):
        """One target's fresh entry, built on a miss: under the key's lock, looked up
        again (`lookup(target)` -> (entry or None, target as found); default
        `fresh_as_stored`), else `produce(target)` -> (Artifacts or exception, seconds)
        (default `produce`), committed as `place(target, artifacts)` names it (default
        `target` itself; see `finish`) and looked up. (entry, target as stored), or (None, exception)
        when the compile failed (not recorded: the caller says what happens then)."""
        lookup = lookup or self.fresh_as_stored
        with self.store.shared(), KeyLock(self.store.root, self.key(target)):
            manifest, found = lookup(target)
            if manifest is not None:
                return manifest, found
            outcome, seconds = (produce or self.produce)(target)
            if isinstance(outcome, Exception):
                return None, outcome
            stored = place(target, outcome) if place is not None else target
            self.finish(stored, outcome, seconds)
            return self.fresh_as_stored(stored)

    # -- 4: relink or compile -----------------------------------------------------------

    def produce(self, target: Target, compile=None):
        """(Artifacts or exception, seconds): `target` linked from stored objects when a
        recipe says they hold, else compiled in this process (by `compile(target)` when
        given: the caller's bookkeeping around `compile`)."""
        found = self.relink_recipe(target)
        if found is not None:
            return self.job((target, found))
        return (compile or self.compile)(target)

    def compile(self, target: Target, *, early_cutoff: bool = True):
        """(Artifacts or exception, seconds): `target` compiled in this process; what the
        store holds from earlier builds of the same bytes is reused (early cutoff) unless
        `early_cutoff` is false (zero-config's compiles make every step)."""
        if not early_cutoff:
            from .compile import compile_target

            self.replay_writers(target, in_order=False)
            return compile_target(self.plan, target)
        return self.job((target, None))

    def relink_recipe(self, target: Target):
        """How to link `target` from stored objects whose observations all hold (a
        `Relink`), or None: it must be compiled."""
        from .compile import Relink

        found = self._recipe(target, self.plan.nodes_by_ident())
        return found if isinstance(found, Relink) else None

    def compile_all(self, todo, workers, executor=None):
        """Yield (target, Artifacts or exception, seconds): relink what stored objects
        allow, compile the rest (on `executor`'s cluster when it has one that answers).

        A target whose kernel object is stored but one of whose callees changed needs that
        callee's new object; one such target per missing object is compiled first (which
        makes the object), then the others are relinked with it.
        """
        order = {t: i for i, t in enumerate(self.plan.targets)}
        todo = sorted(todo, key=lambda t: (arch_cc(t.arch), order[t]))
        if executor is not None and not (todo and executor.start(self.plan.config)):
            executor = None  # nothing to do, or no cluster: compile here
        try:
            yield from self._waves(todo, workers, executor)
        finally:
            if executor is not None:
                executor.close()  # one connection serves both waves

    def _objects(self, arch: str) -> StoredObjects:
        found = self.lookups.get(arch)
        if found is None:
            found = self.lookups[arch] = StoredObjects(self.store, arch, self.current)
        return found

    def _waves(self, todo, workers, executor):
        """Compile the targets that make missing objects, then relink (or compile) the rest."""
        from .compile import Relink

        recipes, first, waiting = {}, [], []
        makers = set()
        nodes = self.plan.nodes_by_ident()
        for target in todo:
            found = self._recipe(target, nodes)
            if isinstance(found, Relink):
                recipes[target] = found
            elif found.missing is not None and (target.arch, found.missing) not in makers:
                makers.add((target.arch, found.missing))
                first.append(target)
            elif found.missing is not None:
                waiting.append(target)
            else:
                first.append(target)
        yield from self._run([(t, None) for t in first], workers, executor)
        later = []
        for target in waiting:
            found = self._recipe(target, nodes)
            if isinstance(found, Relink):
                recipes[target] = found
            else:
                later.append(target)
        yield from self._run([(t, recipes[t]) for t in todo if t in recipes]
                             + [(t, None) for t in later], workers, executor)

    def _recipe(self, target: Target, nodes: dict):
        from .compile import Relink

        the_plan = self.plan
        if not the_plan.separate:
            return Unresolved("separate compilation is off")
        if target.launch is not None:
            return Unresolved("built for one launch configuration")
        lookup = self._objects(target.arch)
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

    def _run(self, items, workers, executor=None):
        """Run (target, recipe or None) jobs: a link where there is a recipe, else a
        compile. Links read objects from this store, so they always run on this machine."""
        from ..execute.parallel import TimedOut, run_in_workers
        from . import cluster

        the_plan = self.plan
        if executor is not None:
            compiles = [t for t, recipe in items if recipe is None]
            if compiles:
                for target, outcome, seconds in executor.compile(
                        [(t, cluster.job_of(the_plan, t)) for t in compiles], cluster.run_job):
                    yield target, cluster.checked(the_plan, target, outcome), seconds
            items = [item for item in items if item[1] is not None]
        started = workers.started or (lambda target: None)
        if workers.timeout is not None or (workers.jobs > 1 and len(items) > 1):
            self.prepare_workers([target for target, recipe in items if recipe is None])
            for (target, _), outcome, seconds in run_in_workers(
                    self.job, items, workers.jobs, timeout=workers.timeout,
                    started=lambda item: started(item[0])):
                if isinstance(outcome, TimedOut):
                    outcome = CompileTimeout(outcome.limit, outcome.notes)
                yield target, outcome, seconds
            return
        for item in items:
            started(item[0])
            yield (item[0],) + self.job(item)

    def prepare_workers(self, targets) -> None:
        """The one-time set-up of the backends compiling `targets` (`Backend.prepare`),
        done here once before workers are forked: each inherits it instead of paying
        it again."""
        kernels = self.plan.kernels
        for backend in {id(b): b for b in (kernels[t.name].backend for t in targets)}.values():
            backend.prepare()

    def job(self, item):
        """(Artifacts or exception, seconds) of one (target, `Relink` or None) job, here."""
        from .compile import compile_target, link_target

        target, relink = item
        objects = self._objects(target.arch)
        if relink is None:
            self.replay_writers(target)
            return compile_target(self.plan, target, self.store, objects)
        return link_target(self.plan, self.store, target, relink, objects)

    def replay_writers(self, target: Target, in_order: bool = True) -> None:
        """Before `target` compiles here: the compiles of the targets whose compile fills
        state a later compile may read (`Artifacts.fills`: `_SEEN[name] = k` in one
        overload, `_SEEN.get(name)` in another) and did not run in this process (served
        from the store, or compiled in another worker), ahead of it in a build's order,
        run here as a build compiling them all would have (their output unused). Else
        `target` would see that state empty where a fresh build, compiling in the same
        order, shows it filled. A build's order is `compile_all`'s; without `in_order`
        (zero-config: the program's order) every such target served before counts. Then
        `target` counts as run here."""
        from .compile import compile_target

        _current_import()
        mine = self.key(target)
        if not _ELSEWHERE:
            _RAN.add(mine)
            return
        order = self._order()

        def ahead(writer: Target) -> bool:  # not for a target the plan does not list
            return writer in order and target in order and \
                self._place(writer, order) < self._place(target, order)

        due = [(the_plan, writer) for the_plan, writer, _ in _ELSEWHERE
               if not in_order or the_plan is not self.plan or ahead(writer)]
        if in_order:  # this plan's in its order, after those of others
            due.sort(key=lambda item: (item[0] is self.plan,
                                       self._place(item[1], order) if item[0] is self.plan
                                       else ()))
        for the_plan, writer in due:
            key = the_plan.keys[writer].digest
            if key not in _RAN and key != mine:
                _RAN.add(key)
                compile_target(the_plan, writer)
        _RAN.add(mine)

    def _order(self) -> dict:
        """target -> its index in the plan (another text of a signature is not listed)."""
        return {t: i for i, t in enumerate(self.plan.targets)}

    @staticmethod
    def _place(target: Target, order: dict) -> tuple:
        """Where `compile_all` compiles `target` (listed in `order`: the plan's targets)."""
        return arch_cc(target.arch), order[target]

    # -- after a build: what read state out of order ------------------------------------

    def out_of_order(self) -> list:
        """The targets served or built that read the state compiles fill otherwise than
        a build compiling every target in order, in one process, has it (`Kind.FILLED`,
        `keying.observed.read_in_order`): a reader compiled in another worker than the
        compile filling what it reads, or served from a build in which that compile
        failed, once it fills again. In order; none where no compile fills state, or
        where one served was stored before kbuild named what it fills."""
        order = self._order()
        done = sorted((t for t in self.seen if t in order),
                      key=lambda t: self._place(t, order))
        fills = [self.seen[t][0] for t in done]
        if not any(fills) or () in fills:
            return []
        reads = self._probed(done)
        filled, found = set(), []
        for target in done:
            own, observations, record = self.seen[target]
            if record is None:  # built: its record, read when it is needed
                record = _Record(self.store, self.key(target))
            if not read_in_order(observations, filled, own or (), record,
                                 reads.get(target, frozenset())):
                found.append(target)
            filled.update(own or ())
        return found

    def _probed(self, done) -> dict:
        """target -> the holders it reads of those the compiles ahead of it fill, for each
        target that did not compile in this process after such a compile (served, or
        compiled in a worker) and whose record says nothing of some of them: a holder
        read empty leaves no trace, so its observed names are digested again as the
        program holds them now. Holders a compile filled here are read as they are; those
        filled by compiles that did not run here (served, or run in workers) get a probe
        slot (`backend.base.probing`). One handed such a holder read it otherwise than a
        build in order (a reader compiled in another worker than its filler; one built,
        under other options, while its filler failed, served once it compiles again)."""
        fillers = [t for t in done if self.seen[t][0]]
        if not fillers:
            return {}
        candidates, filled = [], set()
        for target in done:
            own, observations, _ = self.seen[target]
            if filled and self.key(target) not in _RAN and \
                    unmarked(observations, filled, own or ()):
                candidates.append(target)
            filled.update(own or ())
        if not candidates:
            return {}
        from ..backend.base import probing

        labels = set().union(*(self.seen[t][0] for t in fillers if self.key(t) not in _RAN))
        with probing(labels):
            return {target: handed_fills(self.current, self.seen[target][1]) & filled
                    for target in candidates}

    def in_order(self, targets, workers):
        """Yield (target, Artifacts or exception, seconds): `targets` (`out_of_order`)
        compiled again, one at a time, each after the compiles ahead of it that did not
        run in this process (`replay_writers`: those compiled in workers count now)."""
        for target, (fills, _, _) in list(self.seen.items()):
            if fills:
                _not_run_here(self.plan, target, fills)
        yield from self._run([(t, None) for t in targets], workers)

    def compile_fresh(self, target: Target, manifest: dict, *, in_order: bool = True):
        """(Artifacts or exception, seconds): `target` compiled from its sources in this
        process, as its entry `manifest` was built, reusing nothing (`--verify`): no
        stored objects, no early cutoff, nothing this process's backends compiled; the
        served writers before it run first (`replay_writers`, `in_order`)."""
        for backend in {b.name: b for b in (k.backend
                                            for k in self.plan.kernels.values())}.values():
            backend.forget_compiled(self.plan.keyer.device_functions)
        self.plan.separate = manifest.get("link", {}).get("mode") != "whole"
        from .compile import compile_target

        self.replay_writers(target, in_order=in_order)
        return compile_target(self.plan, target)

    def compared(self, target: Target, manifest: dict, outcome, seconds: float, *,
                 record_failure: bool = True):
        """What a fresh build's `outcome` (`compile_fresh`) says of `target`'s entry
        `manifest`: (the kinds of bytes that differ, the launchable artifacts now). A
        fresh build that differs replaces the entry and its objects; one that failed
        (the exception in place of the kinds) removes it, its failure recorded unless
        `record_failure` is false (zero-config: numba compiles it then)."""
        if isinstance(outcome, Exception):
            if record_failure:
                remember_failure(self.plan, self.store, target, outcome, seconds, self.current)
            self.store.remove_entry(self.key(target))
            return outcome, None
        stored = manifest["artifacts"]
        differ = [kind for kind in ("ptx", "cubin")
                  if stored.get(kind) != digest(getattr(outcome, kind))]
        if not differ:
            return differ, launchable(manifest)
        return differ, self.commit(target, outcome, seconds, replace_objects=True)

    # -- 5: the commit -------------------------------------------------------------------

    def commit(self, target: Target, artifacts, seconds: float, *,
               replace_objects: bool = False) -> dict:
        """Store `artifacts` as `target`'s entry (objects, blobs, the manifest last; see
        `entries.commit`); its launchable artifacts' hashes."""
        return commit(self.store, self.plan, target, artifacts, seconds, self.current,
                      replace_objects=replace_objects)

    def finish(self, target: Target, outcome, seconds: float, *,
               replace_objects: bool = False) -> Row:
        """Commit a compile's or link's `outcome` for `target` and return its row: `built`
        (its early-cutoff records kept, an earlier failure forgotten), or `failed` (the
        failure recorded under the key, so an unchanged target fails at once next time).
        `replace_objects`: `--verify` found the stored bytes wrong; the compile's objects
        replace stored ones (see `entries.commit`)."""
        key = self.key(target)
        if isinstance(outcome, Exception):
            remember_failure(self.plan, self.store, target, outcome, seconds, self.current)
            return Row.of(target, key, RowStatus.FAILED, seconds, error=str(outcome))
        artifacts = self.commit(target, outcome, seconds, replace_objects=replace_objects)
        self.seen[target] = (outcome.fills or None, tuple(
            Observation(Kind(k), n, d) for k, n, d in outcome.observed), None)
        cutoff.record(self.store, self.plan.config.name, target.arch, outcome, artifacts)
        forget_failure(self.store, key)
        return Row.of(target, key, RowStatus.BUILT, seconds, artifacts,
                      link=_link_mode(outcome.link), note=outcome.link.get("reason"),
                      cutoff=Cutoff(outcome.cutoff) if outcome.cutoff else None)


def fresh_at_key(store: Store, key: str, target: Target, kernel, backend, sources,
                 root) -> dict | None:
    """The fresh entry under a `key` known without a plan (a program journal's): the
    entry verified as `kernel`'s (`backend`'s) for `target`, and the observation set of
    what its compile read matched against `sources` now and the state compiles filled
    in this program (as `BuildService.fresh` for a program)."""
    return matched_at(store, key, expected(target, kernel, backend),
                      digests_now(sources, root), program_fills())[0]


# The targets whose compile fills state a later compile may read and did not run in this
# process (served from the store, or compiled in a worker), as (plan, target, the holders
# it fills), and the keys of the targets compiled in this process, since the project's
# modules were last imported (`_IMPORT`): see `BuildService.replay_writers`.
_ELSEWHERE: list = []
_RAN: set = set()
_IMPORT = [0]


def _current_import() -> None:
    """Forget what ran and was served for an earlier import of the project's modules (a
    watch round imports them again: the state compiles wrote went with them)."""
    if _IMPORT[0] != made.imports():
        _IMPORT[0] = made.imports()
        _ELSEWHERE.clear()
        _RAN.clear()


def _not_run_here(the_plan: Plan, target: Target, fills) -> None:
    _current_import()
    key = the_plan.keys[target].digest
    if key not in _RAN and all(p.keys[t].digest != key for p, t, _ in _ELSEWHERE):
        _ELSEWHERE.append((the_plan, target, fills))


def program_fills() -> set:
    """The holders compiles filled in this program's state now: those compiles in this
    process filled, and those of the targets served here whose compile fills them (run
    again before the next compile: `BuildService.replay_writers`)."""
    _current_import()
    return set(made.filled_now()).union(*(fills for _, _, fills in _ELSEWHERE))


class _Record:
    """A static key's record of observation sets, read from the store when first asked."""

    def __init__(self, store: Store, key: str):
        self._store, self._key, self._sets = store, key, None

    @property
    def sets(self) -> tuple:
        if self._sets is None:
            manifest = self._store.lookup(self._key)
            record = manifest and observed_record(self._store, manifest)
            self._sets = record.sets if record else ()
        return self._sets


class KeyLocks:
    """Per-key locks for one build: compile what nobody else is compiling first,
    then wait for the others and take their entries (or compile them if they failed)."""

    def __init__(self, service: BuildService, todo):
        self.service = service
        self.locks = {t: KeyLock(service.store.root, service.key(t)) for t in todo}
        self.mine = [t for t in todo if self.locks[t].try_acquire()]
        # Waiters take locks in one global order (by key), so they never wait in a cycle.
        self.others = sorted((t for t in todo if t not in self.mine), key=service.key)

    def take_mine(self, rows) -> list:
        """Our locked targets still missing: another build may have committed one between
        our lookup and our lock."""
        return [t for t in self.mine if not self._take_cached(t, rows)]

    def release(self, target) -> None:
        """Let go of one of our targets' locks once its entry is committed (or its compile
        failed): a process waiting for that key takes the entry now, not after the batch."""
        self.locks[target].release()

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
        row = self.service.cached(target)
        if row is not None:
            rows[target] = row
        return row is not None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for lock in self.locks.values():
            lock.release()


def _link_mode(link: dict) -> LinkMode | None:
    mode = link.get("mode")
    return None if mode is None else LinkMode(mode)


def _retexted(the_plan: Plan, target: Target, text: str) -> Target:
    """`target` under another text of its signature (the types, and the key, are the same)."""
    resolved = the_plan.kernels[target.name]
    resolved.argtypes.setdefault(text, resolved.argtypes[target.signature])
    found = replace(target, signature=text)
    the_plan.keys.setdefault(found, the_plan.keys[target])
    return found
