"""`kbuild watch`: one resident process that rebuilds when a project file is saved.

A new `kbuild build` pays Python's start-up, numba's import and numba's first-compile
set-up before it compiles anything; a resident process pays them once. Each round
forgets the project's own modules (they are imported again, from the new sources, so
what is keyed is what is compiled: `discover.forget_project_modules`) and keeps
everything else: numba, NVVM, the libraries the project imports.
"""

from __future__ import annotations

import os
import time

# Folders under a project root that never hold its sources.
_SKIP = {"__pycache__", "site-packages", "node_modules", "build", "dist"}


def snapshot(roots, extra=()) -> dict:
    """path -> (mtime_ns, size) of every .py file under `roots`, and of `extra` files."""
    seen = {}
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in _SKIP and not d.startswith(".")
                       and not os.path.exists(os.path.join(folder, d, "pyvenv.cfg"))]
            for name in files:
                if name.endswith(".py"):
                    _stat_into(seen, os.path.join(folder, name))
    for path in extra:
        _stat_into(seen, str(path))
    return seen


def _stat_into(seen: dict, path: str) -> None:
    try:
        st = os.stat(path)
    except OSError:  # removed between the listing and the stat: it counts as gone
        return
    seen[path] = (st.st_mtime_ns, st.st_size)


def changed(before: dict, after: dict) -> list[str]:
    """The files added, removed or modified between two snapshots, sorted."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def wait_for_change(roots, extra, before: dict, interval: float = 0.25,
                    settle: float = 0.1) -> tuple[dict, list[str]]:
    """Block until a file changes; (the new snapshot, what changed). An editor that saves
    in several writes is waited out for `settle` seconds."""
    while True:
        time.sleep(interval)
        now = snapshot(roots, extra)
        if changed(before, now):
            time.sleep(settle)
            now = snapshot(roots, extra)
            return now, changed(before, now)
