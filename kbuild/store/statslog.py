"""The store's stats log, `v1/stats.jsonl`: one JSON line per build or zero-config process
(its counts, project and source), appended by one small O_APPEND write; read by
`kbuild stats` (`maintenance.stats`). Kept apart from the rest of maintenance so that a
zero-config process logging its counts at exit imports next to nothing.
"""

from __future__ import annotations

import json
import os
import stat
import time

from . import tree
from .local import LAYOUT, Store

# The `source` of a zero-config process's line (a build's is "build").
ZEROCONF_SOURCE = "zeroconf"


def record_build(store: Store, summary: dict, *, project: str | None = None,
                 source: str = "build") -> None:
    """Append one build's (or zero-config process's) counts to the store's stats log, with
    the project they are of (a single small O_APPEND write)."""
    if store.read_only:
        return
    summary = {**summary, **store.tier_counts()}  # remote_hits, remote_bytes_fetched...
    line = json.dumps({"time": round(time.time(), 3), "project": project, "source": source,
                       **summary}, sort_keys=True) + "\n"
    try:
        with tree.opened_dir(store.root, [LAYOUT]) as dirfd:
            fd = os.open("stats.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=dirfd)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # statistics never fail a build
