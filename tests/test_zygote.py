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
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KBUILD_", "NUMBA_"))}
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
