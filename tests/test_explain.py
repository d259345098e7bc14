"""`kbuild status` and `kbuild explain` name the right cause for every edit of the matrix.

Each soundness case of the edit matrix (editmatrix_support.SOUNDNESS) is
applied to a copy of the built baseline; `kbuild status --json` must call
exactly the rebuilt targets stale (it is the dry run of `build`) and give the
expected reason for each. `kbuild explain TARGET` is checked on a few cases, as
JSON and as text, and the pure `explain.diff` on hand-made trees.
"""

from __future__ import annotations

import json

import pytest

from editmatrix_support import (
    ALL, SOUNDNESS, checkout, make_baseline, manifest, replace, run_kbuild, short,
)
from kbuild.keying.explain import diff
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, editproj_template):
    return make_baseline(tmp_path_factory.mktemp("baseline"), editproj_template)


def _reasons(rows) -> dict:
    """Short target name -> every reason given for any of its rows."""
    out: dict = {}
    for row in rows:
        out.setdefault(short(row["target"]), []).extend(row["reasons"])
    return out


@pytest.mark.parametrize("case", SOUNDNESS, ids=lambda c: c.id)
def test_status_names_the_cause(baseline, tmp_path, case):
    project, store = checkout(baseline, tmp_path)
    case.apply(project)
    result = run_kbuild(project, store, "status", *case.args, env_extra=case.env)
    not_fresh = {short(r["target"]) for r in result["targets"] if r["status"] != "up-to-date"}
    assert not_fresh == case.rebuilt
    reasons = _reasons(r for r in result["targets"] if r["status"] != "up-to-date")
    for target, wanted in case.explains.items():
        for expected in (wanted,) if isinstance(wanted, str) else wanted:
            assert any(expected in reason for reason in reasons[target]), \
                f"{target}: no reason contains {expected!r}: {reasons[target]}"
    for row in result["targets"]:
        if row["status"] == "stale":
            assert row["reasons"], f"{row['target']} is stale without a reason"
            assert row["previous_key"] != row["key"]


EXPLAINED = {
    "callee-in-other-file-body": ("k_sq", ["callee lab.mathx:sq changed (body)"]),
    "callee-chain-leaf": ("k_chain", ["callee lab.vec:axpy2 > callee lab.mathx:twice changed (body)"]),
    "default-argument-value": ("k_shift", ["callee lab.mathx:shift: default #1 1.0 -> 2.0"]),
    "module-constant": ("k_scale", ["global consts.SCALE 2.5 -> 3.0"]),
    "closure-factory-argument": ("k_double", [
        "callee lab.closures:make_scaler.<locals>.scale: closure factor 2.0 -> 3.0"]),
    "option-fastmath-added": ("k_sq", ["option fastmath False -> True"]),
    "enum-member-value": ("k_mode", ["global Mode.FAST Mode.FAST=1 -> Mode.FAST=3"]),
    "callees-swapped-between-names": ("k_pair", [
        "global first lab.mathx:sq -> lab.mathx:cube",
        "global second lab.mathx:cube -> lab.mathx:sq"]),
}


@pytest.mark.parametrize("case_id", sorted(EXPLAINED))
def test_explain_json_gives_exactly_the_cause(baseline, tmp_path, case_id):
    """Exactly these reasons: one edit, one explanation, no noise."""
    case = next(c for c in SOUNDNESS if c.id == case_id)
    target, expected = EXPLAINED[case_id]
    project, store = checkout(baseline, tmp_path)
    case.apply(project)
    result = run_kbuild(project, store, "explain", target)
    (row,) = result["targets"]
    assert row["status"] == "stale"
    assert sorted(row["reasons"]) == sorted(expected)
    assert [c["message"] for c in row["changes"]] == row["reasons"]


def test_explain_record_edits_name_the_field(baseline, tmp_path):
    case = next(c for c in SOUNDNESS if c.id == "record-field-added")
    project, store = checkout(baseline, tmp_path)
    case.apply(project)
    rows = run_kbuild(project, store, "status", "k_points", "k_origin")["targets"]
    reasons = _reasons(rows)
    assert "signature > argument 1 record: field 'z' added (float32 @8)" in reasons["k_points"]
    assert "signature > argument 1 record: field 'tag' uint8 @8 -> uint8 @12" in reasons["k_points"]
    assert "global Point record: field 'z' added (float32 @8)" in reasons["k_origin"]


def test_explain_text_output(baseline, tmp_path):
    from support import run

    project, store = checkout(baseline, tmp_path)
    replace("lab/consts.py", "SCALE = 2.5", "SCALE = 3.0")(project)
    proc = run("explain", "k_scale", "--config", project / "kbuild.toml", "--store", store,
               cwd=tmp_path, home=tmp_path / "home", bytecode=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "lab.kernels:k_scale void(float32[::1], float32[::1]) sm_80: stale",
        "  global consts.SCALE 2.5 -> 3.0",
    ]


def test_explain_up_to_date_and_never_built(baseline, tmp_path):
    project, store = checkout(baseline, tmp_path)
    (row,) = run_kbuild(project, store, "explain", "k_sq")["targets"]
    assert (row["status"], row["reasons"]) == ("up-to-date", [])
    rows = run_kbuild(project, store, "explain", "k_sq", "--arch", "sm_90")["targets"]
    assert [(r["status"], r["reasons"]) for r in rows] == [
        ("missing", ["never built into this store"])]


def test_explain_toolchain_difference(baseline, tmp_path):
    """An entry built by another numba: status says which component changed.

    Rewriting the stored manifest stands in for an older toolchain: its
    recorded `toolchain > numba` input is changed and the entry moved off the
    current key, as a build with that numba would have left it.
    """
    project, store = checkout(baseline, tmp_path)
    (row,) = run_kbuild(project, store, "status", "k_sq")["targets"]
    entry = manifest(store, row["key"])
    numba_version = None
    for path, text, _ in entry["inputs"]:
        if path[-2:] == ["toolchain", "numba"]:
            numba_version = text
    assert numba_version
    old_key = "0" * 32
    entry["key"] = old_key
    for item in entry["inputs"]:
        if item[0][-2:] == ["toolchain", "numba"]:
            item[1], item[2] = "0.1.0", "f" * 32
        elif item[0] in (["target"], ["target", "toolchain"]):
            item[2] = "e" * 32  # the digests above it changed too
    entries = store / "v1" / "entries"
    (entries / row["key"][:2] / f"{row['key']}.json").unlink()
    (entries / old_key[:2]).mkdir(exist_ok=True)
    (entries / old_key[:2] / f"{old_key}.json").write_text(json.dumps(entry))
    import shutil

    shutil.rmtree(store / "v1" / "index", ignore_errors=True)
    (row,) = run_kbuild(project, store, "explain", "k_sq")["targets"]
    assert row["status"] == "stale"
    assert row["reasons"] == [f"toolchain: numba 0.1.0 -> {numba_version}"]


# -- the pure diff ------------------------------------------------------------------

def _flat(*items):
    return [[list(path), text, digest] for path, text, digest in items]


def test_diff_reports_the_topmost_changed_inputs():
    old = _flat((("target",), "k", "r1"), (("target", "kernel m:k"), "m:k", "k1"),
                (("target", "kernel m:k", "body"), "source", "b1"),
                (("target", "kernel m:k", "callee m:f"), "m:f", "f1"),
                (("target", "kernel m:k", "callee m:f", "body"), "source", "fb1"),
                (("target", "kernel m:k", "global N"), "3", "n1"),
                (("target", "arch"), "sm_80", "a1"))
    new = _flat((("target",), "k", "r2"), (("target", "kernel m:k"), "m:k", "k2"),
                (("target", "kernel m:k", "body"), "source", "b1"),
                (("target", "kernel m:k", "callee m:f"), "m:f", "f2"),
                (("target", "kernel m:k", "callee m:f", "body"), "source", "fb2"),
                (("target", "kernel m:k", "option max_registers"), "32", "o1"),
                (("target", "arch"), "sm_80", "a1"))
    messages = sorted(r.message for r in diff(old, new))
    assert messages == ["callee m:f changed (body)", "global N removed (3)",
                        "option max_registers added (32)"]


def test_diff_of_equal_trees_is_empty():
    tree = _flat((("target",), "k", "r"), (("target", "arch"), "sm_80", "a"))
    assert diff(tree, tree) == []


def test_diff_body_keyed_another_way():
    old = _flat((("target",), "k", "r1"), (("target", "kernel m:k"), "m:k", "k1"),
                (("target", "kernel m:k", "body"), "source", "b1"))
    new = _flat((("target",), "k", "r2"), (("target", "kernel m:k"), "m:k", "k2"),
                (("target", "kernel m:k", "body"), "source with line numbers", "b2"))
    assert [r.message for r in diff(old, new)] == [
        "kernel changed (body: source -> source with line numbers)"]


def test_every_target_reachable_from_the_matrix():
    """Each target is rebuilt by at least one soundness edit (none is dead weight)."""
    rebuilt = set().union(*(c.rebuilt for c in SOUNDNESS if c.rebuilt != ALL))
    assert rebuilt == ALL
