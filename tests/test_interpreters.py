"""One store, several Pythons (issue 35): what one interpreter left in the store is never
read by another where it could differ, and worker processes start safely on 3.12+.

`ast` parses a function with a nested `def` or `class` into another tree from Python 3.12
on (`type_params`), so the facts keying keeps about a source file (its functions' tree
digests) are the interpreter's own. Another interpreter's facts are written here through
the store's own code (`KeptFacts`) under the folder that interpreter uses, holding what
keying kept for the same file with the nested kernel's tree digest as another parse gives
it; the current interpreter must key as in a store nobody else wrote.
"""

from __future__ import annotations

import json
import sys
import threading
import warnings
from pathlib import Path

from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process
from test_timeouts import QUICK, make_project

NESTED = '''from numba import cuda


@cuda.jit
def k_nested(x):
    def twice(v):
        return v * 2.0
    i = cuda.grid(1)
    if i < x.size:
        x[i] = twice(x[i])
'''


OTHER = QUICK.replace("def quick", "def other").replace("+ 1", "* 2")


def _folder_of(python: str) -> str:
    from kbuild.store import facts

    named = getattr(facts, "facts_folder", None)
    # Before issue 35 every interpreter shared the one folder of this kbuild's keying.
    return named(python) if named else facts.facts_version()


def _tables(store: Path) -> list[Path]:
    return sorted(p for p in (store / "v1" / "facts").glob("*/*.json")
                  if not p.name.startswith("body-"))


def test_a_nested_kernel_keys_alike_after_another_interpreter_wrote_the_store(
        tmp_path, run_kbuild):
    from kbuild.store.facts import KeptFacts

    root = make_project(tmp_path / "project", "nest", {"k_nested": NESTED})
    fresh_store, shared_store = tmp_path / "fresh", tmp_path / "shared"

    def key(store):
        result = run_kbuild("build", "--json", cwd=root, store=store)
        assert result.returncode == 0, result.stdout + result.stderr
        (row,) = result.json["targets"]
        return row["key"]

    fresh = key(fresh_store)
    (table_file,) = _tables(fresh_store)
    record = json.loads(table_file.read_text())
    other = dict(record["table"])
    (slot,) = [s for s in other if s.endswith(" k_nested ast0k")]  # the kernel's tree digest
    other[slot] = "f" * 32  # the same source, parsed by another Python

    python = "cpython-3.99"
    facts_root = shared_store / "v1" / "facts"
    written = KeptFacts(facts_root)
    written.dir = facts_root / _folder_of(python)
    written.save_table(record["source"], other)
    assert _tables(shared_store) == [facts_root / _folder_of(python) / table_file.name]

    assert key(shared_store) == fresh
    assert key(shared_store) == fresh  # cached, keyed from this interpreter's own facts
    assert (facts_root / _folder_of(python) / table_file.name).exists()
    assert json.loads((facts_root / table_file.parent.name / table_file.name).read_text()
                      )["table"] == record["table"]


def test_gc_keeps_another_interpreters_facts_while_used_and_drops_other_kbuilds(
        tmp_path, run_kbuild):
    from kbuild.store.facts import KeptFacts, facts_version

    root = make_project(tmp_path / "project", "nestgc", {"k_nested": NESTED})
    store = tmp_path / "store"
    assert run_kbuild("build", cwd=root, store=store).returncode == 0
    facts_root = store / "v1" / "facts"
    other_python, other_kbuild = _folder_of("cpython-3.99"), "cpython-3.99-0000000000000000"
    for folder in (other_python, other_kbuild):
        kept = KeptFacts(facts_root)
        kept.dir = facts_root / folder
        kept.save_table("0" * 32, {"1 f ast0k": "0" * 32})

    gc = run_kbuild("gc", "--json", cwd=root, store=store)
    assert gc.returncode == 0, gc.stderr
    assert sorted(p.name for p in facts_root.iterdir()) == sorted([facts_version(),
                                                                  other_python])
    assert gc.json["removed_facts"] == 1


# -- worker processes ----------------------------------------------------------------------

_FORKS: list | None = None  # while a test listens: threads running at each os.fork


def _on_fork(event, args):
    if event == "os.fork" and _FORKS is not None:
        _FORKS.append(sorted(t.name for t in threading.enumerate() if t.is_alive()))


def test_a_parallel_build_never_forks_while_another_thread_runs(tmp_path, monkeypatch):
    """A program with a thread of its own builds with -j 2: no fork copies that thread
    (Python 3.12+ warns that the child may deadlock: the warning is an error here, and on
    every Python each fork is seen with the threads running then)."""
    global _FORKS
    from kbuild.project import Project

    root = make_project(tmp_path / "project", "thr", {"quick": QUICK, "other": OTHER})
    monkeypatch.syspath_prepend(str(root))
    project = Project.load(root / "kbuild.toml", store=tmp_path / "store", remote=False)
    stop = threading.Event()
    busy = threading.Thread(target=stop.wait, name="the-programs-own")
    sys.addaudithook(_on_fork)
    busy.start()
    _FORKS = []
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            rows = project.build(jobs=2)
    finally:
        forks, _FORKS = _FORKS, None
        stop.set()
        busy.join()
    assert [r.status for r in rows] == ["built", "built"]
    assert [str(w.message) for w in seen if "fork()" in str(w.message)] == []
    assert [f for f in forks if "the-programs-own" in f] == []
