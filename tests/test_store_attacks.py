"""Issue 15: a store that cannot be made to serve a wrong binary, delete a file or hang.

One test per case the issue lists, tried as an attacker or a clumsy user would: a
hand-edited store, a crafted archive, crashes, hostile files. Real compiler, real store;
`kbuild` runs in the test process (support.run_in_process), except where a hang is what
could go wrong (hostile files: a subprocess with a timeout, so a hang fails instead of
blocking) and for the killed, concurrent and resource-limited builds.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import resource
import signal
import sqlite3
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from conftest import (BuiltExamples, blob_bytes, blob_files, built_examples, copy_examples,
                      entry_files)
from store_support import make_cubin, make_ptx
from support import kbuild_argv, kbuild_env
from support import run as run_process
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

from kbuild.artifacts import BinaryError, Facts, cubin_facts, ptx_facts
from kbuild.store import archive
from kbuild.store.archive import ArchiveError, export_archive, import_archive
from kbuild.store.local import Store
from kbuild.store.manifest import EntryProblem, load_json

ARCH = "sm_90"
SAXPY = "examples.saxpy:saxpy"
SQUARE = "examples.elementwise:square_shift"


@pytest.fixture(scope="module")
def built(tmp_path_factory, examples_template) -> BuiltExamples:
    return built_examples(tmp_path_factory.mktemp("attacks"), examples_template, ARCH)


@pytest.fixture
def clone(built, tmp_path):
    import shutil

    shutil.copytree(built.store, tmp_path / "store", symlinks=True)
    return tmp_path / "store"


@pytest.fixture
def kb(run_kbuild, built):
    """`kb(store, *args)`: kbuild in the built project (in this process)."""
    def run(store, *args, env=None):
        return run_kbuild(*args, cwd=built.project, store=store, env=env)
    return run


@pytest.fixture
def kb_bounded(kbuild_process, built):
    """`kb`, in a subprocess bounded at 180 s: a hang fails (a loaded machine does not)."""
    def run(store, *args, env=None):
        return kbuild_process(*args, cwd=built.project, store=store, env=env, timeout=180)
    return run


def build(kb, store, *args, env=None):
    return kb(store, "build", "--json", "--arch", ARCH, *args, env=env)


def assert_clean_failure_or_success(result):
    assert result.returncode in (0, 1, 2), result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def by_target(result) -> dict:
    return {(r["target"], r["signature"]): r for r in result.json["targets"]}


def set_entry(store: Path, key: str, **fields) -> None:
    path = entry_files(store, kind=None)[key]
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


# -- 1. every artifact bound to its target ---------------------------------------------------

def _swap_manifests(store, built):
    """Each of two entries' files holds the other's manifest, with its own key."""
    a, b = built.row(SAXPY), built.row(SQUARE)
    files = entry_files(store)
    ma, mb = (json.loads(files[r["key"]].read_text()) for r in (a, b))
    files[a["key"]].write_text(json.dumps({**mb, "key": a["key"]}))
    files[b["key"]].write_text(json.dumps({**ma, "key": b["key"]}))
    return {a["key"], b["key"]}


def _other_kernels_artifacts_and_entry(store, built):
    a, b = built.row(SAXPY), built.row(SQUARE)
    mb = json.loads(entry_files(store)[b["key"]].read_text())
    set_entry(store, a["key"], artifacts=mb["artifacts"], entry=mb["entry"], sizes=mb["sizes"])
    return {a["key"]}


def _other_signatures_artifacts(store, built):
    a, b = built.row(SQUARE, 0), built.row(SQUARE, 1)
    mb = json.loads(entry_files(store)[b["key"]].read_text())
    set_entry(store, a["key"], artifacts=mb["artifacts"], sizes=mb["sizes"])
    return {a["key"]}


def _ptx_only(store, built):
    a = built.row(SAXPY)
    m = json.loads(entry_files(store)[a["key"]].read_text())
    set_entry(store, a["key"], artifacts={"ptx": m["artifacts"]["ptx"]})
    return {a["key"]}


def _object_without_cooperative(store, built):
    objects = {k: json.loads(p.read_text()) for k, p in entry_files(store, "object").items()}
    key = next(k for k, m in objects.items() if "cooperative" in m)
    path = entry_files(store, "object")[key]
    path.write_text(json.dumps({k: v for k, v in objects[key].items() if k != "cooperative"}))
    return set()  # objects only save work: every target is still whole


BINDING = {"swapped-manifests": _swap_manifests,
           "another-kernels-artifacts-and-entry": _other_kernels_artifacts_and_entry,
           "another-signatures-artifacts": _other_signatures_artifacts,
           "ptx-only-artifacts": _ptx_only,
           "object-without-cooperative": _object_without_cooperative}


@pytest.mark.parametrize("case", sorted(BINDING))
def test_an_entry_not_bound_to_its_target_is_rebuilt_never_served(built, clone, kb, case):
    affected = BINDING[case](clone, built)
    status = kb(clone, "status", "--json", "--arch", ARCH)
    assert_clean_failure_or_success(status)
    for row in status.json["targets"]:
        assert (row["status"] == "up-to-date") == (row["key"] not in affected), row
    result = build(kb, clone)
    assert result.returncode == 0, result.stderr
    for row, clean in zip(result.json["targets"], built.rows):
        assert row["status"] == ("built" if row["key"] in affected else "cached"), row
        assert row["artifacts"] == clean["artifacts"]  # never another target's binary
    warnings = [w for w in result.stderr.splitlines() if w.startswith("kbuild: warning:")]
    assert len(warnings) == len(affected) or not affected, result.stderr  # one per entry
    assert build(kb, clone).json["summary"]["cached"] == len(built.rows)


def test_the_binary_readers_agree_with_what_numba_built(built):
    for row in built.rows:
        ptx = blob_bytes(blob_files(built.store)[row["artifacts"]["ptx"]])
        cubin = blob_bytes(blob_files(built.store)[row["artifacts"]["cubin"]])
        entry = json.loads(entry_files(built.store)[row["key"]].read_text())["entry"]
        assert ptx_facts(ptx).arch == ARCH and entry in ptx_facts(ptx).kernels
        assert cubin_facts(cubin).arch == ARCH and entry in cubin_facts(cubin).kernels


@pytest.mark.parametrize("data", [b"", b"\x7fELF", make_cubin(80)[:100], make_ptx() * 2,
                                  make_ptx("sm_80", "k") + make_ptx("sm_90", "d"),
                                  make_ptx().replace(b".version 8.0\n", b""),
                                  b"\x7fELF\x02\x01" + bytes(200)])
def test_malformed_binaries_are_refused_not_guessed(data):
    with pytest.raises(BinaryError):
        cubin_facts(data) if data.startswith(b"\x7fELF") or not data else ptx_facts(data)


def test_a_debug_compiles_ptx_is_one_module_per_function():
    """numba keeps a `debug=True` compile's modules (one per function) joined: one arch,
    each kernel once, and the loader links the modules one by one."""
    from kbuild.artifacts import ptx_modules

    joined = make_ptx("sm_80", "k") + make_ptx("sm_80", "other")
    assert ptx_facts(joined) == Facts("sm_80", frozenset({"k", "other"}))
    modules = ptx_modules(joined)
    assert b"".join(modules) == joined
    assert [ptx_facts(m).kernels for m in modules] == [{"k"}, {"other"}]
    assert ptx_modules(make_ptx()) == [make_ptx()]


def test_an_archive_naming_another_kernels_blobs_is_refused(built, tmp_path):
    a, b = built.row(SAXPY), built.row(SQUARE)
    source = Store(built.store, read_only=True)
    manifest = {**source.lookup(a["key"]), "artifacts": b["artifacts"]}
    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w") as tar:
        for name in b["artifacts"].values():
            _add(tar, f"v1/blobs/{name}", source.read_blob(name))
        _add(tar, f"v1/entries/{a['key']}.json", json.dumps(manifest).encode())
    with pytest.raises(ArchiveError, match="not its own binary"):
        import_archive(Store(tmp_path / "store"), path, key=None)
    assert not (tmp_path / "store").exists()


# -- 2. signing ---------------------------------------------------------------------------

def test_with_a_signing_key_only_signed_archives_import(built, tmp_path):
    keys = [r["key"] for r in built.rows[:3]]
    signed, unsigned = tmp_path / "signed.tar", tmp_path / "unsigned.tar"
    export_archive(Store(built.store), keys, signed, key=b"team secret")
    export_archive(Store(built.store), keys, unsigned, key=None)
    with pytest.raises(ArchiveError, match="not signed"):
        import_archive(Store(tmp_path / "a"), unsigned, key=b"team secret")
    with pytest.raises(ArchiveError, match="signature does not match"):
        import_archive(Store(tmp_path / "b"), signed, key=b"another secret")
    assert import_archive(Store(tmp_path / "c"), signed, key=b"team secret")["new_entries"] == 3
    # A signed manifest edited after signing (another blob named) is refused.
    forged = tmp_path / "forged.tar"
    with tarfile.open(signed) as src, tarfile.open(forged, "w") as dst:
        for member in src:
            data = src.extractfile(member).read()
            if member.name.endswith(".json"):
                manifest = json.loads(data)
                data = json.dumps({**manifest, "built_at": "yesterday"}).encode()
            _add(dst, member.name, data)
    with pytest.raises(ArchiveError, match="signature does not match"):
        import_archive(Store(tmp_path / "d"), forged, key=b"team secret")


def test_the_cli_signs_exports_with_the_key_kbuild_toml_names(built, kb, tmp_path):
    toml = built.project / "kbuild.toml"
    original = toml.read_text()
    toml.write_text(original + '\n[store]\nsigning_key_env = "TEAM_KEY"\n')
    try:
        missing = kb(built.store, "export", str(tmp_path / "x.tar"), "--arch", ARCH)
        assert missing.returncode == 2 and "TEAM_KEY" in missing.stderr
        assert "Traceback" not in missing.stderr
        done = kb(built.store, "export", str(tmp_path / "x.tar"), "--arch", ARCH,
                  env={"TEAM_KEY": "k1"})
        assert done.returncode == 0, done.stderr
    finally:
        toml.write_text(original)
    refused = kb(tmp_path / "other", "import", str(tmp_path / "x.tar"),
                 env={"KBUILD_SIGNING_KEY": "k2"})
    assert refused.returncode == 2 and "signature does not match" in refused.stderr
    taken = kb(tmp_path / "other", "import", str(tmp_path / "x.tar"),
               env={"KBUILD_SIGNING_KEY": "k1"})
    assert taken.returncode == 0, taken.stderr


# -- 3. a plain tree: no link followed, no FIFO opened, no index to trust ---------------------

def test_a_tampered_old_index_cannot_name_a_file_to_delete(built, clone, kb, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    index = clone / "v1" / "index"
    index.mkdir()
    with sqlite3.connect(index / "cache.db") as db:  # diskcache's schema, a hostile row
        db.execute("CREATE TABLE Cache (rowid INTEGER PRIMARY KEY, key BLOB, raw INTEGER, "
                   "store_time REAL, expire_time REAL, access_time REAL, access_count INTEGER, "
                   "tag BLOB, size INTEGER, mode INTEGER, filename TEXT, value BLOB)")
        db.execute("INSERT INTO Cache VALUES (1, ?, 1, 0, 0, 0, 0, NULL, 0, 2, ?, NULL)",
                   (built.row(SAXPY)["key"], str(victim)))
    set_entry(clone, built.row(SAXPY)["key"], schema=99)  # a lookup that once healed the index
    for command in (["build", "--arch", ARCH], ["gc"], ["clean"]):
        assert_clean_failure_or_success(kb(clone, *command))
    assert victim.read_text() == "keep me"


@pytest.mark.parametrize("link", ["v1/facts/x", "v1/tmp", "v1/blobs", "v1/entries/ab"])
def test_gc_and_build_never_follow_a_link_inside_the_store(built, clone, kb, tmp_path, link):
    outside = tmp_path / "outside"
    (outside / "ab" / "cd").mkdir(parents=True)
    bait = [outside / "old.json", outside / ("ab" * 16), outside / "ab" / "cd" / ("abcd" * 8)]
    for path in bait:
        path.write_text("not kbuild's")
        os.utime(path, (1, 1))  # ancient: stale by every rule gc has
    target = clone / link
    if target.exists():
        import shutil

        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(outside)
    for command in (["build", "--arch", ARCH], ["gc", "--max-size", "0"]):
        assert_clean_failure_or_success(kb(clone, *command))
    assert all(path.read_text() == "not kbuild's" for path in bait)


def test_a_blob_link_with_a_mismatched_name_does_not_crash_gc(built, clone, kb, tmp_path):
    name = built.row(SAXPY)["artifacts"]["cubin"]
    folder = clone / "v1" / "blobs" / "ff" / "ee"
    folder.mkdir(parents=True)
    (folder / name).symlink_to(blob_files(clone)[name])
    result = kb(clone, "gc", "--json")
    assert result.returncode == 0, result.stderr
    assert blob_files(clone)[name].exists()


@pytest.mark.parametrize("what", ["entry-fifo", "blob-fifo", "blob-link-to-dev-zero",
                                  "entry-link-to-dev-zero", "blob-larger-than-recorded",
                                  "entry-nested-deep"])
def test_hostile_files_in_the_store_cost_a_rebuild_not_a_hang(built, clone, kb_bounded, what):
    row = built.row(SAXPY)
    entry = entry_files(clone)[row["key"]]
    blob = blob_files(clone)[row["artifacts"]["cubin"]]
    if what == "entry-fifo":
        entry.unlink()
        os.mkfifo(entry)
    elif what == "blob-fifo":
        blob.unlink()
        os.mkfifo(blob)
    elif what == "blob-link-to-dev-zero":
        blob.unlink()
        blob.symlink_to("/dev/zero")
    elif what == "entry-link-to-dev-zero":
        entry.unlink()
        entry.symlink_to("/dev/zero")
    elif what == "blob-larger-than-recorded":
        with open(blob, "ab") as fh:
            fh.write(b"\0" * 4096)
    else:
        entry.write_text("[" * 100_000 + "]" * 100_000)
    result = build(kb_bounded, clone)  # bounded: its timeout turns a hang into a failure
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert by_target(result)[(SAXPY, row["signature"])]["status"] == "built"
    # The cost: that one target compiled again, every other one served from the store.
    assert [r["target"] for r in result.json["targets"] if r["status"] != "cached"] == [SAXPY]


def test_json_of_any_depth_or_size_is_a_problem_never_a_recursion_error():
    for text in ["[" * 100_000, "{\"a\":" * 50_000 + "1" + "}" * 50_000, "x" * 10]:
        with pytest.raises(EntryProblem):
            load_json(text, limit=1 << 20)
    with pytest.raises(EntryProblem, match="larger"):
        load_json("[" + "1," * 1000 + "1]", limit=100)
    assert load_json('{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}') == {"a": "[" * 40}


# -- 5. no orphan holds a lock ---------------------------------------------------------------

def test_a_sigkilled_parallel_build_leaves_no_worker_and_the_next_build_finishes(
        built, run_kbuild, tmp_path):
    project = copy_examples(built.project, tmp_path / "project")
    store = tmp_path / "store"
    proc = subprocess.Popen(kbuild_argv("build", "-j2", "--arch", ARCH), cwd=project,
                            env=kbuild_env(tmp_path / "home", store=store),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        children = _children(proc.pid)
        if len(children) >= 2:  # the workers are compiling
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert children, "the build finished before it forked its workers"
    gone = time.monotonic() + 10
    while any(_alive(pid) for pid in children) and time.monotonic() < gone:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in children), "a worker outlived the killed build"
    result = run_kbuild("build", "--json", "--arch", ARCH, cwd=project, store=store, timeout=120)
    assert result.returncode == 0, result.stderr


def _has_open(pid: int, path: Path) -> bool:
    """Whether process `pid` has `path` open (its file descriptors, from /proc)."""
    try:
        links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    except OSError:  # it exited, or an fd closed while we looked
        return False
    return str(path) in links or str(path.resolve()) in links


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_gc_waits_for_a_running_build_and_deletes_nothing_it_made(built, clone, kb, tmp_path):
    store = Store(clone)
    before = set(blob_files(clone))
    # A build is running: it holds the store lock shared (and has committed an entry that
    # no current key names, as an edited kernel's build would).
    with store.shared():
        gc = subprocess.Popen(kbuild_argv("gc", "--max-size", "0", "--store", clone),
                              cwd=built.project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=kbuild_env(tmp_path / "home"))
        lock = clone / "v1" / "locks" / "store.lock"
        deadline = time.monotonic() + 120  # bounds a hang; the wait is for gc to get there
        while not _has_open(gc.pid, lock):
            assert gc.poll() is None, gc.communicate()  # it must wait, not finish
            assert time.monotonic() < deadline, "gc never opened the store lock"
            time.sleep(0.02)
        assert gc.poll() is None, gc.communicate()  # at the lock: still waiting for the build
        assert set(blob_files(clone)) == before
    out, err = gc.communicate(timeout=60)
    assert gc.returncode == 0, err


# -- 6. bounded input --------------------------------------------------------------------------

def _add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_a_gzip_bomb_is_refused_at_its_header_without_inflating_it(tmp_path, monkeypatch):
    path = tmp_path / "bomb.tar.gz"
    size = 2 << 30  # declared (and real) 2 GiB of zeros, 2 MB compressed
    with gzip.open(path, "wb", compresslevel=9) as gz:
        info = tarfile.TarInfo("v1/blobs/" + "0" * 32)
        info.size = size
        gz.write(info.tobuf())
        chunk = bytes(1 << 20)
        for _ in range(64):  # enough to look real; the header is what is checked
            gz.write(chunk)
    inflated = _count_inflated(monkeypatch)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ArchiveError, match="declares 2147483648 bytes"):
        import_archive(Store(tmp_path / "store"), path, key=None)
    assert 0 < sum(inflated) <= 64 << 10, sum(inflated)  # a header's worth, not 64 MiB
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB


def _count_inflated(monkeypatch) -> list[int]:
    """The sizes of what gzip decompresses from now on (every read, peek and seek of a
    GzipFile goes through its `_GzipReader.read`)."""
    sizes, real = [], gzip._GzipReader.read

    def read(self, size=-1):
        data = real(self, size)
        sizes.append(len(data))
        return data

    monkeypatch.setattr(gzip._GzipReader, "read", read)
    return sizes


def test_a_member_of_exactly_the_limit_is_taken_and_one_more_byte_is_not(tmp_path, monkeypatch):
    monkeypatch.setattr(archive, "MAX_MEMBER", 64)
    for size, ok in [(64, True), (65, False)]:
        data = os.urandom(size)
        from kbuild.keying.encode import digest

        path = tmp_path / f"{size}.tar"
        with tarfile.open(path, "w") as tar:
            _add(tar, f"v1/blobs/{digest(data)}", data)
        if ok:
            assert import_archive(Store(tmp_path / f"s{size}"), path, key=None)["blobs"] == 1
        else:
            with pytest.raises(ArchiveError, match="more than the 64 allowed"):
                import_archive(Store(tmp_path / f"s{size}"), path, key=None)


@pytest.mark.parametrize("name", ["v1/blobs/" + "a" * 32 + "\n", "v1/entries/" + "b" * 32
                                  + ".json\n", "v1/blobs/\n" + "a" * 32])
def test_a_member_name_with_a_newline_is_refused(tmp_path, name):
    path = tmp_path / "nl.tar"
    with tarfile.open(path, "w") as tar:
        _add(tar, name, b"x")
    with pytest.raises(ArchiveError, match="unexpected member"):
        import_archive(Store(tmp_path / "store"), path, key=None)


def test_a_deeply_nested_archive_manifest_is_an_error_line(tmp_path, kb):
    path = tmp_path / "deep.tar"
    with tarfile.open(path, "w") as tar:
        _add(tar, "v1/entries/" + "c" * 32 + ".json", b"[" * 100_000)
    result = kb(tmp_path / "store", "import", str(path))
    assert result.returncode == 2 and "nested deeper" in result.stderr
    assert "Traceback" not in result.stderr


# -- 7. clear errors -----------------------------------------------------------------------------

def test_a_full_disk_is_one_error_line(built, kb, tmp_path, run_kbuild):
    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))  # every write past 2 KiB fails

    proc = run_process("build", "--arch", ARCH, "--store", tmp_path / "store", "-j1",
                       cwd=built.project, home=tmp_path / "home", preexec_fn=small_files,
                       timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("kbuild: error:")]
    assert len(errors) == 1 and "cannot write to store" in errors[0], proc.stderr


def _can_mount() -> bool:
    import shutil

    return bool(shutil.which("unshare")) and subprocess.run(
        ["unshare", "-rm", "true"], capture_output=True).returncode == 0


def _in_mount(built, tmp_path, setup: str, *args):
    """`kbuild *args` in a private mount namespace after `setup` (sh) made the store."""
    script = f'set -e; {setup}; exec "$@"'
    return subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", *kbuild_argv(*args)],
                          cwd=built.project, env=kbuild_env(tmp_path / "home"),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not _can_mount(), reason="needs `unshare -rm` to mount a file system")
@pytest.mark.parametrize("damaged", [False, True])
def test_a_read_only_store_serves_its_entries_and_fails_clearly_to_write(
        built, clone, tmp_path, damaged):
    if damaged:
        set_entry(clone, built.row(SAXPY)["key"], schema=99)
    ro = tmp_path / "ro"
    ro.mkdir()
    setup = f"mount -t tmpfs tmpfs {ro}; cp -a {clone}/. {ro}; mount -o remount,ro {ro}"
    result = _in_mount(built, tmp_path, setup, "build", "--arch", ARCH, "--store", str(ro))
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    if not damaged:
        assert result.returncode == 0 and lines == [], result.stderr  # no warning at all
        return
    assert result.returncode == 2, result.stderr
    assert [line for line in lines if line.startswith("kbuild: error:")] == [
        f"kbuild: error: store {ro} is not writable (Read-only file system); "
        "pass --store DIR or set KBUILD_STORE to a writable directory"]
    warnings = [line for line in lines if line.startswith("kbuild: warning:")]
    assert len(warnings) == 2, result.stderr  # the damage, and that it cannot be removed
    assert "cannot be changed" in warnings[1]


@pytest.mark.skipif(not _can_mount(), reason="needs `unshare -rm` to mount a file system")
def test_a_store_on_a_full_file_system_is_one_error_line(built, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    result = _in_mount(built, tmp_path, f"mount -t tmpfs -o size=48k tmpfs {full}",
                       "build", "--arch", ARCH, "--store", str(full), "-j1")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("kbuild: error:")]
    assert len(errors) == 1 and "No space left on device" in errors[0], result.stderr


@pytest.mark.parametrize("line", ['{"built": "many", "cached": null}', "[1, 2]", "[" * 5000,
                                  '{"built": -3, "cached": true}', "\x00\xff"])
def test_malformed_stats_lines_are_skipped(built, clone, kb, line):
    with open(clone / "v1" / "stats.jsonl", "a", encoding="utf-8", errors="surrogateescape") as fh:
        fh.write(line + "\n")
    result = kb(clone, "stats", "--json")
    assert result.returncode == 0, result.stderr
    assert result.json["entries"] == len(built.rows)
