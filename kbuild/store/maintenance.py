"""Keeping a store bounded and observable: `kbuild gc` and `kbuild stats`.

gc evicts least-recently-used entries (an entry file's mtime is its last
use; lookups touch it) until the blobs fit the size limit, never the entries
it is told to keep (the current project's current keys), then removes blobs
no entry names, temp files that crashed builds left behind, and keying facts
that other kbuild versions wrote or that went unread for a month. Build
outcomes are appended to ``v1/stats.jsonl``, one JSON line per build.
"""

from __future__ import annotations

import json
import os
import re
import time

from ..errors import ConfigError
from ..sources import prune_facts
from .local import Store, is_object

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1024, "m": 1e6, "mb": 1e6, "mib": 1024**2,
          "g": 1e9, "gb": 1e9, "gib": 1024**3, "t": 1e12, "tb": 1e12, "tib": 1024**4}
_STALE_TMP_SECONDS = 3600
_RECENT_BUILDS = 100
# Logged by builds with a remote tier (remote.RemoteTier.take_counts); 0 in older lines.
_REMOTE_COUNTS = ("remote_hits", "remote_misses", "remote_rejected", "remote_errors",
                  "remote_bytes_fetched", "remote_bytes_pushed")


def parse_size(text, where: str = "--max-size") -> int:
    """'500MB', '2GiB', '1e6'-free plain integers -> bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = _SIZE.match(str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"{where}: cannot read size {text!r}; write it like '500MB' or '2GiB'")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def gc(store: Store, max_size: int | None, keep=()) -> dict:
    """Evict LRU entries down to `max_size` bytes of blobs; remove orphans and stale temp files."""
    keep = set(keep)
    orphans, orphan_bytes = store.remove_orphan_blobs()
    objects = 0
    removed, freed = [], orphan_bytes
    if max_size is not None:
        sizes = {name: store.blob_path(name).stat().st_size for name in store.blob_names()}
        total = sum(sizes.values())
        entries = sorted(store.entries(), key=lambda kv: _last_used(store, kv[0]))
        # The objects a kept target links from stay too, so it can still be relinked.
        keep |= {k for key, m in entries if key in keep
                 for k in (m.get("link") or {}).get("objects", ())}
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
                removed.append(manifest.get("target", key))
            for name in set(manifest["artifacts"].values()):
                users[name].discard(key)
                if not users[name] and name in sizes:
                    store.blob_path(name).unlink(missing_ok=True)
                    total -= sizes[name]
                    freed += sizes[name]
                    orphans += 1
    temp = _remove_stale_temp(store)
    facts = prune_facts(store.base / "facts")
    blobs, size = store.size()
    return {"evicted_entries": len(removed), "evicted": removed, "evicted_objects": objects,
            "removed_blobs": orphans, "freed_bytes": freed, "removed_temp_files": temp,
            "removed_facts": facts, "blobs": blobs, "bytes": size}


def _last_used(store: Store, key: str) -> float:
    try:
        return store.entry_path(key).stat().st_mtime
    except OSError:
        return 0.0


def _blob_users(entries) -> dict:
    users: dict[str, set] = {}
    for key, manifest in entries:
        for name in manifest["artifacts"].values():
            users.setdefault(name, set()).add(key)
    return users


def _remove_stale_temp(store: Store) -> int:
    tmp = store.base / "tmp"
    count = 0
    if tmp.is_dir():
        now = time.time()
        for path in tmp.iterdir():
            try:
                if now - path.stat().st_mtime > _STALE_TMP_SECONDS:
                    path.unlink()
                    count += 1
            except OSError:
                pass
    return count


def record_build(store: Store, summary: dict) -> None:
    """Append one build's counts to the store's stats log (a single small O_APPEND write)."""
    if store.read_only:
        return
    if store.remote is not None:
        summary = {**summary, **store.remote.take_counts()}  # remote_hits, remote_bytes_fetched...
    line = json.dumps({"time": round(time.time(), 3), **summary}, sort_keys=True) + "\n"
    try:
        fd = os.open(store.base / "stats.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # statistics never fail a build


def stats(store: Store) -> dict:
    """Entries, blobs and bytes now, and hits/misses/builds over recent builds."""
    kinds = [is_object(m) for _, m in store.entries()]
    blobs, size = store.size()
    recent = _recent_builds(store)
    totals = {k: sum(int(b.get(k, 0)) for b in recent) for k in ("cached", "built", "failed")
              + _REMOTE_COUNTS}
    return {"store": str(store.root), "entries": kinds.count(False), "objects": kinds.count(True),
            "blobs": blobs, "bytes": size,
            "recent_builds": len(recent), "hits": totals["cached"],
            "misses": totals["built"] + totals["failed"], "builds": totals["built"],
            "failures": totals["failed"],
            **{k: totals[k] for k in _REMOTE_COUNTS},
            "last_build": recent[-1] if recent else None}


def _recent_builds(store: Store) -> list[dict]:
    path = store.base / "stats.jsonl"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()[-_RECENT_BUILDS:]
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a torn line from a crash: skip it
        if isinstance(item, dict):
            out.append(item)
    return out
