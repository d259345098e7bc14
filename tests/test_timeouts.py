"""A compile that takes too long, failures remembered by key, and the progress line (issue 16).

A kernel slow to compile on purpose: typing it runs an `@overload` that sleeps (30 s unless
killed), writes its process id down first, so a test can see the process is gone, and
writes it again beside that (`.done`) if it ever wakes, so a test can see it was killed
before. A kernel that fails to type fails in well under a second, so its recorded failure is
what saves time, not what costs it. Nothing here asserts how long anything took: only that
the limit was reached, and what ran (a process id per compile started).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

SLOW = '''import os
import time

from numba import cuda
from numba.cuda.extending import overload


def stall(x):
    pass


@overload(stall, target="cuda")
def _stall(x):
    pid_file = os.environ["TMO_PID_FILE"]
    with open(pid_file, "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    time.sleep(float(os.environ.get("TMO_SLEEP", "30")))
    with open(pid_file + ".done", "a") as fh:  # woke up: the limit did not stop it
        fh.write(f"{os.getpid()}\\n")

    def impl(x):
        return x
    return impl


@cuda.jit
def slow(x):
    x[0] = stall(x[0])
'''

QUICK = '''from numba import cuda


@cuda.jit
def quick(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] + 1
'''

# A type error in the kernel itself (fixed by editing it), and one that an environment
# variable read at typing time decides (an observed dependency, not in the static key).
BAD = '''from numba import cuda


@cuda.jit
def bad(x):
    x[0] = "not a number"
'''
FIXED = BAD.replace('"not a number"', "1.0")

PICKY = '''import os

from numba import cuda
from numba.cuda.extending import overload


def pick(x):
    pass


@overload(pick, target="cuda")
def _pick(x):
    if os.environ.get("TMO_PICK") == "bad":
        def impl(x):
            return x + "s"
    else:
        def impl(x):
            return x + 1
    return impl


@cuda.jit
def picky(x):
    x[0] = pick(x[0])
'''

SIG = 'signatures = ["void(float32[::1])"]'


def make_project(root: Path, package: str, modules: dict, extra: str = "") -> Path:
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    for name, text in modules.items():
        (root / package / f"{name}.py").write_text(text)
    kernels = "".join(f'\n[kernels."{package}.{name}:{name}"]\n{SIG}\n' for name in modules)
    (root / "kbuild.toml").write_text(f'[project]\nname = "{package}"\narch = ["sm_80"]\n'
                                      f"{extra}{kernels}")
    return root


def _children() -> list[int]:
    """Processes whose parent is this one, read from /proc, but those that live as long as
    the worker: the tests' zygote, and multiprocessing's resource tracker (started in the
    worker by an earlier test's dask cluster)."""
    import zygote

    found, ours = [], zygote.own_processes()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and int(entry.name) not in ours \
                    and b"multiprocessing.resource_tracker" not in _cmdline(entry):
                found.append(int(entry.name))
    return found


def _cmdline(entry: Path) -> bytes:
    try:
        return (entry / "cmdline").read_bytes()
    except OSError:
        return b""


def _failure_files(store: Path) -> list[Path]:
    return sorted((store / "v1" / "failures").glob("??/*.json"))


class _Recorder:
    """A progress callback with the optional `started` hook: what was said, in order."""

    def __init__(self):
        self.events = []

    def __call__(self, row, done, total):
        self.events.append(("row", row.target, row.status))

    def started(self, target):
        self.events.append(("started", target.name, None))


# -- the time limit ------------------------------------------------------------------------------

@pytest.mark.parametrize("jobs", [1, 2])
def test_a_compile_past_the_limit_is_killed_and_fails_alone(tmp_path, monkeypatch, jobs):
    from kbuild.project import Project

    package = f"tmo_limit{jobs}"
    root = make_project(tmp_path / "project", package, {"slow": SLOW, "quick": QUICK})
    monkeypatch.setenv("TMO_PID_FILE", str(tmp_path / "pids"))
    monkeypatch.syspath_prepend(str(root))
    project = Project.load(root / "kbuild.toml", store=tmp_path / "store", remote=False)
    progress = _Recorder()
    rows = {r.target: r for r in project.build(jobs=jobs, keep_going=True, progress=progress,
                                               target_timeout=2)}
    slow, quick = rows[f"{package}.slow:slow"], rows[f"{package}.quick:quick"]
    assert slow.status == "failed" and not slow.recorded
    assert slow.error.startswith("compile took longer than 2s (--target-timeout / [build] "
                                 "target_timeout); ")
    assert slow.seconds >= 2  # it ran to the limit
    # ... and was killed there: its 30 s of typing never finished.
    assert not (tmp_path / "pids.done").exists()
    assert quick.status == "built", (quick.error, quick.seconds)
    # The compiling process is gone (reaped, not a zombie) and nothing else was left behind.
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert pids and not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert _children() == []
    # Every compile was announced before its row came.
    for name in rows:
        events = [e for e in progress.events if e[1] == name]
        assert [e[0] for e in events] == ["started", "row"], events


def test_the_limit_from_kbuild_toml_is_recorded_and_a_longer_one_tries_again(tmp_path, store,
                                                                             run_kbuild):
    root = make_project(tmp_path / "project", "tmo_toml", {"slow": SLOW, "quick": QUICK},
                        extra="\n[build]\ntarget_timeout = 2\n")
    env = {"TMO_PID_FILE": tmp_path / "pids"}
    # On a terminal the progress line names what is compiling.
    code, out, bar = _stderr_on_a_terminal(["build", "-k"], root, store, env)
    assert code == 1, bar
    assert "failed   tmo_toml.slow:slow void(float32[::1]) sm_80" in out
    assert "compile took longer than 2s (--target-timeout / [build] target_timeout)" in out
    assert "compiling slow sm_80" in bar

    started = (tmp_path / "pids").read_text().split()
    again = run_kbuild("build", "-k", "--json", cwd=root, store=store, env=env)
    row = {r["target"]: r for r in again.json["targets"]}["tmo_toml.slow:slow"]
    assert (row["status"], row["recorded"], row["seconds"]) == ("failed", True, 0)
    assert row["error"].endswith("(failed earlier with this key; --retry-failed to compile "
                                 "again)")
    # Reported at once: no compile of it started (the overload writes a pid when one does).
    assert (tmp_path / "pids").read_text().split() == started and len(started) == 1

    longer = run_kbuild("build", "-k", "--json", "--target-timeout", "3", cwd=root,
                        store=store, env=env)
    row = {r["target"]: r for r in longer.json["targets"]}["tmo_toml.slow:slow"]
    assert not row["recorded"] and row["seconds"] >= 3
    assert row["error"].startswith("compile took longer than 3s")


def _stderr_on_a_terminal(args, cwd, store, env):
    """Run kbuild with stderr on a pseudo-terminal; (exit code, stdout, what the terminal got)."""
    import pty
    import subprocess

    from support import kbuild_argv, kbuild_env

    leader, follower = pty.openpty()
    full_env = kbuild_env(Path(cwd).parent / "home", store=store, env={"TERM": "xterm", **env})
    proc = subprocess.Popen(kbuild_argv(*args), cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                            stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed: the process is done
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    out = proc.stdout.read().decode()
    return proc.wait(timeout=120), out, seen.decode("utf-8", "replace")


# -- failures remembered by key ------------------------------------------------------------------

def test_a_failure_is_reported_at_once_until_its_key_or_what_it_read_changes(tmp_path, store,
                                                                             run_kbuild):
    root = make_project(tmp_path / "project", "tmo_fail",
                        {"bad": BAD, "picky": PICKY, "quick": QUICK})
    bad, picky = "tmo_fail.bad:bad", "tmo_fail.picky:picky"

    def build(*extra, pick="bad"):
        result = run_kbuild("build", "-k", "--json", *extra, cwd=root, store=store,
                            env={"TMO_PICK": pick})
        return result, {r["target"]: r for r in result.json["targets"]}

    first, compiled = build()
    assert first.returncode == 1
    assert [(compiled[t]["status"], compiled[t]["recorded"]) for t in (bad, picky)] == \
        [("failed", False)] * 2
    assert "TypingError" in compiled[picky]["error"] and len(_failure_files(store)) == 2

    second, rows = build()
    for target in (bad, picky):
        assert (rows[target]["status"], rows[target]["recorded"], rows[target]["seconds"]) == \
            ("failed", True, 0) and compiled[target]["seconds"] > 0
        assert rows[target]["error"] == compiled[target]["error"] + \
            " (failed earlier with this key; --retry-failed to compile again)"

    # status says what a build would: failed, from the record, without compiling.
    status = run_kbuild("status", "--json", cwd=root, store=store, env={"TMO_PICK": "bad"})
    assert status.returncode == 1
    by_target = {r["target"]: r for r in status.json["targets"]}
    assert (by_target[bad]["status"], by_target[bad]["recorded"]) == ("failed", True)
    assert by_target[bad]["error"] == rows[bad]["error"]
    assert status.json["summary"]["failed"] == 2
    human = run_kbuild("status", cwd=root, store=store, env={"TMO_PICK": "bad"})
    line = next(x for x in human.stdout.splitlines() if x.startswith("failed") and bad in x)
    assert line.endswith(f"({rows[bad]['error'].splitlines()[0]})")
    assert all(x.startswith(("up-to-date", "stale", "missing", "failed"))
               for x in human.stdout.splitlines())  # one line per target

    retried, rows = build("--retry-failed")
    assert [(rows[t]["status"], rows[t]["recorded"]) for t in (bad, picky)] == \
        [("failed", False)] * 2

    # A damaged record is a miss with a warning: the target compiles (and fails) again.
    record = next(p for p in _failure_files(store) if picky in p.read_text())
    record.write_bytes(b"\x00 not json")
    damaged, rows = build()
    assert (rows[picky]["recorded"], rows[bad]["recorded"]) == (False, True)
    assert any("failure record" in w and "corrupt" in w for w in damaged.json["warnings"])

    # What the failed compile read changed (an environment variable its overload reads):
    # it compiles, builds, and its record goes. Fixing the other kernel builds it too.
    (root / "tmo_fail" / "bad.py").write_text(FIXED)
    fixed, rows = build(pick="good")
    assert fixed.returncode == 0, fixed.stdout
    assert [rows[t]["status"] for t in (bad, picky)] == ["built", "built"]
    assert not any(picky in p.read_text() for p in _failure_files(store))

    # `clean` removes the record left for the old version of `bad`.
    assert len(_failure_files(store)) == 1
    cleaned = run_kbuild("clean", cwd=root, store=store)
    assert ", 1 failure record from " in cleaned.stdout and _failure_files(store) == []


KEY = "0123456789abcdef0123456789abcdef"
EXPECT = {"target": "p.m:k", "signature": "void(float32[::1])", "arch": "sm_80"}
GOOD_RECORD = {"schema": 2, "key": KEY, **EXPECT, "error": "TypingError: no", "limit": None,
               "seconds": 0.5, "project": "p", "observed": [["env", "X", "missing"]]}


@pytest.mark.parametrize("content", [
    b"\x00\xff not json",
    b"[" * 100000,
    json.dumps({**GOOD_RECORD, "schema": 99}).encode(),
    json.dumps({**GOOD_RECORD, "key": "f" * 32}).encode(),
    json.dumps({**GOOD_RECORD, "error": 5}).encode(),
    json.dumps({**GOOD_RECORD, "limit": -1}).encode(),
    json.dumps({**GOOD_RECORD, "observed": [["env", "X"]]}).encode(),
    json.dumps({**GOOD_RECORD, "observed": "everything"}).encode(),
    b" " * (5 << 20),
], ids=["binary", "deep", "schema", "other-key", "error-type", "negative-limit",
        "short-row", "observed-type", "huge"])
def test_a_damaged_failure_record_is_a_miss_with_a_warning(tmp_path, content):
    from kbuild.store import failures
    from kbuild.store.local import Store

    store = Store(tmp_path / "store")
    store.ensure_writable()
    failures.remember(store, KEY, failures.Failure("p.m:k", "void(float32[::1])", "sm_80",
                                                   "TypingError: no", (("env", "X", "missing"),)))
    assert failures.recorded(store, KEY, EXPECT).error == "TypingError: no"
    path = tmp_path / "store" / failures.failure_relpath(KEY)
    path.write_bytes(content)
    assert failures.recorded(store, KEY, EXPECT) is None
    assert any(f"failure record {KEY} is corrupt" in w for w in store.warnings)
    assert not path.exists()  # removed: the next failure writes a fresh one


def test_a_record_an_earlier_kbuild_wrote_is_dropped_quietly(tmp_path):
    """Schema 1 records lack what typing asked of the project's types: the target
    compiles again, with no warning of damage."""
    from kbuild.store import failures
    from kbuild.store.local import Store

    store = Store(tmp_path / "store")
    store.ensure_writable()
    path = tmp_path / "store" / failures.failure_relpath(KEY)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**GOOD_RECORD, "schema": 1}))
    assert failures.recorded(store, KEY, EXPECT) is None
    assert store.warnings == [] and not path.exists()


def test_a_record_for_another_target_or_a_link_is_not_used(tmp_path):
    from kbuild.store import failures
    from kbuild.store.local import Store

    store = Store(tmp_path / "store")
    store.ensure_writable()
    path = tmp_path / "store" / failures.failure_relpath(KEY)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**GOOD_RECORD, "target": "p.m:other"}))
    assert failures.recorded(store, KEY, EXPECT) is None
    path.unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps(GOOD_RECORD))
    path.symlink_to(tmp_path / "elsewhere.json")
    assert failures.recorded(store, KEY, EXPECT) is None  # never followed


def test_gc_drops_old_failure_records(tmp_path):
    from kbuild.store import failures
    from kbuild.store.local import Store
    from kbuild.store.maintenance import FAILURE_MAX_AGE, gc

    store = Store(tmp_path / "store")
    store.ensure_writable()
    for key in (KEY, "f" * 32):
        failures.remember(store, key, failures.Failure("p.m:k", "s", "sm_80", "e", ()))
    old = tmp_path / "store" / failures.failure_relpath(KEY)
    stamp = time.time() - FAILURE_MAX_AGE - 60
    os.utime(old, (stamp, stamp))
    assert gc(store, None)["removed_failures"] == 1
    assert not old.exists() and failures.recorded(store, "f" * 32, {
        "target": "p.m:k", "signature": "s", "arch": "sm_80"}) is not None


# -- configuration -------------------------------------------------------------------------------

@pytest.mark.parametrize("table, message", [
    ("[build]\ntarget_timeout = 0\n", "[build] target_timeout must be a positive number of "
                                      "seconds (like 600), not 0"),
    ("[build]\ntarget_timeout = -3\n", "not -3"),
    ('[build]\ntarget_timeout = "30s"\n', "not '30s'"),
    ("[build]\ntarget_timeout = true\n", "not True"),
    ("[build]\ntarget_timout = 30\n", "unknown key 'target_timout' in [build]; did you mean "
                                      "'target_timeout'?"),
])
def test_a_bad_target_timeout_in_kbuild_toml_is_a_config_error(tmp_path, table, message):
    from kbuild.config import load_config
    from kbuild.errors import ConfigError

    path = tmp_path / "kbuild.toml"
    path.write_text(f'{table}\n[kernels."m:k"]\n{SIG}\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
    assert caught.value.exit_code == 2


def test_target_timeout_on_the_command_line_must_be_seconds(tmp_path, run_kbuild):
    path = tmp_path / "kbuild.toml"
    path.write_text(f'[build]\ntarget_timeout = -1\n\n[kernels."m:k"]\n{SIG}\n')
    result = run_kbuild("build", "--json", cwd=tmp_path)
    assert result.returncode == 2 and "[build] target_timeout" in result.json["error"]
    result = run_kbuild("build", "--target-timeout", "soon", cwd=tmp_path)
    assert result.returncode == 2
    assert "not a number of seconds: 'soon'" in result.stderr


# -- the progress line ---------------------------------------------------------------------------

def test_the_progress_line_names_what_is_compiling(capsys):
    from kbuild.builder import Row
    from kbuild.cli.report import ProgressBar as _ProgressBar
    from kbuild.discover import Target

    bar = _ProgressBar(40)
    saxpy = Target("examples.saxpy:saxpy", "void(float32[::1])", "sm_80")
    poly = Target("examples.poly:poly", "void(float64[::1])", "sm_90")
    bar.started(saxpy)
    bar.started(poly)
    assert "0/40  compiling saxpy sm_80, poly sm_90" in capsys.readouterr().err
    bar(Row(saxpy.name, saxpy.signature, saxpy.arch, "k", "built"), 12, 40)
    line = capsys.readouterr().err
    assert "[#########.....................] 12/40  compiling poly sm_90" in line
    assert "saxpy" not in line
