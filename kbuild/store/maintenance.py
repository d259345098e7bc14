"""Keeping a store bounded and observable: `kbuild gc` and `kbuild stats`.

gc evicts least-recently-used entries (an entry file's mtime is its last
use; lookups touch it) until the blobs fit the size limit, never the entries
it is told to keep (the current project's current keys), then removes blobs
no entry names, temp files that crashed builds left behind, and keying facts
that other kbuild versions wrote or that went unread for a month, and failure
records a month old (see `failures`). Build outcomes are appended to
``v1/stats.jsonl``, one JSON line per build.
"""

from __future__ import annotations

import math
import os
import re
import stat
import time

from ..errors import ConfigError
from ..model import RowStatus
from . import facts, failures, journal, tree
from .local import LAYOUT, Store, is_object, is_output
from .manifest import EntryProblem, load_json
from .statslog import ZEROCONF_SOURCE, record_build  # noqa: F401 - callers import it here

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1024, "m": 1e6, "mb": 1e6, "mib": 1024**2,
          "g": 1e9, "gb": 1e9, "gib": 1024**3, "t": 1e12, "tb": 1e12, "tib": 1024**4}
_STALE_TMP_SECONDS = 3600
# Stats lines counted by `kbuild stats`: every line since the last `--zero`, up to this
# many (the newest); one line is a build or a zero-config process (about 200 bytes).
_RECENT_BUILDS = 100_000
_FALLBACK = "fallback"  # a miss a zero-config process left to numba
# A recorded compile failure older than this goes: its target compiles again once a month,
# and records of keys nothing builds any more do not pile up.
FAILURE_MAX_AGE = 30 * 24 * 3600
# Logged by builds with a remote tier (remote.RemoteTier.take_counts); 0 in older lines.
_REMOTE_COUNTS = ("remote_hits", "remote_misses", "remote_rejected", "remote_errors",
                  "remote_bytes_fetched", "remote_bytes_pushed")


# The store's size cap when none is set: ccache's default (sccache's is 10 GB). A
# kernel's entry (PTX, cubin, record) is tens of KB, so 5 GB holds about 100,000 targets,
# and it fits a CI cache (GitHub's is 10 GB a repository) beside other caches.
DEFAULT_MAX_SIZE = 5 * 10**9
MAX_SIZE_ENV = "KBUILD_MAX_SIZE"
_NO_LIMIT = ("none", "unlimited")


def parse_size(text, where: str = "--max-size") -> int | float:
    """'500MB', '2GiB', '1e6'-free plain integers -> bytes; 'none' -> infinity (no cap)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    if str(text).strip().lower() in _NO_LIMIT:
        return math.inf
    match = _SIZE.match(str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"{where}: cannot read size {text!r}; write it like '500MB' or '2GiB' "
                      "(or 'none' for no limit)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def max_size_setting(given=None, config=None, env=None) -> tuple:
    """(the store's size cap in bytes, None for no limit; where it was set): --max-size
    (`given`), else $KBUILD_MAX_SIZE, else the project's `[store] max_size`, else
    `DEFAULT_MAX_SIZE`."""
    env = os.environ if env is None else env
    if given:
        found, origin = parse_size(given), "--max-size"
    elif env.get(MAX_SIZE_ENV):
        found, origin = parse_size(env[MAX_SIZE_ENV], MAX_SIZE_ENV), MAX_SIZE_ENV
    elif getattr(config, "max_size", None) is not None:
        found, origin = config.max_size, f"{config.path}: [store] max_size"
    else:
        found, origin = DEFAULT_MAX_SIZE, "default"
    return (None if found == math.inf else int(found)), origin


def evict_after_build(store: Store, max_size: int | None, keep, added: bool) -> dict | None:
    """The automatic LRU eviction after a build: gc down to `max_size` when the build
    added to the store and the store is now over it (one walk over the blobs' sizes);
    what gc did, or None when it was not needed."""
    if max_size is None or not added or store.read_only or store.size()[1] <= max_size:
        return None
    return gc(store, max_size, keep)


def clean_store(store: Store) -> dict:
    """`kbuild clean --all` without a project: every entry, the blobs, failure records and
    direct-mode journals of the store."""
    with store.exclusive("clean"):
        removed = objects = 0
        for key, manifest in list(store.entries()):
            store.remove_entry(key)
            if is_object(manifest):
                objects += 1
            elif not is_output(manifest):
                removed += 1
        blobs, freed = store.remove_orphan_blobs()
        failed = failures.remove_records(store, None)
        journal.prune(store.root, -1.0)  # what they name is gone: every project keys in full
    return {"entries": removed, "objects": objects, "blobs": blobs, "bytes": freed,
            "failures": failed}


def gc(store: Store, max_size: int | None, keep=()) -> dict:
    """Evict LRU entries down to `max_size` bytes of blobs; remove orphans and stale temp
    files. Holds the store lock exclusively: no build runs meanwhile, so nothing a build
    has just committed (or is about to use) goes."""
    with store.exclusive("gc"):
        return _gc(store, max_size, set(keep))


def _gc(store: Store, max_size: int | None, keep: set) -> dict:
    orphans, orphan_bytes = store.remove_orphan_blobs()
    objects = 0
    removed, freed = [], orphan_bytes
    if max_size is not None:
        sizes = {name: store.blob_size(name) for name in store.blob_names()}
        total = sum(sizes.values())
        entries = sorted(store.entries(), key=lambda kv: store.last_used(kv[0]))
        # Early-cutoff records keep no blob: they name a target's PTX and cubin, and go
        # with them (a record is only a shortcut to what a build would make again).
        records = _blob_users([(k, m) for k, m in entries if is_output(m)])
        entries = [(k, m) for k, m in entries if not is_output(m)]
        # The objects a kept target links from stay too, so it can still be relinked.
        keep |= {k for key, m in entries if key in keep
                 for k in _linked_objects(m)}
        users = _blob_users(entries)
        for key, manifest in entries:
            if total <= max_size:
                break
            if key in keep:
                continue
            store.remove_entry(key)
            if is_object(manifest):
                objects += 1
            else:
                removed.append({"target": manifest.get("target", key), "key": key,
                                "signature": manifest.get("signature"),
                                "arch": manifest.get("arch")})
            for name in set(manifest["artifacts"].values()):
                users[name].discard(key)
                if not users[name] and name in sizes and store.remove_blob(name):
                    total -= sizes[name]
                    freed += sizes[name]
                    orphans += 1
                    for record in records.get(name, ()):
                        store.remove_entry(record)
    temp = _remove_stale_temp(store)
    removed_facts = facts.prune(store)
    removed_journals = journal.prune(store.root, facts.FACTS_MAX_AGE) if not store.read_only \
        else 0
    failed = failures.prune(store, FAILURE_MAX_AGE)
    _remove_old_index(store)
    blobs, size = store.size()
    return {"evicted_entries": len(removed), "evicted": [r["target"] for r in removed],
            "evicted_targets": removed, "evicted_objects": objects,
            "removed_blobs": orphans, "freed_bytes": freed, "removed_temp_files": temp,
            "removed_facts": removed_facts, "removed_journals": removed_journals,
            "removed_failures": failed, "blobs": blobs, "bytes": size}


def _linked_objects(manifest: dict) -> list:
    link = manifest.get("link")
    objects = link.get("objects") if isinstance(link, dict) else None
    return [k for k in objects if isinstance(k, str)] if isinstance(objects, list) else []


def _blob_users(entries) -> dict:
    users: dict[str, set] = {}
    for key, manifest in entries:
        for name in manifest["artifacts"].values():
            users.setdefault(name, set()).add(key)
    return users


def _remove_stale_temp(store: Store) -> int:
    """Temp files crashed builds left in v1/tmp (a link there is removed, never followed)."""
    now, count = time.time(), 0
    for name, info in tree.listing(store.root, f"{LAYOUT}/tmp"):
        if now - info.st_mtime > _STALE_TMP_SECONDS and not stat.S_ISDIR(info.st_mode):
            count += store.folder.remove(f"{LAYOUT}/tmp/{name}")
    return count


def _remove_old_index(store: Store) -> None:
    """Older kbuilds kept a diskcache index in v1/index; nothing reads it now."""
    info = tree.lstat(store.root, f"{LAYOUT}/index")
    if info is None or store.read_only:
        return
    if not stat.S_ISDIR(info.st_mode):
        store.folder.remove(f"{LAYOUT}/index")
        return
    for name, finfo in tree.listing(store.root, f"{LAYOUT}/index"):
        if not stat.S_ISDIR(finfo.st_mode):
            store.folder.remove(f"{LAYOUT}/index/{name}")
    try:
        with tree.opened_dir(store.root, [LAYOUT]) as fd:
            os.rmdir("index", dir_fd=fd)
    except OSError:
        pass  # something unexpected inside it: left alone


def stats(store: Store) -> dict:
    """Entries, blobs and bytes now; hits, misses and the hit rate of the builds and
    zero-config processes logged since the last `--zero`, store-wide and per project."""
    kinds = [is_object(m) for _, m in store.entries() if not is_output(m)]
    blobs, size = store.size()
    recent = _recent_builds(store)
    projects = {}
    for line in recent:
        name = line.get("project") if isinstance(line.get("project"), str) else "(unnamed)"
        projects.setdefault(name, []).append(line)
    return {"store": str(store.root), "entries": kinds.count(False), "objects": kinds.count(True),
            "blobs": blobs, "bytes": size, "recent_builds": len(recent),
            **_totals(recent),
            "projects": {name: _totals(lines) for name, lines in sorted(projects.items())},
            "last_build": recent[-1] if recent else None}


def _totals(lines) -> dict:
    """Hits, misses (built, failed, or left to numba by a zero-config process), the hit
    rate (None before anything was asked) and the remote's counts, over stats `lines`."""
    totals = {k: sum(_count(b.get(k)) for b in lines)
              for k in (RowStatus.CACHED, RowStatus.BUILT, RowStatus.FAILED, _FALLBACK)
              + _REMOTE_COUNTS}
    hits = totals[RowStatus.CACHED]
    misses = totals[RowStatus.BUILT] + totals[RowStatus.FAILED] + totals[_FALLBACK]
    return {"runs": len(lines),
            "zeroconf_runs": sum(line.get("source") == ZEROCONF_SOURCE for line in lines),
            "hits": hits, "misses": misses,
            "hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
            "builds": totals[RowStatus.BUILT], "failures": totals[RowStatus.FAILED],
            "fallbacks": totals[_FALLBACK], **{k: totals[k] for k in _REMOTE_COUNTS}}


def zero_stats(store: Store) -> bool:
    """Forget the logged counts (`kbuild stats --zero`, ccache's `-z`); whether any were."""
    if tree.lstat(store.root, f"{LAYOUT}/stats.jsonl") is None:
        return False
    store.claim()
    return bool(store.folder.remove(f"{LAYOUT}/stats.jsonl"))


def _count(value) -> int:
    """A count from a stats line; anything else (a hand-edited or torn line) counts 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _recent_builds(store: Store) -> list[dict]:
    try:
        data, _ = tree.read_file(store.root, f"{LAYOUT}/stats.jsonl", 64 << 20)
    except OSError:
        return []
    if not data:
        return []
    out = []
    for line in data.decode("utf-8", "replace").splitlines()[-_RECENT_BUILDS:]:
        try:
            item = load_json(line, "stats line", 1 << 16)
        except EntryProblem:
            continue  # a torn line from a crash: skip it
        if isinstance(item, dict):
            out.append(item)
    return out


def pinned(store: Store, keep) -> tuple[int, int]:
    """What gc may not evict while it keeps the entries `keep`: those entries and the
    objects they link from, as (how many entries, the bytes of the blobs they name)."""
    entries, blobs = set(), set()
    for key in keep:
        manifest = store.lookup(key)
        if manifest is None:
            continue
        objects = (manifest.get("link") or {}).get("objects", ())
        for entry_key, entry in [(key, manifest)] + [(k, store.lookup(k)) for k in objects]:
            if entry is not None:
                entries.add(entry_key)
                blobs.update(entry["artifacts"].values())
    size = sum(store.blob_path(b).stat().st_size for b in blobs if store.blob_path(b).is_file())
    return len(entries), size
