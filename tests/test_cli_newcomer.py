"""What a first-time user trips over, end to end through the CLI (issue 16).

Each test runs `python -m kbuild` on a small project in a temp dir and asserts the exit
code, the JSON and the message a user reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import entry_files
from support import kbuild_argv, kbuild_env
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

KERNEL = '''from numba import cuda


@cuda.jit
def k(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] + 1
'''

# A module written for an older NumPy: np.float_ is gone in NumPy 2.
OLD_NUMPY = '''import numpy as np
from numba import cuda

SCALE = np.float_(2.0)


@cuda.jit
def a(x):
    x[0] = SCALE


@cuda.jit
def b(x):
    x[0] = SCALE
'''

SIG = 'signatures = ["void(float32[::1])"]'


def make_project(root: Path, toml: str, modules: dict) -> Path:
    pkg = root / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for name, text in modules.items():
        (pkg / f"{name}.py").write_text(text)
    (root / "kbuild.toml").write_text(toml)
    return root


BROKEN_IMPORT_TOML = f'''[project]
name = "newcomer"
arch = ["sm_80"]

[kernels."pkg.old:a"]
{SIG}

[kernels."pkg.old:b"]
{SIG}

[kernels."pkg.mod:k"]
{SIG}
'''


@pytest.fixture
def broken_import(tmp_path) -> Path:
    return make_project(tmp_path / "project", BROKEN_IMPORT_TOML,
                        {"mod": KERNEL, "old": OLD_NUMPY})


def _rows(result) -> dict:
    return {r["target"]: r for r in result.json["targets"]}


def test_a_module_that_fails_to_import_fails_its_own_targets_only(broken_import, store,
                                                                   run_kbuild):
    cause = "importing 'pkg.old' failed: AttributeError: `np.float_` was removed"
    where = "(pkg/old.py:4)"

    # Without -k: the broken module's targets fail, the rest are skipped; exit 1, not 2.
    first = run_kbuild("build", "--json", cwd=broken_import, store=store)
    assert first.returncode == 1, first.stderr
    rows = _rows(first)
    for name in ("pkg.old:a", "pkg.old:b"):
        assert rows[name]["status"] == "failed"
        assert rows[name]["key"] is None
        assert rows[name]["error"].startswith(f"target '{name}' in kbuild.toml: {cause}")
        assert rows[name]["error"].endswith(where)
        assert "\n" not in rows[name]["error"]
    assert rows["pkg.mod:k"]["status"] == "skipped"
    assert "Traceback" not in first.stderr

    # With -k the others build.
    keep_going = run_kbuild("build", "--json", "-k", cwd=broken_import, store=store)
    assert keep_going.returncode == 1, keep_going.stderr
    rows = _rows(keep_going)
    assert rows["pkg.mod:k"]["status"] == "built"
    assert [rows[n]["status"] for n in ("pkg.old:a", "pkg.old:b")] == ["failed", "failed"]
    assert set(entry_files(store)) == {rows["pkg.mod:k"]["key"]}
    human = run_kbuild("build", "-k", cwd=broken_import, store=store)
    assert human.returncode == 1
    assert "1 cached, 2 failed" in human.stdout
    assert f"{cause}" in human.stdout and where in human.stdout

    # status and keys: per target, exit 1; keys gives no project digest.
    status = run_kbuild("status", "--json", cwd=broken_import, store=store)
    assert status.returncode == 1, status.stderr
    rows = _rows(status)
    assert rows["pkg.mod:k"]["status"] == "up-to-date"
    assert rows["pkg.old:a"]["status"] == "failed" and cause in rows["pkg.old:a"]["error"]
    keys = run_kbuild("keys", "--json", cwd=broken_import, store=store)
    assert keys.returncode == 1, keys.stderr
    assert keys.json["digest"] is None
    assert _rows(keys)["pkg.old:b"]["key"] is None
    assert len(_rows(keys)["pkg.mod:k"]["key"]) == 32

    # Fixed: everything builds, exit 0.
    (broken_import / "pkg" / "old.py").write_text(OLD_NUMPY.replace("np.float_", "np.float64"))
    fixed = run_kbuild("build", "--json", cwd=broken_import, store=store)
    assert fixed.returncode == 0, fixed.stderr
    assert sorted(r["status"] for r in fixed.json["targets"]) == ["built", "built", "cached"]


# -- signatures -------------------------------------------------------------------------

RECORDS = '''import numpy as np
from numba import cuda

packed_record_type = np.dtype([("a", np.int32), ("b", np.float32)])


@cuda.jit
def take_a(recs, out):
    i = cuda.grid(1)
    if i < recs.size:
        out[i] = recs[i].a + recs[i].b
'''


def test_a_record_dtype_can_be_named_directly_or_through_from_dtype(tmp_path, store,
                                                                    run_kbuild):
    toml = '''[project]
arch = ["sm_80"]

[kernels."pkg.records:take_a"]
signatures = ["void(packed_record_type[::1], float32[::1])",
              "void(from_dtype(packed_record_type)[::1], float32[::1])"]
'''
    project = make_project(tmp_path / "project", toml, {"records": RECORDS})
    result = run_kbuild("build", "--json", cwd=project, store=store)
    assert result.returncode == 0, result.stderr
    rows = result.json["targets"]
    assert [r["status"] for r in rows] in (["built", "built"], ["built", "cached"])
    assert rows[0]["key"] == rows[1]["key"]  # one type, two spellings


# -- pyproject.toml ---------------------------------------------------------------------------

PYPROJECT = f'''[project]
name = "from-pyproject"

[tool.kbuild.project]
arch = ["sm_80"]

[tool.kbuild.kernels."pkg.mod:k"]
{SIG}
'''


def test_pyproject_tool_kbuild_is_a_project_file_and_kbuild_toml_wins(tmp_path, store,
                                                                     run_kbuild):
    project = make_project(tmp_path / "project", "", {"mod": KERNEL})
    (project / "kbuild.toml").unlink()
    (project / "pyproject.toml").write_text(PYPROJECT)
    inside = project / "pkg"
    status = run_kbuild("status", "--json", cwd=inside, store=store)
    assert status.returncode == 0, status.stderr
    assert [(r["target"], r["arch"]) for r in status.json["targets"]] == [("pkg.mod:k", "sm_80")]

    (project / "pyproject.toml").write_text(PYPROJECT.replace("[tool.kbuild.project]\n",
                                                              "[tool.kbuild.projects]\n"))
    typo = run_kbuild("status", cwd=inside, store=store)
    assert typo.returncode == 2
    assert (f"kbuild: error: {project / 'pyproject.toml'}: unknown table "
            "[tool.kbuild.projects]; did you mean [tool.kbuild.project]?") in typo.stderr

    # A kbuild.toml beside it wins.
    (project / "kbuild.toml").write_text(f'[kernels."pkg.mod:k"]\n{SIG}\narch = ["sm_90"]\n')
    status = run_kbuild("status", "--json", cwd=inside, store=store)
    assert status.returncode == 0, status.stderr
    assert [r["arch"] for r in status.json["targets"]] == ["sm_90"]


# -- architectures the toolchain cannot compile for -------------------------------------------

def _unsupported_known_arch():
    from kbuild.backend.toolchain import supported_ccs
    from kbuild.config import KNOWN_CCS

    supported = supported_ccs()
    old = sorted(cc for cc in KNOWN_CCS if supported and cc not in supported)
    if not old:
        pytest.skip("this toolchain supports every known architecture")
    return "sm_%d%d" % old[-1], ", ".join("sm_%d%d" % cc for cc in supported)


@pytest.mark.parametrize("where", ["config", "command-line"])
def test_an_arch_the_toolchain_does_not_support_is_rejected_up_front(tmp_path, store,
                                                                      run_kbuild, where):
    arch, supported = _unsupported_known_arch()  # sm_72 with CUDA 13
    arch_line = f'arch = ["{arch}"]\n' if where == "config" else ""
    project = make_project(tmp_path / "project", f'[project]\n{arch_line}\n'
                           f'[kernels."pkg.mod:k"]\n{SIG}\n', {"mod": KERNEL})
    extra = ["--arch", f"sm_80,{arch}"] if where == "command-line" else []
    result = run_kbuild("build", *extra, cwd=project, store=store)
    assert result.returncode == 2, result.stdout
    prefix = f"{project / 'kbuild.toml'}: [project] arch" if where == "config" else "--arch"
    assert f"kbuild: error: {prefix}: arch '{arch}' is not supported by this toolchain" \
        in result.stderr
    assert f"; supported: {supported}\n" in result.stderr
    assert result.stdout == "" and not store.exists()


# -- --json answers in JSON, whatever goes wrong --------------------------------------------

GOOD_TOML = f'[project]\narch = ["sm_80"]\n\n[kernels."pkg.mod:k"]\n{SIG}\n'

# id -> (kbuild.toml text or None for none at all, arguments, exit code, message fragment)
JSON_ERRORS = {
    "no-config": (None, ["build", "--json"], 2, "no kbuild.toml"),
    "config-typo": ('[projet]\n' + GOOD_TOML, ["status", "--json"], 2,
                    "unknown table [projet]; did you mean [project]?"),
    "unknown-target": (GOOD_TOML, ["build", "--json", "nope"], 2, "unknown target 'nope'"),
    "usage": (GOOD_TOML, ["build", "--json", "--bogus"], 2,
              "unrecognized arguments: --bogus; see 'kbuild --help'"),
    "bad-jobs": (GOOD_TOML, ["build", "--json", "-j", "x"], 2,
                 "argument -j/--jobs: invalid int value: 'x'"),
    "bad-arch": (GOOD_TOML, ["keys", "--json", "--arch", "sm_81"], 2,
                 "--arch: unknown arch 'sm_81'"),
    "explain-unknown": (GOOD_TOML, ["explain", "--json", "kk"], 2, "unknown target 'kk'"),
}


@pytest.mark.parametrize("case", sorted(JSON_ERRORS))
def test_json_output_is_one_object_with_the_error(tmp_path, store, run_kbuild, case):
    toml, args, code, fragment = JSON_ERRORS[case]
    project = make_project(tmp_path / "project", toml or "", {"mod": KERNEL})
    if toml is None:
        (project / "kbuild.toml").unlink()
    result = run_kbuild(*args, cwd=project, store=store)
    assert result.returncode == code, (result.stdout, result.stderr)
    answer = json.loads(result.stdout)  # exactly one JSON document, nothing else
    assert fragment in answer["error"]
    assert answer["exit_code"] == code
    # One stream for a machine: the error is not echoed on stderr (issue 25).
    assert "kbuild: error:" not in result.stderr
    assert "Traceback" not in result.stderr


# -- status --check, --version, export's file name -------------------------------------------

def test_status_check_exits_1_while_anything_is_stale_or_missing(tmp_path, store, run_kbuild):
    project = make_project(tmp_path / "project", GOOD_TOML, {"mod": KERNEL})
    missing = run_kbuild("status", "--check", cwd=project, store=store)
    assert missing.returncode == 1
    assert missing.stdout.startswith("missing    pkg.mod:k void(float32[::1]) sm_80")
    assert run_kbuild("status", cwd=project, store=store).returncode == 0  # only --check fails

    assert run_kbuild("build", cwd=project, store=store).returncode == 0
    fresh = run_kbuild("status", "--check", "--json", cwd=project, store=store)
    assert fresh.returncode == 0 and fresh.json["summary"]["up-to-date"] == 1

    (project / "pkg" / "mod.py").write_text(KERNEL.replace("+ 1", "+ 2"))
    stale = run_kbuild("status", "--check", "--json", cwd=project, store=store)
    assert stale.returncode == 1
    assert stale.json["targets"][0]["status"] == "stale"


def test_version_names_the_toolchain_and_needs_no_driver(tmp_path, run_kbuild):
    import kbuild

    result = run_kbuild("--version", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"kbuild {kbuild.__version__}"
    names = [line.split()[0] for line in lines[1:]]
    assert names[:5] == ["numba-cuda", "numba", "llvmlite", "NVVM", "nvJitLink"]
    assert "CUDA driver" in result.stdout  # a version, or "none (...)" on a build machine
    assert "unavailable" not in result.stdout.split("CUDA driver")[0]  # NVVM etc. were found


@pytest.mark.parametrize("name", ["x.zip", "x.tar.bz2", "x"])
def test_export_refuses_a_file_name_it_would_not_honour(tmp_path, store, run_kbuild, name):
    project = make_project(tmp_path / "project", GOOD_TOML, {"mod": KERNEL})
    result = run_kbuild("export", name, cwd=project, store=store)
    assert result.returncode == 2
    assert (f"kbuild: error: export: cannot write '{name}': kbuild writes tar archives; "
            "name it .tar, .tar.gz, .tgz") in result.stderr
    assert not (project / name).exists()


# -- build output: errors once per kernel, order, -q / -v, colour ------------------------------

BROKEN = '''from numba import cuda


@cuda.jit
def bad(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] + "s"
'''

FAILING_TOML = f'''[project]
arch = ["sm_80"]

[kernels."pkg.broken:bad"]
signatures = ["void(float32[::1])", "void(float64[::1])"]

[kernels."pkg.mod:k"]
{SIG}
'''
FIRST = "pkg.broken:bad void(float32[::1]) sm_80"
SECOND = "pkg.broken:bad void(float64[::1]) sm_80"


def test_a_type_error_is_shown_once_per_kernel_with_its_file_and_line(tmp_path, store,
                                                                     run_kbuild):
    project = make_project(tmp_path / "project", FAILING_TOML,
                           {"broken": BROKEN, "mod": KERNEL})
    result = run_kbuild("build", "-k", "-j", "2", cwd=project, store=store)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    # Built rows first, then the failed ones in declared order, every run.
    assert lines[0].startswith("built    pkg.mod:k void(float32[::1]) sm_80")
    first = lines.index(f"failed   {FIRST}")
    assert lines[first + 1] == ("         pkg/broken.py:5: TypingError: No implementation of "
                                "function Function(<built-in function add>) found for signature:")
    second = lines.index(f"failed   {SECOND}")
    assert second > first and lines[second + 1] == f"         same error as {FIRST}"
    assert result.stdout.count("TypingError") == 1
    assert lines[-1].startswith("1 built, 0 cached, 2 failed in ")

    as_json = run_kbuild("build", "-k", "--json", cwd=project, store=store)
    assert [(r["target"], r["status"]) for r in as_json.json["targets"]] == [
        ("pkg.mod:k", "cached"), ("pkg.broken:bad", "failed"), ("pkg.broken:bad", "failed")]
    assert as_json.json["targets"][1]["where"] == "pkg/broken.py:5"

    quiet = run_kbuild("build", "-k", "-q", cwd=project, store=store)
    assert quiet.stdout.splitlines() == [
        f"failed   {FIRST}",
        "         pkg/broken.py:5: TypingError: No implementation of function "
        "Function(<built-in function add>) found for signature:",
        f"failed   {SECOND}", f"         same error as {FIRST}",
        quiet.stdout.splitlines()[-1]]
    verbose = run_kbuild("build", "-k", "-v", cwd=project, store=store)
    assert verbose.stdout.count("TypingError") == 2  # every row in full
    assert verbose.stdout.count("         key ") == 3


def test_without_keep_going_failed_rows_come_before_skipped_ones(tmp_path, store, run_kbuild):
    project = make_project(tmp_path / "project", FAILING_TOML + f'\n[kernels."pkg.mod2:k"]\n{SIG}\n',
                           {"broken": BROKEN, "mod": KERNEL, "mod2": KERNEL.replace("+ 1", "+ 3")})
    result = run_kbuild("build", "--json", "-j", "2", cwd=project, store=store)
    assert result.returncode == 1
    rank = {"built": 0, "cached": 0, "failed": 1, "skipped": 2}
    statuses = [r["status"] for r in result.json["targets"]]
    assert statuses == sorted(statuses, key=rank.get) and "failed" in statuses


def _in_a_terminal(args, cwd, store, env=()):
    """Run kbuild with its stdout on a pseudo-terminal; (exit code, what it printed)."""
    import os
    import pty
    import subprocess

    leader, follower = pty.openpty()
    full_env = kbuild_env(Path(cwd).parent / "home", store=store,
                          env={"NO_COLOR": None, "TERM": "xterm", **dict(env)})
    proc = subprocess.Popen(kbuild_argv(*args), cwd=cwd, env=full_env, stdout=follower,
                            stderr=subprocess.PIPE)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed: the process is done
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return proc.wait(timeout=120), out.decode()


def test_colour_only_on_a_terminal_and_never_with_no_color(tmp_path, store, run_kbuild):
    project = make_project(tmp_path / "project", GOOD_TOML, {"mod": KERNEL})
    code, out = _in_a_terminal(["build"], project, store)
    assert code == 0 and "\x1b[32mbuilt   \x1b[0m pkg.mod:k" in out
    code, out = _in_a_terminal(["build"], project, store, {"NO_COLOR": "1"})
    assert code == 0 and "cached   pkg.mod:k" in out and "\x1b[" not in out
    piped = run_kbuild("build", cwd=project, store=store)
    assert "\x1b[" not in piped.stdout


# -- Ctrl-C ----------------------------------------------------------------------------------------

def test_ctrl_c_during_a_parallel_build_exits_130_with_the_rows_so_far(tmp_path, store,
                                                                        run_kbuild):
    import os
    import signal
    import subprocess
    import time

    modules = {f"m{i}": KERNEL.replace("+ 1", f"* {i + 2} + 1") for i in range(12)}
    toml = '[project]\narch = ["sm_80"]\n' + "".join(
        f'\n[kernels."pkg.{name}:k"]\n{SIG}\n' for name in modules)
    project = make_project(tmp_path / "project", toml, modules)
    # Its own session: the signal reaches the workers too, as Ctrl-C on a terminal does.
    # SIGINT as a terminal has it: a suite started in the background by a shell inherits
    # it ignored, and Python keeps a signal ignored at start-up ignored.
    proc = subprocess.Popen(kbuild_argv("build", "--json", "-j", "2"), cwd=project,
                            env=kbuild_env(tmp_path / "home", store=store),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # Three entries, for two rows: the parent commits a target's entry and then reports
    # its row, so a signal between the two leaves the last entry stored but unreported
    # (the store may hold one more than the answer). The third entry is committed only
    # after the second row was reported.
    deadline = time.monotonic() + 300
    while len(entry_files(store)) < 3 and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the build finished before three targets were stored"
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()
    assert "Traceback" not in err.decode()
    assert err.decode().strip().splitlines()[-1] == "kbuild: error: interrupted"
    answer = json.loads(out)
    assert answer["error"] == "interrupted" and answer["summary"]["interrupted"] is True
    done = {r["key"] for r in answer["targets"] if r["status"] == "built"}
    assert len(done) >= 2 and answer["summary"]["built"] < 12

    # The store holds what was reported built (and at most what finished as the signal
    # came), every entry sound.
    status = run_kbuild("status", "--json", cwd=project, store=store)
    fresh = {r["key"] for r in status.json["targets"] if r["status"] == "up-to-date"}
    assert done <= fresh == set(entry_files(store))
    assert "warning" not in status.stderr


def _define_a_class_as_ctrl_c_arrives():
    class Interrupting:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt

    type("Defined", (), {"field": Interrupting()})


def test_ctrl_c_that_python_wraps_while_a_class_is_defined_exits_130(monkeypatch, capsys):
    """Python 3.11 hands a Ctrl-C raised inside `__set_name__` (a module defining a
    dataclass as it imports) on as a RuntimeError whose cause it is: still an interrupt,
    exit 130, never an internal error (a parallel build interrupted early once said
    `internal error: RuntimeError: Error calling __set_name__ ...`, exit 2)."""
    from kbuild.cli import entry

    monkeypatch.setattr(entry, "handler",
                        lambda run: lambda args, opened: _define_a_class_as_ctrl_c_arrives())
    assert entry.main(["status", "--json"]) == 130
    answer = json.loads(capsys.readouterr().out)
    assert answer["kind"] == "Interrupted" and answer["error"] == "interrupted"


# -- gc ------------------------------------------------------------------------------------------

def test_gc_says_when_what_it_may_not_evict_keeps_the_store_over_the_limit(tmp_path, store,
                                                                           run_kbuild):
    project = make_project(tmp_path / "project", GOOD_TOML, {"mod": KERNEL})
    assert run_kbuild("build", cwd=project, store=store).returncode == 0
    result = run_kbuild("gc", "--max-size", "1KB", "--json", cwd=project, store=store)
    assert result.returncode == 0, result.stderr
    assert result.json["over_limit"] is True and result.json["evicted_entries"] == 0
    assert result.json["pinned_entries"] == 2  # the kernel's target and its own object
    assert 0 < result.json["pinned_bytes"] <= result.json["bytes"]
    (warning,) = result.json["warnings"]
    assert warning.startswith("the store is still over 1000 B (")
    assert "are pinned, the current targets of project 'project'" in warning
    human = run_kbuild("gc", "--max-size", "1KB", cwd=project, store=store)
    assert "kbuild: warning: the store is still over 1000 B" in human.stderr
    roomy = run_kbuild("gc", "--max-size", "1GB", "--json", cwd=project, store=store)
    assert roomy.json["over_limit"] is False and roomy.json["warnings"] == []


# -- kbuild init -----------------------------------------------------------------------------------

EAGER = '''from numba import cuda, float32, void
from numba.cuda import jit as cjit


@cuda.jit("void(float32[::1])")
def one(x):
    x[0] = 1


@cuda.jit(["void(float32[::1])", "void(float64[::1])"])
def two(x):
    x[0] = 2


@cjit(void(float32[::1]))
def typed(x):
    x[0] = 3


@cuda.jit
def lazy(x):
    x[0] = 4


@cuda.jit(device=True)
def helper(v):
    return v + 1
'''


def test_init_writes_a_kbuild_toml_from_the_kernels_it_finds(tmp_path, store, run_kbuild):
    project = make_project(tmp_path / "proj", "", {"eager": EAGER})
    (project / "kbuild.toml").unlink()
    (project / "tests").mkdir()
    (project / "tests" / "test_k.py").write_text(EAGER)  # test code is not the project's

    made = run_kbuild("init", "--arch", "sm_80,sm_90", "--json", cwd=project)
    assert made.returncode == 0, made.stderr
    assert made.json["kernels"] == ["pkg.eager:one", "pkg.eager:two", "pkg.eager:typed"]
    assert made.json["lazy"] == ["pkg.eager:lazy"]
    text = (project / "kbuild.toml").read_text()
    assert 'signatures = ["void(float32[::1])", "void(float64[::1])"]' in text
    assert '# [kernels."pkg.eager:lazy"]' in text and "helper" not in text

    status = run_kbuild("status", "--json", cwd=project, store=store)
    assert status.returncode == 0, status.stderr
    assert sorted((r["target"], r["signature"], r["arch"]) for r in status.json["targets"]) == \
        sorted((name, sig, arch) for name, sig in [
            ("pkg.eager:one", "void(float32[::1])"), ("pkg.eager:two", "void(float32[::1])"),
            ("pkg.eager:two", "void(float64[::1])"), ("pkg.eager:typed", "void(float32[::1])")]
            for arch in ("sm_80", "sm_90"))

    again = run_kbuild("init", cwd=project)
    assert again.returncode == 2
    assert f"init: {project / 'kbuild.toml'} exists; edit it, or pass --force" in again.stderr


FACTORIES = '''from types import SimpleNamespace

from numba import cuda


def make_scaler(factor):
    @cuda.jit("void(float32[::1], float32[::1])")
    def scale(x, out):
        out[0] = x[0] * factor

    return scale


def make_lazy(factor):
    @cuda.jit
    def lazy(x, y, out):
        out[0] = x[0] * factor + y[0]

    return lazy


def body(x):
    x[0] = 1


def device_maker():
    @cuda.jit(device=True)
    def dev(v):
        return v

    return dev


double = make_scaler(2.0)
triple = make_lazy(3.0)
wrapped = cuda.jit("void(float64[::1])")(body)
plain = cuda.jit(body)
ns = SimpleNamespace(func=make_scaler(4.0), factor=4.0)
not_a_kernel = device_maker()

try:
    @cuda.jit("void(int32[::1])")
    def guarded(x):
        x[0] = 2
except ImportError:
    pass
'''


def test_init_finds_kernels_made_at_import_time(tmp_path, store, run_kbuild):
    """Factories, `cuda.jit(sig)(f)`, keyword attributes of a namespace and kernels
    inside a `try`: each declared with the attribute path kbuild resolves."""
    project = make_project(tmp_path / "proj", "", {"made": FACTORIES})
    (project / "kbuild.toml").unlink()

    made = run_kbuild("init", "--arch", "sm_80", "--json", cwd=project)
    assert made.returncode == 0, made.stderr
    assert made.json["kernels"] == ["pkg.made:double", "pkg.made:wrapped", "pkg.made:ns.func",
                                    "pkg.made:guarded"]
    assert made.json["lazy"] == ["pkg.made:triple", "pkg.made:plain"]
    text = (project / "kbuild.toml").read_text()
    # A lazy kernel's placeholder signature has as many arguments as the kernel.
    assert '# signatures = ["void(float32[::1], float32[::1], float32[::1])"]' in text
    assert "not_a_kernel" not in text and "device_maker" not in text

    status = run_kbuild("status", "--json", cwd=project, store=store)
    assert status.returncode == 0, status.stderr
    assert {r["target"]: r["signature"] for r in status.json["targets"]} == {
        "pkg.made:double": "void(float32[::1], float32[::1])",
        "pkg.made:wrapped": "void(float64[::1])",
        "pkg.made:ns.func": "void(float32[::1], float32[::1])",
        "pkg.made:guarded": "void(int32[::1])"}
    assert {r["status"] for r in status.json["targets"]} == {"missing"}


# -- kbuild graph --------------------------------------------------------------------------------

SHARED = '''from numba import cuda

SCALE = 2.5


@cuda.jit(device=True)
def sq(v):
    return v * v


@cuda.jit
def k1(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = sq(x[i]) * SCALE


@cuda.jit
def k2(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = sq(x[i])
'''


def test_graph_has_one_node_per_function_the_globals_read_and_a_legend(tmp_path, store,
                                                                         run_kbuild):
    toml = ('[project]\narch = ["sm_80", "sm_90"]\n\n[kernels."pkg.shared:k1"]\n'
            'signatures = ["void(float32[::1])", "void(float64[::1])"]\n\n'
            f'[kernels."pkg.shared:k2"]\n{SIG}\n')
    project = make_project(tmp_path / "project", toml, {"shared": SHARED})
    result = run_kbuild("graph", "--format", "json", cwd=project, store=store)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    nodes = {n["id"]: n for n in data["nodes"]}
    assert sorted(nodes) == ["function pkg.shared:sq", "global SCALE = 2.5",
                             "kernel pkg.shared:k1", "kernel pkg.shared:k2"]
    k1 = nodes["kernel pkg.shared:k1"]
    assert (k1["targets"], len(k1["signatures"]), k1["archs"], k1["stale"]) == \
        (4, 2, ["sm_80", "sm_90"], 4)
    assert sorted((e["source"], e["target"]) for e in data["edges"]) == [
        ("kernel pkg.shared:k1", "function pkg.shared:sq"),
        ("kernel pkg.shared:k1", "global SCALE = 2.5"),
        ("kernel pkg.shared:k2", "function pkg.shared:sq")]
    dot = run_kbuild("graph", cwd=project, store=store).stdout
    assert '"kernel pkg.shared:k1" [shape=box, style=filled, fillcolor=lightcoral, ' \
           'label="pkg.shared:k1\\n2 signatures x 2 archs\\n4 of 4 stale"];' in dot
    assert "subgraph cluster_legend" in dot


# -- kbuild show ---------------------------------------------------------------------------------

SHARED_MEMORY = '''from numba import cuda, float32


@cuda.jit
def staged(x):
    tile = cuda.shared.array(128, float32)
    i = cuda.grid(1)
    tile[cuda.threadIdx.x] = x[i]
    cuda.syncthreads()
    x[i] = tile[127 - cuda.threadIdx.x]
'''


def test_show_prints_resources_ptx_and_sass(tmp_path, store, run_kbuild):
    toml = GOOD_TOML + f'\n[kernels."pkg.tiles:staged"]\n{SIG}\n'
    project = make_project(tmp_path / "project", toml, {"mod": KERNEL, "tiles": SHARED_MEMORY})
    not_yet = run_kbuild("show", "staged", cwd=project, store=store)
    assert not_yet.returncode == 1
    assert "pkg.tiles:staged void(float32[::1]) sm_80 is not built (or stale): run kbuild " \
           "build staged first" in not_yet.stderr
    assert run_kbuild("build", cwd=project, store=store).returncode == 0

    shown = run_kbuild("show", "staged", "--json", cwd=project, store=store)
    assert shown.returncode == 0, shown.stderr
    (row,) = shown.json["targets"]
    assert row["resources"]["shared_bytes"] == 128 * 4
    assert 0 < row["resources"]["registers"] <= 255 and row["resources"]["local_bytes"] == 0
    human = run_kbuild("show", "k", cwd=project, store=store)
    assert human.stdout.startswith("pkg.mod:k void(float32[::1]) sm_80: ")
    assert " registers and 0 B local per thread, 0 B shared per block" in human.stdout
    ptx = run_kbuild("show", "k", "--ptx", cwd=project, store=store)
    assert ".entry " in ptx.stdout and ".target sm_80" in ptx.stdout

    sass = run_kbuild("show", "k", "--sass", cwd=project, store=store)
    from kbuild.backend.cubin import cuda_tool

    if cuda_tool("nvdisasm") is None:
        assert sass.returncode == 2
        assert "show --sass: nvdisasm is not installed" in sass.stderr
    else:  # the test extras install NVIDIA's nvdisasm wheel
        assert sass.returncode == 0, sass.stderr
        assert ".target\tsm_80" in sass.stdout and "STO_CUDA_ENTRY" in sass.stdout
        assert " EXIT ;" in sass.stdout and "LDG" in sass.stdout and "STG" in sass.stdout


# -- kbuild watch ----------------------------------------------------------------------------------

def test_watch_rebuilds_what_a_save_changed_in_one_process(tmp_path, store, run_kbuild):
    import subprocess

    project = make_project(tmp_path / "project", GOOD_TOML, {"mod": KERNEL})
    proc = subprocess.Popen(kbuild_argv("watch", "--rounds", "3"), cwd=project,
                            env=kbuild_env(tmp_path / "home", store=store),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    module = project / "pkg" / "mod.py"
    saves = [KERNEL.replace("from numba", "raise RuntimeError('half-saved')\nfrom numba"),
             KERNEL.replace("+ 1", "+ 7")]
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("watching ") and saves:
                module.write_text(saves.pop(0))
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        proc.kill()
    summaries = [ln for ln in lines if " built, " in ln]
    assert [s.split(" in ")[0] for s in summaries] == [
        "1 built, 0 cached, 0 failed", "0 built, 0 cached, 1 failed",
        "1 built, 0 cached, 0 failed"]
    assert lines.count("changed: pkg/mod.py") == 2
    assert any("importing 'pkg.mod' failed: RuntimeError: half-saved (pkg/mod.py:1)" in ln
               for ln in lines)
    # What the resident process built is what a new process keys from the saved source.
    status = run_kbuild("status", "--json", cwd=project, store=store)
    assert status.json["summary"]["up-to-date"] == 1, status.stdout
