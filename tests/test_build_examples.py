"""Build the examples project for sm_80 and sm_90 with the real compiler into a temp store.

One cold build per test run (conftest's `examples_template`), copied for this module
(`built`); tests that change the store work on a copy of it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import xxhash

import kbuild

from conftest import blob_bytes, blob_files, entry_files, store_files
from support import kbuild_env
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

ARCHS = ("sm_80", "sm_90")
# (target, number of signatures) as declared in the repository's kbuild.toml.
DECLARED = {
    "examples.saxpy:saxpy": 1,
    "examples.elementwise:square_shift": 2,
    "examples.elementwise:scaled_poly": 1,
    "examples.elementwise:mode_select": 1,
    "examples.geometry:point_norms": 1,
    "examples.closures:apply_double": 2,
    "examples.closures:scale3.func": 1,
    "examples.reductions:mirror_sum": 1,
    "examples.reductions:count_nonzero": 1,
}
SAXPY = "examples.saxpy:saxpy"
SAXPY_SIG = "void(float32, float32[::1], float32[::1], float32[::1])"


class Built:
    """The outcome of the session's one cold build, in this module's copy of its project
    and store (`built_store`: the store that build wrote, which its output names)."""

    def __init__(self, project: Path, store: Path, result, built_store: Path):
        self.project = project
        self.store = store
        self.result = result
        self.built_store = built_store
        self.rows = result.json["targets"]

    def manifest(self, row) -> dict:
        path = self.store / "v1" / "entries" / row["key"][:2] / f"{row['key']}.json"
        return json.loads(path.read_text())

    def row(self, target, arch, signature=None) -> dict:
        (found,) = [r for r in self.rows if r["target"] == target and r["arch"] == arch
                    and (signature is None or r["signature"] == signature)]
        return found


@pytest.fixture(scope="module")
def built(tmp_path_factory, examples_template) -> Built:
    made = examples_template()  # the archs kbuild.toml declares
    assert made.result.returncode == 0, made.result.stderr
    base = tmp_path_factory.mktemp("built")
    project, store = made.copy_to(base / "project", base / "store")
    return Built(project, store, made.result, made.store)


@pytest.fixture
def store_copy(built, tmp_path) -> Path:
    """A private copy of the built store, for tests that change it."""
    copy = tmp_path / "store"
    shutil.copytree(built.store, copy)
    return copy


def _key_rows(rows):
    return [(r["target"], r["signature"], r["arch"], r["key"], r["artifacts"]) for r in rows]


# -- the cold build -------------------------------------------------------------------

def test_cold_build_builds_every_declared_target_for_both_archs(built):
    rows = built.rows
    expected = {(t, a) for t in DECLARED for a in ARCHS}
    assert {(r["target"], r["arch"]) for r in rows} == expected
    assert len(rows) == 2 * sum(DECLARED.values()) == 22
    assert [r["status"] for r in rows] == ["built"] * 22
    assert all(r["error"] is None for r in rows)
    assert len({r["key"] for r in rows}) == 22
    assert built.result.json["summary"]["built"] == 22
    assert built.result.json["summary"]["failed"] == built.result.json["summary"]["cached"] == 0
    assert Path(built.result.json["store"]) == built.built_store
    assert built.result.json["warnings"] == []


def test_ptx_targets_the_rows_arch_and_has_an_entry(built, run_kbuild):
    def cat(row):
        return run_kbuild("cat", row["artifacts"]["ptx"], cwd=built.project, store=built.store)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(cat, built.rows))
    for row, result in zip(built.rows, results):
        assert result.returncode == 0, result.stderr
        ptx = result.stdout
        assert re.findall(r"^\.target\s+(\w+)", ptx, re.M) == [row["arch"]], row
        entries = re.findall(r"^\.(?:visible\s+)?\.entry\s+(\w+)\s*\(", ptx, re.M)
        assert entries == [built.manifest(row)["entry"]], row


def test_cubin_is_elf_holding_the_entry_symbol(built, run_kbuild):
    blobs = blob_files(built.store)
    for row in built.rows:
        cubin = blob_bytes(blobs[row["artifacts"]["cubin"]])
        assert cubin.startswith(b"\x7fELF"), row
        entry = built.manifest(row)["entry"]
        assert entry.startswith("_Z") and entry.encode() in cubin, row
    # `kbuild cat` hands back the very same bytes.
    row = built.rows[0]
    result = run_kbuild("cat", row["artifacts"]["cubin"], cwd=built.project, store=built.store)
    assert result.returncode == 0
    assert result.stdout_bytes == blob_bytes(blobs[row["artifacts"]["cubin"]])


def test_manifests_match_their_rows_and_mark_only_the_grid_sync_kernel_cooperative(built):
    for row in built.rows:
        manifest = built.manifest(row)
        assert manifest["key"] == row["key"]
        assert (manifest["target"], manifest["signature"], manifest["arch"]) == \
            (row["target"], row["signature"], row["arch"])
        assert manifest["artifacts"] == dict(row["artifacts"], observed=manifest["artifacts"]["observed"])
        assert manifest["project"] == "examples"
        expected = row["target"] == "examples.reductions:mirror_sum"
        assert manifest["cooperative"] is expected, row


def test_blob_files_are_named_by_the_xxh3_128_of_their_bytes(built):
    blobs = blob_files(built.store)
    referenced = {h for r in built.rows for h in r["artifacts"].values()}
    objects = {json.loads(p.read_text())["artifacts"]["ltoir"]
               for p in entry_files(built.store, kind="object").values()}
    # Each entry's record of what its compile observed (keying/observed.py) is a blob too.
    observed = {json.loads(p.read_text())["artifacts"]["observed"]
                for kind in ("target", "object") for p in entry_files(built.store, kind=kind).values()}
    assert objects and set(blobs) == referenced | objects | observed
    for name, path in blobs.items():
        assert xxhash.xxh3_128_hexdigest(blob_bytes(path)) == name
        assert path.parent.name == name[2:4] and path.parent.parent.name == name[:2]
    assert (built.store / "CACHEDIR.TAG").read_bytes().startswith(
        b"Signature: 8a477f597d28d172789f06886806bc55")


def test_second_build_is_all_cached_with_identical_keys_and_artifacts(built, run_kbuild):
    before = store_files(built.store / "v1" / "blobs")
    again = run_kbuild("build", "--json", cwd=built.project, store=built.store)
    assert again.returncode == 0, again.stderr
    assert [r["status"] for r in again.json["targets"]] == ["cached"] * 22
    assert again.json["summary"]["cached"] == 22 and again.json["summary"]["built"] == 0
    assert _key_rows(again.json["targets"]) == _key_rows(built.rows)
    assert store_files(built.store / "v1" / "blobs") == before


# -- choosing targets and archs ---------------------------------------------------------

def test_arch_override_selects_only_that_arch(built, store_copy, run_kbuild):
    result = run_kbuild("build", "--json", "--arch", "sm_90", cwd=built.project, store=store_copy)
    assert result.returncode == 0, result.stderr
    rows = result.json["targets"]
    assert len(rows) == 11
    assert {r["arch"] for r in rows} == {"sm_90"}
    assert {r["status"] for r in rows} == {"cached"}
    assert _key_rows(rows) == _key_rows([r for r in built.rows if r["arch"] == "sm_90"])


def test_arch_override_builds_an_arch_the_file_does_not_declare(built, store_copy, run_kbuild):
    entries_before = set(entry_files(store_copy))
    result = run_kbuild("build", "saxpy", "--json", "--arch", "sm_86", cwd=built.project,
                        store=store_copy)
    assert result.returncode == 0, result.stderr
    (row,) = result.json["targets"]
    assert (row["target"], row["arch"], row["status"]) == (SAXPY, "sm_86", "built")
    assert set(entry_files(store_copy)) - entries_before == {row["key"]}
    ptx = blob_bytes(blob_files(store_copy)[row["artifacts"]["ptx"]]).decode()
    assert re.findall(r"^\.target\s+(\w+)", ptx, re.M) == ["sm_86"]


def test_one_target_by_full_name_then_by_short_name(built, store, run_kbuild):
    by_full = run_kbuild("build", SAXPY, "--json", cwd=built.project, store=store)
    assert by_full.returncode == 0, by_full.stderr
    rows = by_full.json["targets"]
    assert [(r["target"], r["arch"], r["status"]) for r in rows] == \
        [(SAXPY, "sm_80", "built"), (SAXPY, "sm_90", "built")]
    # A key does not depend on which other targets were selected.
    assert [r["key"] for r in rows] == [built.row(SAXPY, a)["key"] for a in ARCHS]
    assert set(entry_files(store)) == {r["key"] for r in rows}

    by_short = run_kbuild("build", "saxpy", "--json", cwd=built.project, store=store)
    assert by_short.returncode == 0, by_short.stderr
    assert [(r["target"], r["status"]) for r in by_short.json["targets"]] == \
        [(SAXPY, "cached")] * 2
    assert _key_rows(by_short.json["targets"]) == _key_rows(rows)


def test_a_target_or_arch_named_twice_is_built_once(built, store_copy, run_kbuild):
    result = run_kbuild("build", "saxpy", SAXPY, "--arch", "sm_90,sm_80,sm_90", "--json",
                        cwd=built.project, store=store_copy)
    assert result.returncode == 0, result.stderr
    assert [(r["target"], r["arch"], r["status"]) for r in result.json["targets"]] == \
        [(SAXPY, "sm_90", "cached"), (SAXPY, "sm_80", "cached")]
    assert result.json["summary"]["cached"] == 2


@pytest.mark.parametrize("name", ["examples.closures:scale3.func", "scale3.func", "func"])
def test_attribute_path_target_by_any_unique_name(built, store_copy, run_kbuild, name):
    result = run_kbuild("build", name, "--json", cwd=built.project, store=store_copy)
    assert result.returncode == 0, result.stderr
    rows = result.json["targets"]
    assert [(r["target"], r["arch"], r["status"]) for r in rows] == \
        [("examples.closures:scale3.func", a, "cached") for a in ARCHS]


def test_store_option_before_the_command_is_honoured(built, store_copy, run_kbuild):
    # `kbuild --store DIR build` once fell through to $KBUILD_STORE / ~/.cache/kbuild.
    elsewhere = store_copy.parent / "elsewhere"
    result = run_kbuild("--store", store_copy, "build", "saxpy", "--json",
                        cwd=built.project, store=elsewhere)
    assert result.returncode == 0, result.stderr
    assert Path(result.json["store"]) == store_copy
    assert [r["status"] for r in result.json["targets"]] == ["cached", "cached"]
    assert not elsewhere.exists()


def test_artifacts_do_not_depend_on_what_else_was_built(built, store, run_kbuild):
    """numba mangles a per-process function counter into symbol names; kbuild restarts it
    for every kernel, so one key gives the same bytes whatever else the process compiled.
    (Kernels taking records still differ: numba mangles its record type's creation number.)"""
    alone = run_kbuild("build", "saxpy", "--arch", "sm_90", "--json", cwd=built.project,
                       store=store)
    assert alone.returncode == 0, alone.stderr
    (row,) = alone.json["targets"]
    assert row["key"] == built.row(SAXPY, "sm_90")["key"]
    assert row["artifacts"] == built.row(SAXPY, "sm_90")["artifacts"]


def test_status_reports_missing_targets_without_creating_the_store(built, store, run_kbuild):
    result = run_kbuild("status", "--json", cwd=built.project, store=store)
    assert result.returncode == 0, result.stderr
    assert result.json["summary"] == {"up-to-date": 0, "stale": 0, "missing": 22, "failed": 0,
                                      "unkeyable": 0}
    assert [r["key"] for r in result.json["targets"]] == [r["key"] for r in built.rows]
    assert not store.exists()


# -- clean ----------------------------------------------------------------------------------

def _other_project(root: Path, repo_root: Path) -> Path:
    """A tiny second project sharing the store with examples.

    `examples.saxpy:alias` is examples' saxpy under another name: the same PTX (so the
    same blobs) but another key (so another entry). `examples.elementwise:square_shift`
    has one of examples' target names but other code, hence its own entry.
    """
    pkg = root / "examples"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "saxpy.py").write_text((repo_root / "examples" / "saxpy.py").read_text()
                                  + "\n\nalias = saxpy\n")
    (pkg / "elementwise.py").write_text(
        "from numba import cuda\n\n\n@cuda.jit\ndef square_shift(x, out):\n"
        "    i = cuda.grid(1)\n    if i < out.size:\n        out[i] = x[i] - 1\n")
    (root / "kbuild.toml").write_text(
        '[project]\nname = "other"\narch = ["sm_80"]\n\n'
        f'[kernels."examples.saxpy:alias"]\nsignatures = ["{SAXPY_SIG}"]\n\n'
        '[kernels."examples.elementwise:square_shift"]\n'
        'signatures = ["void(float32[::1], float32[::1])"]\n')
    return root


def test_clean_removes_what_it_reports_and_keeps_blobs_other_projects_use(
        built, store_copy, tmp_path, repo_root, run_kbuild):
    other = _other_project(tmp_path / "other", repo_root)
    first = run_kbuild("build", "--json", cwd=other, store=store_copy)
    assert first.returncode == 0, first.stderr
    other_rows = first.json["targets"]
    assert [r["status"] for r in other_rows] == ["built", "built"]
    alias = other_rows[0]
    assert alias["artifacts"] == built.row(SAXPY, "sm_80")["artifacts"], \
        "precondition: the other project's alias shares examples' saxpy sm_80 blobs"
    kept_blobs = {h for r in other_rows for h in r["artifacts"].values()}

    entries, blobs = entry_files(store_copy), blob_files(store_copy)
    sizes = {name: path.stat().st_size for name, path in blobs.items()}
    result = run_kbuild("clean", cwd=built.project, store=store_copy)
    assert result.returncode == 0, result.stderr
    match = re.search(r"removed (\d+) entries and (\d+) blobs", result.stdout)
    assert match, result.stdout

    entries_after, blobs_after = entry_files(store_copy), blob_files(store_copy)
    removed_blobs = set(blobs) - set(blobs_after)
    assert set(entries) - set(entries_after) == {r["key"] for r in built.rows}
    assert set(entries_after) == {r["key"] for r in other_rows}
    assert int(match.group(1)) == len(entries) - len(entries_after) == 22
    assert int(match.group(2)) == len(removed_blobs) > 0
    # What stays: the other project's artifacts, and the objects its build committed.
    kept_objects = {json.loads(p.read_text())["artifacts"]["ltoir"]
                    for p in entry_files(store_copy, kind="object").values()}
    kept_observed = {json.loads(p.read_text())["artifacts"]["observed"]
                     for kind in ("target", "object")
                     for p in entry_files(store_copy, kind=kind).values()}
    assert set(blobs_after) == kept_blobs | kept_objects | kept_observed
    assert removed_blobs >= {h for r in built.rows for h in r["artifacts"].values()} - kept_blobs

    # The other project's entries are intact: its next build is all cached.
    again = run_kbuild("build", "--json", cwd=other, store=store_copy)
    assert again.returncode == 0, again.stderr
    assert [r["status"] for r in again.json["targets"]] == ["cached", "cached"]

    # clean --all empties the store, and says so.
    everything = run_kbuild("clean", "--all", "--json", cwd=built.project, store=store_copy)
    assert everything.returncode == 0, everything.stderr
    assert everything.json == {"entries": 2, "objects": len(kept_objects),
                               "blobs": 4 + len(kept_objects) + len(kept_observed),
                               "bytes": sum(sizes[name] for name
                                            in kept_blobs | kept_objects | kept_observed),
                               "failures": 0}
    assert entry_files(store_copy, kind=None) == {} and blob_files(store_copy) == {}
    gone = run_kbuild("cat", alias["artifacts"]["ptx"], cwd=other, store=store_copy)
    assert gone.returncode == 1


def test_clean_json_bytes_match_the_files_removed(built, store_copy, run_kbuild):
    blobs = blob_files(store_copy)
    sizes = {name: path.stat().st_size for name, path in blobs.items()}
    objects = len(entry_files(store_copy, kind="object"))
    result = run_kbuild("clean", "--json", cwd=built.project, store=store_copy)
    assert result.returncode == 0, result.stderr
    assert result.json == {"entries": 22, "objects": objects, "blobs": len(blobs),
                           "bytes": sum(sizes.values()), "failures": 0}
    assert entry_files(store_copy, kind=None) == {} and blob_files(store_copy) == {}


# -- cat, help, version ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["0" * 32, "not-a-hash"])
def test_cat_of_an_absent_blob_exits_1(built, run_kbuild, name):
    result = run_kbuild("cat", name, cwd=built.project, store=built.store)
    assert result.returncode == 1
    assert result.stdout == ""
    assert name in result.stderr and str(built.store) in result.stderr


def _console_script() -> str:
    script = Path(sys.executable).with_name("kbuild")
    found = str(script) if script.exists() else shutil.which("kbuild")
    assert found, "the kbuild console script is not installed (pip install -e .)"
    return found


@pytest.mark.parametrize("args, expected", [
    (["--version"], f"kbuild {kbuild.__version__}"),
    (["--help"], "usage: kbuild"),
    (["build", "--help"], "--keep-going"),
])
def test_console_script_version_and_help(tmp_path, args, expected):
    proc = subprocess.run([_console_script(), *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=kbuild_env(tmp_path / "home"))
    assert proc.returncode == 0, proc.stderr
    assert expected in proc.stdout


def test_python_dash_m_kbuild(tmp_path, run_kbuild):
    result = run_kbuild("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.splitlines()[0] == f"kbuild {kbuild.__version__}"
    bare = run_kbuild(cwd=tmp_path)
    assert bare.returncode == 2
    assert "usage: kbuild" in bare.stdout


# -- never a stale kernel ----------------------------------------------------------------------

STALE_MODULE = '''from numba import cuda


@cuda.jit
def add_const(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] + 1.0
'''


def test_an_edit_in_a_long_running_process_never_stores_old_code(tmp_path):
    """numba compiles the function imported earlier; the file on disk is newer. kbuild
    must neither store the old code under the new source's key nor key a mix."""
    from kbuild import Project
    from kbuild.errors import KbuildError

    package = "kbuild_stale_probe"  # a name no other test imports
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    module = tmp_path / package / "m.py"
    module.write_text(STALE_MODULE)
    (tmp_path / "kbuild.toml").write_text(
        f'[project]\narch = ["sm_80"]\n\n[kernels."{package}.m:add_const"]\n'
        'signatures = ["void(float32[::1])"]\n')
    first = Project.load(tmp_path / "kbuild.toml", store=tmp_path / "store")
    assert [r.status for r in first.build()] == ["built"]

    module.write_text(STALE_MODULE.replace("+ 1.0", "+ 2.0"))
    second = Project.load(tmp_path / "kbuild.toml", store=tmp_path / "store")
    try:
        rows = second.build()
    except KbuildError as exc:
        assert "changed after this process imported it" in str(exc)
        return  # refusing to build from a changed source is fine too
    finally:
        sys.modules.pop(f"{package}.m", None)
        sys.modules.pop(package, None)
    (row,) = rows
    if row.status == "failed":  # refused for this target alone (a keying error fails its row)
        assert "changed after this process imported it" in row.error
        return
    ptx = second.store.read_blob(row.artifacts["ptx"]).decode()
    assert "0f40000000" in ptx, "the new source's key holds code that adds 1.0, not 2.0"
