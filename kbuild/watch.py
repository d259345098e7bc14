"""`kbuild watch`: one resident process that rebuilds when a project file is saved.

A new `kbuild build` pays Python's start-up, numba's import and numba's first-compile
set-up before it compiles anything; a resident process pays them once. Each round
forgets the project's own modules (they are imported again, from the new sources, so
what is keyed is what is compiled: `discover.forget_project_modules`) and keeps
everything else: numba, NVVM, the libraries the project imports. While it waits it
also does the work a first compile would otherwise wait for (numba's compile set-up).

Saves are found by polling file stats (no inotify in the standard library): every
`POLL_S` seconds, or less often where one look at the tree takes long, so that polling
never takes more than about a tenth of a core.
"""

from __future__ import annotations

import os
import time

# Folders under a project root that never hold its sources.
_SKIP = {"__pycache__", "site-packages", "node_modules", "build", "dist"}

POLL_S = 0.1  # how often the tree is looked at: a save is seen within this, 0.05 s on average
SETTLE_S = 0.05  # after a change is seen, how long an editor's several writes are waited out
_POLL_SHARE = 10  # wait at least this many times as long as one look at the tree took


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


def wait_for_change(roots, extra, before: dict, interval: float = POLL_S,
                    settle: float = SETTLE_S, idle=()) -> tuple[dict, list[str]]:
    """Block until a file changes from `before`; (the new snapshot, what changed).

    `idle`: callables run once first, work done while nobody waits for a build; a save
    made meanwhile is found as soon as they return. An editor that saves in several
    writes is waited out for `settle` seconds."""
    for work in idle:
        work()
    pause = interval
    while True:
        time.sleep(pause)
        start = time.perf_counter()
        now = snapshot(roots, extra)
        pause = max(interval, _POLL_SHARE * (time.perf_counter() - start))
        if changed(before, now):
            time.sleep(settle)
            now = snapshot(roots, extra)
            return now, changed(before, now)
