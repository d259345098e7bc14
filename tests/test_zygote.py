"""The zygote's child is the process a test asked for: the same view from inside (import
path, argv, environment, streams, `__main__`), the same exit, the same journal."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import zygote


PROBE = r"""
import atexit, json, os, signal, sys, threading
def report():
    main = sys.modules["__main__"]
    print(json.dumps({
        "path": sys.path, "argv": sys.argv, "cwd": os.getcwd(), "name": __name__,
        "file": globals().get("__file__"), "main_is_us": main.__dict__ is globals(),
        "spec": None if __spec__ is None else __spec__.name,
        "environ": dict(os.environ), "dont_write_bytecode": sys.dont_write_bytecode,
        "streams": [(s.encoding, s.errors, s.line_buffering) for s in
                    (sys.stdin, sys.stdout, sys.stderr)],
        "numba": [m for m in sys.modules if m == "numba" or m.startswith("numba.")],
        "kbuild": [m for m in sys.modules if m.split(".")[0] == "kbuild"],
        "signals": [str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM,
                                                       signal.SIGPIPE, signal.SIGCHLD)],
        "blocked": sorted(map(int, signal.pthread_sigmask(signal.SIG_BLOCK, []))),
        "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
    }, sort_keys=True))
what = sys.argv[1] if len(sys.argv) > 1 else "report"
atexit.register(lambda: sys.stderr.write("atexit ran\n"))
if what == "report":
    report()
elif what == "exit3":
    sys.exit(3)
elif what == "exitmsg":
    sys.exit("a message")
elif what == "raise":
    raise ValueError("boom")
elif what == "thread":  # a non-daemon thread outlives the script: joined before exit
    threading.Thread(target=lambda: (__import__("time").sleep(0.3), print("late"))).start()
    sys.stdout.write("unflushed")
elif what == "sleep":
    __import__("time").sleep(60)
"""


def _env(tmp_path, **more) -> dict:
    env = {k: v for k, v in os.environ.items()  # as `support.kbuild_env` passes them on
           if not k.startswith(("KBUILD_", "NUMBA_")) and k != "PYTHONHASHSEED"}
    env.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(tmp_path / "lib"), **more)
    return env


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "probe.py").write_text(PROBE)
    return tmp_path / "work"


def both(argv, cwd, env, timeout=60):
    """(the zygote's result, a real process's result) of one command."""
    assert zygote._client() is not None, "no zygote in this worker"
    assert zygote._client().refusal([str(a) for a in argv], str(cwd), env) is None
    served = zygote.run(argv, cwd=cwd, env=env, timeout=timeout)
    real = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=timeout)
    return served, real


@pytest.mark.parametrize("launch", [["probe.py"], ["-m", "probe"]], ids=["script", "module"])
def test_the_child_sees_what_a_fresh_process_sees(probe, tmp_path, launch):
    env = _env(tmp_path, PYTHONDONTWRITEBYTECODE="1")
    served, real = both([sys.executable, *launch, "report", "x"], probe, env)
    assert served.returncode == real.returncode == 0, served.stderr + real.stderr
    mine, theirs = json.loads(served.stdout), json.loads(real.stdout)
    assert mine == theirs
    assert mine["numba"] == [] and mine["kbuild"] == []
    assert served.stderr == real.stderr == b"atexit ran\n"


@pytest.mark.parametrize("what", ["exit3", "exitmsg", "raise", "thread"])
def test_the_child_exits_as_a_fresh_process_does(probe, tmp_path, what):
    served, real = both([sys.executable, "probe.py", what], probe, _env(tmp_path))
    assert (served.returncode, served.stdout) == (real.returncode, real.stdout)
    assert served.stderr.splitlines()[-2:] == real.stderr.splitlines()[-2:]
    assert served.stderr.count(b"atexit ran") == 1


def test_a_worker_whose_environment_changed_gets_a_zygote_of_it(probe, tmp_path, monkeypatch):
    """A library a test imports may set variables in the worker's environment (dask sets
    OMP_NUM_THREADS, MKL_NUM_THREADS and MALLOC_TRIM_THRESHOLD_): requests carry them from
    then on, so the zygote is started again from it, not refused for the rest of the run."""
    zygote._client()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    served, real = both([sys.executable, "probe.py", "report"], probe, _env(tmp_path))
    assert served.returncode == real.returncode == 0, served.stderr + real.stderr
    mine = json.loads(served.stdout)
    assert mine == json.loads(real.stdout) and mine["environ"]["OMP_NUM_THREADS"] == "1"


def test_a_timeout_kills_the_child(probe, tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run([sys.executable, "probe.py", "sleep"], cwd=probe, env=_env(tmp_path),
                   timeout=1)
    served, real = both([sys.executable, "probe.py", "exit3"], probe, _env(tmp_path))
    assert served.returncode == real.returncode == 3  # the zygote serves on


@pytest.mark.parametrize("argv, env, why", [
    (["-c", "pass"], {}, "interpreter option -c"),
    (["-X", "importtime", "probe.py"], {}, "interpreter option -X"),
    (["probe.py"], {"PYTHONHASHSEED": "1"}, "start-up variables differ"),
    (["probe.py"], {"KBUILD_ENABLE": "1"}, "KBUILD_ENABLE"),
    (["probe.py"], {"LD_LIBRARY_PATH": "/nowhere"}, "start-up variables differ"),
])
def test_what_the_zygote_cannot_reproduce_runs_for_real(probe, tmp_path, argv, env, why):
    reason = zygote._client().refusal([sys.executable, *argv], str(probe), _env(tmp_path, **env))
    assert reason is not None and reason.startswith(why)


def test_a_module_shadowing_a_preimported_one_runs_for_real(probe, tmp_path):
    (tmp_path / "lib" / "numpy.py").write_text("")
    reason = zygote._client().refusal([sys.executable, "probe.py"], str(probe), _env(tmp_path))
    assert reason is not None and "holds a module" in reason


KERNELS = """\
from numba import cuda


@cuda.jit
def scale(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] *= 2
"""

TOML = """\
[project]
name = "zy"
paths = ["."]
arch = ["sm_80"]

[kernels."zk:scale"]
signatures = ["void(float32[::1])"]
"""


def _journal_inputs(store) -> dict:
    (path,) = (store / "v1" / "journal").glob("*.json")
    return json.loads(path.read_text().split("\n", 1)[1])["inputs"]


def test_a_served_build_journals_what_a_fresh_process_does(tmp_path):
    """Direct mode journals a run only when no numba was imported before it started, and
    journals what it read: a served build writes the journal a fresh process writes, but
    for the reads made while the zygote imported numba's dependencies (environment
    variables that a served request must have as the zygote has them, and the import
    system's listings of the interpreter's own folders)."""
    from support import kbuild_argv, kbuild_env

    project = tmp_path / "project"
    project.mkdir()
    (project / "zk.py").write_text(KERNELS)
    (project / "kbuild.toml").write_text(TOML)
    env = kbuild_env(tmp_path / "home", bytecode=False)
    served = zygote.run(kbuild_argv("build", "--store", tmp_path / "served"), cwd=project,
                        env=env, timeout=300)
    real = subprocess.run(kbuild_argv("build", "--store", tmp_path / "real"), cwd=project,
                          env=env, capture_output=True, timeout=300)
    assert served.returncode == real.returncode == 0, served.stderr + real.stderr
    mine, theirs = _journal_inputs(tmp_path / "served"), _journal_inputs(tmp_path / "real")
    for part in ("files", "absent", "cwd", "sys_path", "meta_path", "path_hooks", "python",
                 "watched"):
        assert mine[part] == theirs[part], part
    assert mine["env"].items() <= theirs["env"].items()
    read_by_preimports = set(theirs["env"]) - set(mine["env"])
    assert not [name for name in read_by_preimports if zygote._after_start(name)]
    ours = {k: v[5:] for k, v in mine["dirs"].items() if k.startswith("@")}
    assert ours == {k: v[5:] for k, v in theirs["dirs"].items() if k.startswith("@")}
    interpreter = (sys.prefix, sys.base_prefix)
    assert all(k.startswith(interpreter) for k in set(theirs["dirs"]) ^ set(mine["dirs"]))


# -- the warm zygote (numba-cuda and kbuild imported: reference builds) ------------------------

def _warm(tmp_path) -> tuple:
    from support import WARM

    return WARM


def test_a_warm_child_sees_what_a_fresh_process_sees(probe, tmp_path):
    """But for numba's and kbuild's modules, already imported."""
    warm = _warm(tmp_path)
    env = _env(tmp_path, PYTHONDONTWRITEBYTECODE="1", NUMBA_OPT="0")
    argv = [sys.executable, "probe.py", "report", "x"]
    assert zygote._warm_client(warm, env).refusal(argv, str(probe), env) is None
    served = zygote.run(argv, cwd=probe, env=env, timeout=60, warm=warm)
    real = subprocess.run(argv, cwd=probe, env=env, capture_output=True, timeout=60)
    assert served.returncode == real.returncode == 0, served.stderr + real.stderr
    mine, theirs = json.loads(served.stdout), json.loads(real.stdout)
    assert "numba.cuda" in mine.pop("numba") and "kbuild.project" in mine.pop("kbuild")
    assert theirs.pop("numba") == theirs.pop("kbuild") == []
    assert mine == theirs
    assert served.stderr == real.stderr == b"atexit ran\n"


def test_a_warm_zygote_is_started_again_for_other_settings(probe, tmp_path):
    """numba reads NUMBA_* (and the rest) at import: a request whose variables differ
    gets a warm zygote started from its own, never the one that read others."""
    warm = _warm(tmp_path)
    first = zygote._warm_client(warm, _env(tmp_path))
    assert first.differ(_env(tmp_path, NUMBA_OPT="0")) == ["NUMBA_OPT"]
    assert first.differ(_env(tmp_path, KBUILD_STORE="/elsewhere", PWD="/x")) == []
    again = zygote._warm_client(warm, _env(tmp_path, NUMBA_OPT="0"))
    assert again is not first and first.proc.poll() is not None
    assert again.env["NUMBA_OPT"] == "0"


@pytest.mark.parametrize("where", ["cwd", "argument"])
def test_a_numba_config_file_the_warm_zygote_did_not_read_runs_for_real(probe, tmp_path,
                                                                      where):
    warm, env = _warm(tmp_path), _env(tmp_path)
    folder = probe if where == "cwd" else tmp_path / "lib"
    (folder / zygote.NUMBA_CONFIG).write_text("opt: 0\n")
    argv = [sys.executable, "probe.py", str(tmp_path / "lib" / "kbuild.toml")]
    (tmp_path / "lib" / "kbuild.toml").write_text("")
    reason = zygote._warm_client(warm, env).refusal(argv, str(probe), env)
    assert reason is not None and zygote.NUMBA_CONFIG in reason


def test_a_relative_import_folder_runs_for_real_in_the_warm_zygote(probe, tmp_path):
    warm, env = _warm(tmp_path), _env(tmp_path)
    env["PYTHONPATH"] = "lib"
    reason = zygote._warm_client(warm, env).refusal([sys.executable, "probe.py"], str(probe),
                                                    env)
    assert reason == "a relative PYTHONPATH folder"


RECORD_READS = r"""
import json, os, sys

read = set()


class Recording(os._Environ):
    def __getitem__(self, key):
        read.add(key)
        return super().__getitem__(key)

    def items(self):  # numba's config lists every NUMBA_ variable: no read of the others
        return [(self.decodekey(k), self.decodevalue(v)) for k, v in self._data.items()]


e = os.environ
os.environ = Recording(e._data, e.encodekey, e.decodekey, e.encodevalue, e.decodevalue)
import importlib
for name in sys.argv[1:]:  # as the zygote takes them: `module:function` calls it too
    module, _, call = name.partition(":")
    done = importlib.import_module(module)
    if call:
        getattr(done, call)()
print(json.dumps(sorted(read)))
"""


def test_the_warm_imports_read_none_of_the_variables_requests_may_differ_in(tmp_path):
    """What a warm zygote's requests may differ in (`_WARM_AFTER_START`) must be read by
    none of its imports and set-up steps: set every such variable, import, see which were
    read."""
    from support import REPO_ROOT

    env = {**_env(tmp_path, KBUILD_TRACEBACK="1", TEST_X="1", HARNESS_X="1", PYTEST_X="1"),
           "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", RECORD_READS, *_warm(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    read = json.loads(done.stdout)
    assert any(name.startswith("NUMBA_") for name in read)  # reads are recorded
    assert [name for name in read if zygote._warm_after_start(name)] == []
