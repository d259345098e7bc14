"""`status`, `explain` and relinked rows compare with the right earlier build (issue 16).

One small project, built a few times through the CLI with real compiles: a kernel `kern`
and a kernel `other`, both calling the device function `helper`. Each step edits the
source, and what kbuild says is checked against the builds the store holds:

- status and explain compare with the stored build closest to today's inputs, not the
  newest (after a revert the newest is of what was reverted);
- a target whose key was built earlier, but not last, is "cached (built earlier, ...)",
  and says what the newest build was for;
- explain shows the diff of a changed body's normalized source, or that the earlier
  source was not kept;
- a relinked row names the device function whose change was all there was.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import entry_files

MODULE = '''from numba import cuda


@cuda.jit(device=True)
def helper(x):
    """Doubles."""
    return x * 2.0


@cuda.jit
def kern(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = helper(x[i]) + 1.0  # the kernel's own constant


@cuda.jit
def other(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = helper(x[i])
'''

TOML = '''[project]
name = "history"
arch = ["sm_80"]

[kernels."pk.k:kern"]
signatures = ["void(float32[::1])"]

[kernels."pk.k:other"]
signatures = ["void(float32[::1])"]
'''

KERN, OTHER = "pk.k:kern", "pk.k:other"


class History:
    """The project, its store and what each build said."""

    def __init__(self, root: Path, run_kbuild):
        self.root, self.store, self.run = root, root / "store", run_kbuild
        (root / "pk").mkdir(parents=True)
        (root / "pk" / "__init__.py").write_text("")
        self.write(helper="2.0", kern="1.0")
        (root / "kbuild.toml").write_text(TOML)

    def write(self, helper: str, kern: str) -> None:
        text = MODULE.replace("x * 2.0", f"x * {helper}").replace("+ 1.0", f"+ {kern}")
        (self.root / "pk" / "k.py").write_text(text)

    def kbuild(self, *args, code: int = 0):
        result = self.run(*args, cwd=self.root, store=self.store)
        assert result.returncode == code, result.stdout + result.stderr
        return result

    def build(self) -> dict:
        return {r["target"]: r for r in self.kbuild("build", "--json").json["targets"]}

    def status(self) -> dict:
        return {r["target"]: r for r in self.kbuild("status", "--json").json["targets"]}

    def explain(self, target: str, *json_flag) -> object:
        result = self.kbuild("explain", target, *json_flag)
        return result.json["targets"][0] if json_flag else result.stdout.splitlines()


@pytest.fixture(scope="module")
def history(tmp_path_factory, run_kbuild):
    """Builds 1-3: helper x*2.0, then x*3.0 (JSON), then x*7.0 (text); kern + 1.0 in all."""
    h = History(tmp_path_factory.mktemp("history"), run_kbuild)
    h.first = h.build()
    h.write(helper="3.0", kern="1.0")
    h.second = h.build()
    h.write(helper="7.0", kern="1.0")
    h.third_text = h.kbuild("build").stdout.splitlines()
    h.third = h.status()  # the keys build 3 made
    return h


def test_a_relinked_row_names_the_device_function_that_changed(history):
    """Before: a bare `relinked`, and no `changed` field."""
    kern, other = history.second[KERN], history.second[OTHER]
    assert (kern["link"], kern["changed"]) == ("lto", None)  # compiled: it makes helper's object
    assert (other["link"], other["changed"]) == ("relink", ["pk.k:helper"])
    line = next(line for line in history.third_text if OTHER in line)
    assert line.endswith("relinked: only device function pk.k:helper changed"), line


def test_after_a_revert_status_blames_only_what_differs_from_the_nearest_build(history):
    """helper back to x*2.0 (build 1's) and kern's constant changed: only kern changed
    against build 1. Before: kern was compared with build 3 and blamed helper too, and
    `other` (cached from build 1) did not say so."""
    history.write(helper="2.0", kern="5.0")
    rows = history.status()
    kern, other = rows[KERN], rows[OTHER]
    assert kern["status"] == "stale"
    assert kern["reasons"] == ["kernel changed (body)"]
    assert (kern["previous_key"], kern["previous_is_newest"]) == (
        history.first[KERN]["key"], False)
    assert other["status"] == "up-to-date" and other["key"] == history.first[OTHER]["key"]
    assert other["newest"]["key"] == history.third[OTHER]["key"]
    assert other["newest"]["reasons"] == ["callee pk.k:helper changed (body)"]

    lines = history.explain(OTHER)
    assert lines[1] == f"  cached (built earlier, {other['built_at']})"
    assert lines[2:] == [f"  the newest build ({other['newest']['built_at']}) was for "
                         "other inputs:", "    callee pk.k:helper changed (body)"]

    lines = history.explain(KERN)
    assert lines[2:] == [
        "  kernel changed (body)",
        f"    --- pk.k:kern (built {kern['previous_built_at']})",
        "    +++ pk.k:kern (now)",
        "    @@ -1,4 +1,4 @@",
        "     def kern(x):",
        "         i = cuda.grid(1)",
        "         if i < x.size:",
        "    -        x[i] = helper(x[i]) + 1.0",
        "    +        x[i] = helper(x[i]) + 5.0",
    ], lines


def test_explain_diffs_a_callee_against_the_newest_of_equally_near_builds(history):
    """helper x*4.0: builds 1, 2 and 3 each differ in helper's body; the newest is taken.
    Before: no diff at all."""
    history.write(helper="4.0", kern="1.0")
    row = history.explain(OTHER, "--json")
    assert row["previous_key"] == history.third[OTHER]["key"] and row["previous_is_newest"]
    (change,) = row["changes"]
    assert change["message"] == "callee pk.k:helper changed (body)"
    # The normalized source: no decorator, docstring or comment.
    assert change["diff"].splitlines()[2:] == [
        "@@ -1,2 +1,2 @@", " def helper(x):", "-    return x * 7.0", "+    return x * 4.0"]


# What can happen to a kept source file: explain says it was not kept, never fails.
DAMAGE = {
    "removed": None,
    "garbled": b"\x00not json{",
    "empty": b"",
    "text edited": "edit",
    "another body's": "swap",
    "a directory": "dir",
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_explain_without_the_earlier_source_says_so(history, damage):
    """Before: no diff and no note."""
    history.write(helper="7.0", kern="6.0")  # against build 3: kern's body
    kept = _body_file(history, history.third[KERN]["key"], "kern")
    saved = kept.read_bytes()
    try:
        _damage(kept, DAMAGE[damage])
        (change,) = history.explain(KERN, "--json")["changes"]
        assert (change["diff"], change["diff_note"]) == (None, "the earlier source was not kept")
        if damage == "removed":
            lines = history.explain(KERN)
            assert lines[-2:] == ["  kernel changed (body)", "    (the earlier source was not kept)"]
    finally:
        if kept.is_dir():
            kept.rmdir()
        kept.write_bytes(saved)


def test_a_relinked_row_with_no_earlier_build_says_only_relinked(history):
    """`other`'s entries gone (gc'd, say) while the objects stay: relinked, reason unknown."""
    for key, path in entry_files(history.store).items():
        if json.loads(path.read_text())["target"] == OTHER:
            path.unlink()
    history.write(helper="8.0", kern="1.0")
    rows = history.build()
    assert (rows[OTHER]["link"], rows[OTHER]["changed"]) == ("relink", None)


def _body_file(history, target_key: str, function: str) -> Path:
    """The kept source of `function`'s body as the entry of `target_key` records it."""
    entry = json.loads(entry_files(history.store)[target_key].read_text())
    (digest,) = [d for path, _, d in entry["inputs"]
                 if path[-1] == "body" and path[-2] == f"kernel pk.k:{function}"]
    (found,) = history.store.glob(f"v1/facts/*/body-{digest}.json")
    return found


def _damage(path: Path, how) -> None:
    if how is None:
        path.unlink()
    elif isinstance(how, bytes):
        path.write_bytes(how)
    elif how == "edit":
        record = json.loads(path.read_text())
        path.write_text(json.dumps(dict(record, text=record["text"] + "\n    pass")))
    elif how == "swap":
        other = next(p for p in path.parent.glob("body-*.json") if p != path)
        path.write_bytes(other.read_bytes())
    else:
        path.unlink()
        path.mkdir()


def test_a_resident_process_rereads_only_entries_that_changed(history, monkeypatch):
    """`kbuild watch` scans the store's entries at every relinking round: files read
    before are not read again unless replaced or touched."""
    from kbuild.store.entries import EntryShelf
    from kbuild.store.local import Store

    store = Store(history.store, read_only=True)
    memo: dict = {}
    first = dict(store.entries(memo))
    reads = []
    original = EntryShelf._read_entry_file
    monkeypatch.setattr(EntryShelf, "_read_entry_file",
                        lambda self, key: reads.append(key) or original(self, key))
    assert dict(store.entries(memo)) == first and reads == []
    key, path = next(iter(entry_files(history.store).items()))
    entry = json.loads(path.read_text())
    path.with_suffix(".tmp").write_text(json.dumps(dict(entry, built_at="2000-01-01T00:00:00Z")))
    path.with_suffix(".tmp").replace(path)  # as a commit replaces it
    again = dict(store.entries(memo))
    assert reads == [key] and again[key]["built_at"] == "2000-01-01T00:00:00Z"
