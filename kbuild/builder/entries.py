"""A target's entry in the store: whether the one there is fresh (the static key, then
what its compile observed), and the commit of a new one."""

from __future__ import annotations

import time

from ..model import Target
from ..keying import observed as obs
from ..keying.launch import launch_json
from ..keying.made import stored_fills
from ..keying.objects import interface
from ..store.local import CorruptBlob, Store
from .planning import Plan


def built_now() -> str:
    """When an entry is built, UTC to the microsecond: history tells the newest of
    equally near builds by it, and two builds often finish within one second."""
    now = time.time_ns()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now // 10**9)) + \
        f".{now // 1000 % 10**6:06d}Z"


def expected(target: Target, kernel=None, backend=None) -> dict:
    """What a target's entry must name (and, given its `kernel` and the `backend` compiling
    it, the kernel its entry symbol must be and the backend it records): the lookup of
    its key refuses any other's."""
    found = {"target": target.name, "signature": target.signature, "arch": target.arch}
    if target.launch is not None:
        found["launch"] = launch_json(target.launch)
    if kernel is None:
        return found
    if backend is None:
        from ..backend.backends import DEFAULT, get

        backend = get(DEFAULT)
    return dict(found, **backend.entry_expectation(kernel))


def current_digests(the_plan: Plan):
    """`(kind, name) -> digest now` for observed names, memoized: make one per build."""
    return digests_now(the_plan.keyer.sources, the_plan.config.root)


def digests_now(sources, root):
    """`(kind, name) -> digest now` of observed names, for `sources` (a keyer's) under
    the project `root`, memoized (see `current_digests`)."""
    from ..backend.base import observed_now

    return observed_now(sources, root)


def fresh_entry(the_plan: Plan, store: Store, target: Target, current=None) -> dict | None:
    """The entry to launch for `target`, or None when it must be built.

    Two levels, as ccache's manifest: the static key's entry must exist and hold the
    record of what its compiles observed; a recorded observation set whose every name
    still has its digest gives the full key of the entry built with those. An entry
    with no record (made before observations were kept) is not fresh.
    """
    return fresh_match(the_plan, store, target, current)[0]


def fresh_match(the_plan: Plan, store: Store, target: Target, current=None, filled=None):
    """`fresh_entry`, the observation set that holds for it and the record of its static
    key: (entry, set, record) or (None, None, None). `filled`: see `matched_at`."""
    resolved = the_plan.kernels[target.name]
    return matched_at(store, the_plan.keys[target].digest,
                      expected(target, resolved.kernel, resolved.backend),
                      current or current_digests(the_plan), filled)


def matched_at(store: Store, key: str, bound: dict, current, filled=None):
    """`fresh_entry` for a static `key` whose entry must hold `bound`'s fields: (the entry,
    or the variant its record names for the observation set that holds under `current`;
    that set; the record), or (None, None, None). `filled` (for a running program: the
    holders compiles filled in its state now) admits only a set that read them so
    (`keying.observed.read_in_order`)."""
    manifest = store.lookup(key, bound)
    if manifest is None:
        return None, None, None
    record = observed_record(store, manifest)
    if record is None or record.static_key != key:
        return None, None, None
    own = stored_fills(manifest) or ()

    def in_order(recorded) -> bool:
        missing = obs.unmarked(recorded.observations, filled, own)
        return obs.read_in_order(recorded.observations, filled, own, record,
                                 _reads_now(current, recorded.observations, missing))
    found = obs.matching_set(record, current, None if filled is None else in_order)
    if found is None:
        return None, None, None
    entry = manifest if found is record.sets[0] else store.lookup(found.key, bound)
    return (entry, found, record) if entry is not None else (None, None, None)


def _reads_now(current, observations, labels) -> frozenset:
    """Which of the holders `labels` name (filled in this program now) a compile that
    observed `observations` reads: a holder read empty leaves no trace, so its names are
    digested again as the program holds them, those filled by targets served here but
    not run yet probed (`backend.base.probing`)."""
    if not labels:
        return frozenset()
    from ..backend.base import probing
    from ..keying.made import filled_now

    with probing(set(labels) - filled_now()):
        return handed_fills(current, observations) & frozenset(labels)


def handed_fills(current, observations) -> frozenset:
    """The holders (`Kind.FILLED` labels) whose state compiles filled that reading the
    names of `observations` is handed now (`current`: `digests_now`)."""
    return frozenset(name for o in observations if o.kind != obs.Kind.FILLED
                     for kind, name in current.handed(o.kind, o.name)
                     if kind == obs.Kind.FILLED)


def observed_record(store: Store, manifest: dict) -> obs.Record | None:
    """The observation record an entry names (verified against its hash), or None."""
    name = manifest.get("artifacts", {}).get("observed")
    if name is None:
        return None
    try:
        return obs.from_json(store.read_record(name))
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


def launchable(manifest: dict) -> dict:
    """A target entry's PTX and cubin blobs (what a row reports; the observation record
    beside them is the build's bookkeeping)."""
    return {k: v for k, v in manifest["artifacts"].items() if k != "observed"}


def commit(store: Store, the_plan: Plan, target: Target, artifacts, seconds,
           current=None, *, replace_objects: bool = False) -> dict:
    """Store the objects, then the artifacts' blobs, then the manifest; return the
    launchable artifacts' hashes.

    The manifest goes under the static key, with the record of every observation set
    seen for that key (newest first). The variant it replaces, built for other
    observations, moves to its full key, where `fresh_entry` finds it if those
    observations hold again (an environment switched back, say). `replace_objects`
    (`--verify` found the stored bytes wrong): the compile's objects replace stored ones
    under the same keys even where their observations hold.
    """
    built_at = built_now()
    current = current or current_digests(the_plan)
    observed = [obs.Observation(obs.Kind(k), n, d) for k, n, d in artifacts.observed]
    # A target built for one launch configuration may have objects made for it alone: none
    # are kept (another launch configuration must never be linked from them).
    for obj in (artifacts.objects if target.launch is None else ()):
        # Objects are keyed statically and carry what their compile observed, so a relink
        # can check it; one compiled again because an observation changed replaces the old.
        if not replace_objects and _object_holds(store, obj, current):
            continue
        record = obs.Record(obj.key, (obs.observation_set(obj.key, observed),))
        store.commit(obj.key, dict(obj.manifest, artifacts={
            "ltoir": store.put_blob(obj.ltoir),
            "observed": store.put_blob(obs.to_json(record))},
            arch=target.arch, project=the_plan.config.name, built_at=built_at,
            **_fills(artifacts)))
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
        "backend": the_plan.kernels[target.name].backend.name,
        "inputs": [[list(path), text, d] for path, text, d in node.flatten()],
        "built_at": built_at,
        "seconds": round(seconds, 4), "project": the_plan.config.name,
    }
    manifest.update(_fills(artifacts))
    if target.launch is not None:
        manifest["launch"] = launch_json(target.launch)
    store.commit(node.digest, manifest)
    return launchable(manifest)


def _fills(artifacts) -> dict:
    """The manifest field of a compile that filled state later compiles may read
    (`Artifacts.fills`, read back by `keying.made.stored_fills`): where its target is
    served, or linked from these objects, that compile must run again before another
    (`service.replay_writers`)."""
    return {"fills": list(artifacts.fills)} if artifacts.fills else {}


def _object_holds(store: Store, obj, current) -> bool:
    """Whether the stored object under `obj`'s key is `obj`'s code: compiled against the
    same interface (callees' return types), and its record of what its compile observed
    still holds. Otherwise `obj` replaces it, or every later recipe would meet the old
    interface and compile its kernels again instead of relinking them."""
    if not store.has_entry(obj.key):
        return False
    manifest = store.lookup(obj.key)
    if manifest is None or interface(manifest) != interface(obj.manifest):
        return False
    record = observed_record(store, manifest)
    return bool(record) and obs.matching_set(record, current) is not None
