"""The store as CI uses it: moved, archived, shared by concurrent builds, killed, damaged, bounded.

Real compiler, real store; `kbuild` runs in the test process (support.run_in_process),
except the concurrent, killed and waiting builds, which are processes of their own. The
examples are built once per test run for sm_90 only (conftest's `examples_template`) and
copied for this module; a test that changes the project or the store works on a copy of
both.
"""

from __future__ import annotations

import ast
import fcntl
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from kbuild.keying.encode import digest

from conftest import (BuiltExamples, blob_bytes, blob_files, built_examples, copy_examples,
                      entry_files, store_files)
from support import NVVM_COMPILE, counting, counts, kbuild_argv, kbuild_env
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

ARCH = "sm_90"
SAXPY = "examples.saxpy:saxpy"
SAXPY_LINE = "out[i] = a * x[i] + y[i]"
SAXPY_EDITED = "out[i] = a * x[i] - y[i]"


@pytest.fixture(scope="module")
def built(tmp_path_factory, examples_template) -> BuiltExamples:
    """The session's one cold build for sm_90, copied for this module."""
    return built_examples(tmp_path_factory.mktemp("ci"), examples_template, ARCH)


@pytest.fixture
def build(run_kbuild):
    """`build(project, store, *args)`: `kbuild build --json --arch sm_90` there."""

    def run(project, store, *args):
        return run_kbuild("build", "--json", "--arch", ARCH, *args, cwd=project, store=store)

    return run


def clone(built: BuiltExamples, dest: Path) -> tuple[Path, Path]:
    """A private copy of the built project and store under `dest`."""
    shutil.copytree(built.project, dest / "project")
    shutil.copytree(built.store, dest / "store")
    return dest / "project", dest / "store"


def statuses(result) -> dict:
    """key -> status of one `build --json`."""
    return {r["key"]: r["status"] for r in result.json["targets"]}


def warning_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("kbuild: warning:")]


def assert_blobs_verify(store: Path) -> None:
    for name, path in blob_files(store).items():
        assert digest(blob_bytes(path)) == name, f"blob {path} does not match its name"


def edit_saxpy(project: Path) -> None:
    path = project / "examples" / "saxpy.py"
    source = path.read_text()
    assert SAXPY_LINE in source
    path.write_text(source.replace(SAXPY_LINE, SAXPY_EDITED))


def popen_build(project: Path, env: dict, *args) -> subprocess.Popen:
    return subprocess.Popen(kbuild_argv("build", "--json", "--arch", ARCH, *args), cwd=project,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


# -- 1. relocatable --------------------------------------------------------------------

@pytest.mark.parametrize("how", ["move", "copy-with-new-mtimes"])
def test_a_project_and_store_at_new_paths_are_all_cached(built, build, tmp_path, how):
    project, store = clone(built, tmp_path / "old")
    new_project, new_store = tmp_path / "runner" / "checkout", tmp_path / "restored" / "cache"
    if how == "move":
        new_project.parent.mkdir()
        new_store.parent.mkdir()
        shutil.move(project, new_project)
        shutil.move(store, new_store)
    else:  # what a cache restore does: fresh files, fresh mtimes
        shutil.copytree(project, new_project, copy_function=shutil.copy)
        shutil.copytree(store, new_store, copy_function=shutil.copy)
    result = build(new_project, new_store)
    assert result.returncode == 0, result.stderr
    assert [(r["key"], r["status"], r["artifacts"]) for r in result.json["targets"]] == \
        [(r["key"], "cached", r["artifacts"]) for r in built.rows]
    assert warning_lines(result) == []


def test_no_store_file_names_the_project_the_store_or_the_machine(built):
    # Where the cold build ran (the session's template) and where this module's copy is.
    paths = {str(p) for where in ((built.built_project, built.built_store),
                                  (built.project, built.store))
             for p in (where[0], where[1], where[0].resolve(), where[1].resolve(),
                       where[1].parent)}
    host = socket.gethostname()
    # As a whole word: a short host name such as "vm" is also inside "nvvm". In binary
    # data (LTO-IR, cubins) as a string would be embedded there, between separators:
    # two random bytes spell a short host name somewhere in a few hundred KB.
    host_word = re.compile(rb"(?<![A-Za-z0-9])" + re.escape(host.encode()) + rb"(?![A-Za-z0-9])")
    host_string = re.compile(rb"(?<=[\0/ \"'=:@\n])" + re.escape(host.encode())
                             + rb"(?=[\0/ \"':.\n])")
    checked = 0
    for path in sorted(built.store.rglob("*")):
        if not path.is_file() or path.suffix == ".lock":
            continue
        # A blob's own bytes, unpacked: compressed bytes are random, and spell anything.
        data = blob_bytes(path) if "blobs" in path.parts else path.read_bytes()
        for text in paths:
            assert text.encode() not in data, f"{path} contains the path {text}"
        # In text: a manifest, a PTX, or a printable run of a binary (as `strings` finds
        # them, 4 bytes or more). Two random bytes of an LTO-IR blob can spell "vm".
        for run in re.finditer(rb"[\x20-\x7e]{4,}", data):
            assert not host_word.search(run.group()), f"{path} contains the host name {host!r}"
        checked += 1
    assert len(entry_files(built.store)) == len(built.rows) and checked > len(built.rows)


# -- 2. export / import through the CLI -----------------------------------------------

def test_export_then_import_into_an_empty_store_elsewhere_is_all_cached(
        built, build, run_kbuild, tmp_path):
    archive = tmp_path / "kernels.tar.gz"
    done = run_kbuild("export", archive, "--arch", ARCH, "--json", cwd=built.project,
                      store=built.store)
    assert done.returncode == 0, done.stderr
    assert done.json["entries"] == len(built.rows) and archive.is_file()

    checkout = copy_examples(built.project, tmp_path / "machine-b" / "checkout")
    store_b = tmp_path / "machine-b" / "store"
    first = run_kbuild("import", archive, "--json", cwd=checkout, store=store_b)
    assert first.returncode == 0, first.stderr
    assert first.json["new_entries"] == len(built.rows) and first.json["new_blobs"] > 0
    again = run_kbuild("import", archive, "--json", cwd=checkout, store=store_b)
    assert again.returncode == 0, again.stderr
    assert (again.json["new_entries"], again.json["new_blobs"]) == (0, 0)

    result = build(checkout, store_b)
    assert result.returncode == 0, result.stderr
    assert [(r["key"], r["status"], r["artifacts"]) for r in result.json["targets"]] == \
        [(r["key"], "cached", r["artifacts"]) for r in built.rows]


def test_import_of_an_archive_with_a_dotdot_member_exits_2_and_changes_nothing(
        built, run_kbuild, tmp_path):
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("../x")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"pwn"))
    _, store = clone(built, tmp_path)
    before = store_files(store)
    done = run_kbuild("import", archive, cwd=tmp_path / "project", store=store)
    assert done.returncode == 2
    assert "'../x'" in done.stderr and "nothing was imported" in done.stderr
    assert store_files(store) == before
    assert not (tmp_path / "x").exists()


# -- 3. concurrent builds on one store ----------------------------------------------------

def test_four_simultaneous_builds_compile_each_key_once_and_agree(
        repo_root, build, tmp_path):
    project = copy_examples(repo_root, tmp_path / "project")
    store = tmp_path / "store"
    env = kbuild_env(tmp_path / "home", store=store)
    procs = [popen_build(project, env) for _ in range(4)]
    outputs = [p.communicate(timeout=240) for p in procs]
    results = []
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err.decode()
        results.append(json.loads(out))

    keys = [r["key"] for r in results[0]["targets"]]
    builders = {key: 0 for key in keys}
    for result in results:
        rows = result["targets"]
        assert [r["key"] for r in rows] == keys
        assert {r["status"] for r in rows} <= {"built", "cached"}
        for r in rows:
            builders[r["key"]] += r["status"] == "built"
        assert [r["artifacts"] for r in rows] == [r["artifacts"] for r in results[0]["targets"]]
    assert builders == {key: 1 for key in keys}, "a key was compiled by two processes"

    fifth = build(project, store)
    assert set(statuses(fifth).values()) == {"cached"}
    assert len(entry_files(store)) == len(keys)
    assert_blobs_verify(store)


def test_a_build_waiting_for_a_locked_key_first_builds_and_releases_its_own(
        built, run_kbuild, tmp_path):
    # Stands in for a second build that took one key first. Before the fix the build
    # waited for it while holding all its other locks: two builds that split the keys
    # between them waited for each other forever.
    project = copy_examples(built.project, tmp_path / "project")
    store = tmp_path / "store"
    held, first = built.keys[-1], built.keys[0]
    (store / "v1" / "locks").mkdir(parents=True)
    fd = os.open(store / "v1" / "locks" / f"{held}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    proc = popen_build(project, kbuild_env(tmp_path / "home", store=store), "-j1")
    try:
        wait_until(lambda: len(entry_files(store)) == len(built.keys) - 1, 120,
                   "the unlocked targets to be committed")
        probe = os.open(store / "v1" / "locks" / f"{first}.lock", os.O_RDWR)
        try:
            # Its own locks are given back while it waits (retry: it may be mid-release).
            wait_until(lambda: _try_flock(probe), 30, f"the lock of {first} to be released")
        finally:
            os.close(probe)
        assert proc.poll() is None, "the build did not wait for the locked key"
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    # Nobody committed the held key, so the waiter built it after the lock was free.
    assert set(statuses_of(json.loads(out)).values()) == {"built"}


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


def statuses_of(obj: dict) -> dict:
    return {r["key"]: r["status"] for r in obj["targets"]}


# -- 4. crash safety ----------------------------------------------------------------------

def test_a_build_killed_mid_way_leaves_a_store_the_next_build_completes(
        built, build, run_kbuild, tmp_path):
    project = copy_examples(built.project, tmp_path / "project")
    store = tmp_path / "store"
    proc = popen_build(project, kbuild_env(tmp_path / "home", store=store), "-j1")
    try:
        wait_until(lambda: proc.poll() is not None or entry_files(store), 120,
                   "the first committed entry")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    committed = len(entry_files(store))
    assert committed >= 1  # killed after some (usually not all) entries were committed

    # Whatever was committed is whole: valid JSON naming blobs that exist and verify.
    for key, path in entry_files(store, kind=None).items():
        manifest = json.loads(path.read_text())
        assert manifest["key"] == key
        for name in manifest["artifacts"].values():
            assert digest(blob_bytes(blob_files(store)[name])) == name
    assert_blobs_verify(store)

    result = build(project, store)
    assert result.returncode == 0, result.stderr
    assert warning_lines(result) == []
    assert set(statuses(result).values()) <= {"built", "cached"}
    assert sum(s == "cached" for s in statuses(result).values()) == committed
    assert [r["key"] for r in result.json["targets"]] == built.keys
    for row in result.json["targets"]:
        for name in row["artifacts"].values():
            assert digest(blob_bytes(blob_files(store)[name])) == name
    status = run_kbuild("status", "--json", "--arch", ARCH, cwd=project, store=store)
    assert status.json["summary"] == {"up-to-date": len(built.keys), "stale": 0, "missing": 0,
                                      "failed": 0, "unkeyable": 0}


def test_leftover_temp_files_are_harmless_and_gc_removes_the_old_ones(
        built, build, run_kbuild, tmp_path):
    project, store = clone(built, tmp_path)
    tmp = store / "v1" / "tmp"
    old, fresh = tmp / "0123456789abcdef.crashed", tmp / "fedcba9876543210.writing"
    old.write_bytes(b"half a cubin")
    fresh.write_bytes(b"another build's write in progress")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))

    result = build(project, store)
    assert result.returncode == 0 and warning_lines(result) == []
    assert set(statuses(result).values()) == {"cached"}

    gc = run_kbuild("gc", "--json", cwd=project, store=store)
    assert gc.returncode == 0, gc.stderr
    assert gc.json["removed_temp_files"] == 1 and gc.json["evicted_entries"] == 0
    assert not old.exists() and fresh.exists()


def test_gc_drops_facts_of_other_kbuild_versions_and_long_unread_ones(
        built, build, run_kbuild, tmp_path):
    project, store = clone(built, tmp_path)
    facts = store / "v1" / "facts"
    (current,) = [d for d in facts.iterdir() if d.is_dir()]
    in_use = sorted(current.glob("*.json"))
    assert in_use  # the build remembered what it parsed
    other_version = facts / "0000000000000000"
    other_version.mkdir()
    (other_version / "a.json").write_text("{}")
    unread = current / ("0" * 32 + ".json")  # an edited file's old facts
    unread.write_text("{}")
    long_ago = time.time() - 40 * 24 * 3600
    for path in [unread, *in_use]:
        os.utime(path, (long_ago, long_ago))

    gc = run_kbuild("gc", "--json", cwd=project, store=store)
    assert gc.returncode == 0, gc.stderr
    assert gc.json["removed_facts"] == 2
    assert not other_version.exists() and not unread.exists()
    assert all(path.exists() for path in in_use)  # gc's own keying read them: still in use
    again = build(project, store)
    assert set(statuses(again).values()) == {"cached"}


# -- 5. corruption: reported once, healed by rebuilding only what it hit ------------------

def _truncate_cubin(store, built):
    row = built.row(SAXPY)
    path = blob_files(store)[row["artifacts"]["cubin"]]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return {row["key"]}, "corrupt blob"


def _garble_manifest(store, built):
    row = built.row(SAXPY)
    entry_files(store)[row["key"]].write_text("{not json")
    return {row["key"]}, "not valid JSON"


def _delete_a_blob(store, built):
    name = built.row(SAXPY)["artifacts"]["ptx"]
    blob_files(store)[name].unlink()
    users = {r["key"] for r in built.rows if name in r["artifacts"].values()}
    return users, "missing blob"


def _old_index_left_behind(store, built):
    # Older kbuilds kept a diskcache index; nothing reads it now, whatever it holds.
    (store / "v1" / "index").mkdir()
    (store / "v1" / "index" / "cache.db").write_bytes(b"not an sqlite database " * 200)
    return set(), None


def _entry_links_to_another(store, built):
    row, other = built.row(SAXPY), built.rows[-1]
    path = entry_files(store)[row["key"]]
    path.unlink()
    path.symlink_to(entry_files(store)[other["key"]])
    return {row["key"]}, "not a regular file"


def _another_targets_artifacts(store, built):
    # A hash-correct entry naming another kernel's (hash-correct) blobs.
    row, other = built.row(SAXPY), next(r for r in built.rows if r["target"] != SAXPY)
    path = entry_files(store)[row["key"]]
    path.write_text(json.dumps({**json.loads(path.read_text()), "artifacts": other["artifacts"]}))
    return {row["key"]}, "not its own binary"


DAMAGE = {"truncated-blob": _truncate_cubin, "manifest-not-json": _garble_manifest,
          "manifest-names-a-missing-blob": _delete_a_blob,
          "old-index-left-behind": _old_index_left_behind,
          "entry-links-to-another": _entry_links_to_another,
          "another-targets-artifacts": _another_targets_artifacts}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damage_is_reported_once_and_only_the_affected_target_rebuilds(
        built, build, run_kbuild, tmp_path, damage):
    project, store = clone(built, tmp_path)
    affected, message = DAMAGE[damage](store, built)
    if damage == "truncated-blob":
        # Reading it is refused (and, read-only, leaves the file for the build to heal).
        cat = run_kbuild("cat", built.row(SAXPY)["artifacts"]["cubin"], cwd=project, store=store)
        assert cat.returncode == 1 and "corrupt" in cat.stderr and cat.stdout_bytes == b""
        # `build` hashes the blobs of every entry it reports `cached`: a CI gate such as
        # `kbuild build --read-only` must not pass a store holding a damaged cubin.

    # `status` (which changes nothing) names the damage as the reason a target is stale.
    status = run_kbuild("status", "--json", "--arch", ARCH, cwd=project, store=store)
    for row in status.json["targets"]:
        if row["key"] in affected:
            assert row["status"] == "stale" and message in row["reasons"][0], row
        else:
            assert row["status"] == "up-to-date", row

    result = build(project, store)
    assert result.returncode == 0, result.stderr
    expected = {key: "built" if key in affected else "cached" for key in built.keys}
    assert statuses(result) == expected
    warnings = warning_lines(result)
    if message is None:
        assert warnings == [] and result.json["warnings"] == []
    else:
        assert len(warnings) == 1 and message in warnings[0], result.stderr
        assert len(result.json["warnings"]) == 1
        if affected:
            assert all(key in warnings[0] for key in affected)
    # Rebuilt bytes equal the originals (saxpy's code is reproducible), and all verify.
    assert [r["artifacts"] for r in result.json["targets"]] == [r["artifacts"] for r in built.rows]
    assert_blobs_verify(store)

    again = build(project, store)
    assert set(statuses(again).values()) == {"cached"} and warning_lines(again) == []


# -- 6. gc --------------------------------------------------------------------------------

def test_gc_evicts_a_stale_entry_and_its_blobs_but_keeps_current_keys(
        built, build, run_kbuild, tmp_path):
    project, store = clone(built, tmp_path)
    edit_saxpy(project)
    rebuilt = build(project, store)
    old = built.row(SAXPY)
    new_key = next(k for k, s in statuses(rebuilt).items() if s == "built")
    assert set(statuses(rebuilt).values()) == {"built", "cached"} and new_key != old["key"]
    old_blobs = {name: blob_files(store)[name].stat().st_size
                 for name in old["artifacts"].values()}

    gc = run_kbuild("gc", "--max-size", "1", "--json", cwd=project, store=store)
    assert gc.returncode == 0, gc.stderr
    assert gc.json["evicted_entries"] == 1 and gc.json["evicted"] == [SAXPY]
    # The old saxpy's own object goes too; the objects current targets link from stay.
    assert gc.json["evicted_objects"] == 1
    # The old saxpy's PTX, cubin and LTO-IR object, and both entries' observation records.
    assert gc.json["removed_blobs"] == 5 and gc.json["freed_bytes"] > sum(old_blobs.values())
    assert gc.json["bytes"] == sum(p.stat().st_size for p in blob_files(store).values())
    assert old["key"] not in entry_files(store)
    assert not set(old_blobs) & set(blob_files(store))
    assert set(entry_files(store)) == set(statuses(rebuilt))

    after = build(project, store)
    assert set(statuses(after).values()) == {"cached"}


def test_gc_evicts_least_recently_used_entries_first(built, run_kbuild, tmp_path):
    project, store = clone(built, tmp_path)
    # Architectures kbuild.toml does not declare: entries that are not current keys.
    extra = run_kbuild("build", SAXPY, "--arch", "sm_75,sm_86,sm_89", "--json", cwd=project,
                       store=store)
    assert extra.returncode == 0, extra.stderr
    # Last used: the greatest key longest ago, so neither key nor file order passes for LRU.
    oldest, middle, newest = sorted((r["key"] for r in extra.json["targets"]), reverse=True)
    now = time.time()
    for key, age in ((oldest, 30000), (middle, 20000), (newest, 10000)):
        os.utime(entry_files(store)[key], (now - age, now - age))
    sizes = {name: p.stat().st_size for name, p in blob_files(store).items()}
    total = sum(sizes.values())
    # Every blob an entry names: its binaries and its observation record.
    artifacts = {r["key"]: set(json.loads(entry_files(store)[r["key"]].read_text())
                               ["artifacts"].values()) for r in extra.json["targets"]}
    oldest_bytes = sum(sizes[n] for n in artifacts[oldest])

    # A bound that one eviction meets: only the least recently used entry goes.
    gc = run_kbuild("gc", "--max-size", str(total - oldest_bytes), "--json", cwd=project,
                    store=store)
    assert gc.returncode == 0, gc.stderr
    assert gc.json["evicted_entries"] == 1 and gc.json["freed_bytes"] == oldest_bytes
    assert gc.json["removed_blobs"] == len(artifacts[oldest])
    assert set(entry_files(store)) == set(built.keys) | {middle, newest}
    assert not artifacts[oldest] & set(blob_files(store))

    # One byte less: the next least recently used goes, the newest stays.
    gc = run_kbuild("gc", "--max-size", str(total - oldest_bytes - 1), "--json", cwd=project,
                    store=store)
    assert gc.json["evicted_entries"] == 1
    assert set(entry_files(store)) == set(built.keys) | {newest}


def test_store_max_size_in_kbuild_toml_applies_after_build(built, build, tmp_path):
    project, store = clone(built, tmp_path)
    with open(project / "kbuild.toml", "a") as fh:
        fh.write('\n[store]\nmax_size = "1"\n')
    edit_saxpy(project)
    result = build(project, store)
    assert result.returncode == 0, result.stderr
    assert set(entry_files(store)) == set(statuses(result))  # the old saxpy entry is gone
    assert built.row(SAXPY)["key"] not in entry_files(store)
    referenced = {n for r in result.json["targets"]
                  for n in json.loads(entry_files(store)[r["key"]].read_text())["artifacts"].values()}
    # Besides the targets' artifacts, only the objects current targets link from.
    linked = {k for r in result.json["targets"]
              for k in json.loads(entry_files(store)[r["key"]].read_text())["link"].get("objects", ())}
    objects = entry_files(store, kind="object")
    assert set(objects) == linked
    assert set(blob_files(store)) == referenced | {
        n for p in objects.values() for n in json.loads(p.read_text())["artifacts"].values()}


@pytest.mark.parametrize("command", ["gc", "build"])
def test_an_unreadable_size_exits_2_naming_it(built, run_kbuild, tmp_path, command):
    project, store = clone(built, tmp_path)
    before = store_files(store)
    done = run_kbuild(command, "--max-size", "lots", cwd=project, store=store)
    assert done.returncode == 2 and done.stdout == ""
    assert "--max-size: cannot read size 'lots'" in done.stderr and "500MB" in done.stderr
    assert store_files(store) == before


# -- 7. stats and keys --------------------------------------------------------------------

def test_stats_after_a_cold_and_a_no_op_build(built, build, run_kbuild, tmp_path):
    project, store = clone(built, tmp_path)  # the cold build is already in its log
    noop = build(project, store)
    assert set(statuses(noop).values()) == {"cached"}
    stats = run_kbuild("stats", "--json", cwd=project, store=store)
    assert stats.returncode == 0, stats.stderr
    n = len(built.rows)
    blobs = blob_files(store)
    assert stats.json["entries"] == n
    assert stats.json["blobs"] == len(blobs) > 0
    assert stats.json["bytes"] == sum(p.stat().st_size for p in blobs.values())
    assert (stats.json["recent_builds"], stats.json["builds"], stats.json["hits"]) == (2, n, n)
    assert stats.json["misses"] == n and stats.json["failures"] == 0


def test_keys_match_the_build_and_their_digest_follows_the_sources(
        built, run_kbuild, tmp_path):
    project, _ = clone(built, tmp_path)
    first = run_kbuild("keys", "--json", "--arch", ARCH, cwd=project)
    second = run_kbuild("keys", "--json", "--arch", ARCH, cwd=project)
    assert first.returncode == 0, first.stderr
    assert [(r["target"], r["signature"], r["arch"], r["key"]) for r in first.json["targets"]] \
        == [(r["target"], r["signature"], r["arch"], r["key"]) for r in built.rows]
    assert first.json == second.json and re.fullmatch(r"[0-9a-f]{32}", first.json["digest"])

    edit_saxpy(project)
    edited = run_kbuild("keys", "--json", "--arch", ARCH, cwd=project)
    assert edited.json["digest"] != first.json["digest"]
    changed = [a["target"] for a, b in zip(first.json["targets"], edited.json["targets"])
               if a["key"] != b["key"]]
    assert changed == [SAXPY]


# -- 8. trust -----------------------------------------------------------------------------

def test_a_store_path_that_is_a_file_fails_before_any_compile(built, run_kbuild, tmp_path):
    # We may run as root, which chmod does not stop; a file where the store should be does.
    project = copy_examples(built.project, tmp_path / "project")
    store = tmp_path / "store-is-a-file"
    store.write_text("not a directory")
    compiles = tmp_path / "compiles"
    done = run_kbuild("build", "--json", "--arch", ARCH, cwd=project, store=store,
                      **counting(compiles, NVVM_COMPILE))
    assert done.returncode == 2
    assert set(done.json) == {"error", "kind", "exit_code", "warnings"}  # the error, no rows
    assert f"store {store} is not writable" in done.json["error"]
    assert warning_lines(done) == []  # one clear error, not a warning per target
    assert store.read_text() == "not a directory"
    assert counts(compiles) == {}  # before any compile


def test_a_read_only_build_of_an_empty_store_fails_every_row_and_writes_nothing(
        built, run_kbuild, tmp_path):
    project = copy_examples(built.project, tmp_path / "project")
    store = tmp_path / "store"
    done = run_kbuild("build", "--json", "--arch", ARCH, "--read-only", cwd=project, store=store)
    assert done.returncode == 1
    rows = done.json["targets"]
    assert len(rows) == len(built.rows)
    assert all(r["status"] == "failed" and "read-only" in r["error"] for r in rows)
    assert not store.exists()


def test_nothing_in_kbuild_imports_a_deserializer_of_code():
    banned = {"pickle", "marshal", "shelve", "cloudpickle", "dill"}
    package = Path(__file__).resolve().parents[1] / "kbuild"
    found = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
                names = [a.value for a in node.args[:1] if isinstance(a, ast.Constant)]
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in banned]
    assert found == []
