"""Direct mode vouches only for what its recorder saw.

A kernel module reads something at import that is neither a file opened, a folder listed
nor a variable read by name through `os.environ`: `os.environb`, a scan of the whole
environment, `os.path.exists`, `os.path.getsize`, a subprocess's output. Change that input
and `kbuild status --check` must say the target is stale (exit 1), as keying in full does:
either the journal recorded the observation (a stat by its result, a named `environb`
read), or it refuses to vouch and every run keys in full, naming why in the mode line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from support import run, shared_home

TOML = """[project]
name = "unseenproj"
paths = ["."]
arch = ["sm_80"]

[kernels."pkg.mod:k"]
signatures = ["void(float32[::1])"]
"""

MOD = '''import os
import subprocess
from pathlib import Path

from numba import cuda

HERE = Path(__file__).parent
VALUE = {read}


@cuda.jit
def k(x):
    x[0] = x[0] * VALUE
'''


def set_env(name, value):
    def change(project: Path, env: dict) -> None:
        env[name] = value
    return change


def write_file(name, text):
    def change(project: Path, env: dict) -> None:
        (project / "pkg" / name).write_text(text)
    return change


@dataclass(frozen=True)
class Case:
    id: str
    read: str
    change: object
    direct: bool  # whether the journal can answer the unchanged no-op
    why: str = ""  # what the mode line names when it cannot


CASES = [
    Case("environb", 'float(os.environb.get(b"KB_B", b"1.0"))', set_env("KB_B", "3.0"), True),
    Case("environ-scan", 'float(1 + sum(1 for k, v in os.environ.items() if k.startswith("KB_X")))',
         set_env("KB_X1", "1"), False, "scanned the whole environment"),
    Case("path-exists", '2.0 if os.path.exists(HERE / "fast.flag") else 1.0',
         write_file("fast.flag", ""), True),
    Case("getsize", 'float(os.path.getsize(HERE / "v.txt"))', write_file("v.txt", "12345\n"),
         True),
    Case("subprocess", 'float(subprocess.check_output(["cat", str(HERE / "w.txt")]))',
         write_file("w.txt", "4.0\n"), False, "ran a subprocess (cat)"),
]


def _status(project: Path, store: Path, env: dict, *extra):
    return run("status", *extra, "--store", store, cwd=project, home=shared_home(),
               env={"KB_B": None, "KB_X1": None, **env}, bytecode=False)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_an_input_the_recorder_cannot_check_is_never_vouched_for(tmp_path, case):
    project, store, env = tmp_path / "project", tmp_path / "store", {}
    (project / "pkg").mkdir(parents=True)
    (project / "kbuild.toml").write_text(TOML)
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "mod.py").write_text(MOD.format(read=case.read))
    (project / "pkg" / "v.txt").write_text("1\n")
    (project / "pkg" / "w.txt").write_text("2.0\n")
    built = run("build", "--json", "--store", store, cwd=project, home=shared_home(),
                env={"KB_B": None, "KB_X1": None}, bytecode=False)
    assert built.returncode == 0, built.stderr
    _status(project, store, env, "--json")  # the journal, once the files are not racy
    again = _status(project, store, env, "--json")
    assert again.returncode == 0, again.stderr
    mode = again.json["mode"]
    assert mode["used"] == ("direct" if case.direct else "full"), mode
    if not case.direct:
        assert case.why in mode["reason"], mode
    case.change(project, env)
    check = _status(project, store, env, "--check")
    assert check.returncode == 1, check.stdout + check.stderr
    assert "stale" in check.stdout
    if not case.direct:
        assert case.why in check.stdout.splitlines()[-1], check.stdout


FAILING = '''from numba import cuda


@cuda.jit
def k_ok(x):
    x[0] = x[0] + 1.0


@cuda.jit
def k_bad(x):
    x[0] = no_such_function(x[0])  # noqa: F821 - numba cannot type it
'''


def test_a_build_with_a_failing_target_is_journaled(tmp_path):
    """One kernel numba cannot compile: its failure is recorded under its key, and the
    journal holds it, so a no-op build answers from the journal (reporting the recorded
    failure, exiting non-zero) instead of keying every target in full."""
    project, store = tmp_path / "project", tmp_path / "store"
    (project / "pkg").mkdir(parents=True)
    (project / "kbuild.toml").write_text(
        TOML.replace('"pkg.mod:k"', '"pkg.mod:k_ok"') +
        '\n[kernels."pkg.mod:k_bad"]\nsignatures = ["void(float32[::1])"]\n')
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "mod.py").write_text(FAILING)

    def build():
        return run("build", "--json", "-k", "--store", store, cwd=project,
                   home=shared_home(), bytecode=False)

    first = build()
    assert first.returncode == 1 and first.json["summary"]["failed"] == 1, first.stderr
    build()  # the journal, once the files are not racy
    done = build()
    assert done.returncode == 1, done.stderr
    assert done.json["mode"]["used"] == "direct", done.json["mode"]
    rows = {r["target"].rpartition(":")[2]: r for r in done.json["targets"]}
    assert rows["k_ok"]["status"] == "cached"
    assert rows["k_bad"]["status"] == "failed" and rows["k_bad"]["recorded"]
    assert "failed earlier with this key" in rows["k_bad"]["error"]
    full = run("build", "--json", "-k", "--full", "--store", store, cwd=project,
               home=shared_home(), bytecode=False)
    assert [(r["status"], r["key"], r["error"]) for r in full.json["targets"]] == \
        [(r["status"], r["key"], r["error"]) for r in done.json["targets"]]
    retry = run("build", "--json", "-k", "--retry-failed", "--store", store, cwd=project,
                home=shared_home(), bytecode=False)
    assert retry.json["mode"]["used"] == "full", retry.json["mode"]
    assert not {r["recorded"] for r in retry.json["targets"] if r["status"] == "failed"} - {False}
