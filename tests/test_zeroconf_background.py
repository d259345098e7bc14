"""Edits recovered in parallel (`kbuild/zeroconf/background.py`): after an edit of a
device function several kernels call, the kernels the program launched last time are
rebuilt by a helper process while the program runs, and its launches take them.

Each scenario runs a program of eight kernels (`k0`..`k7`; the even ones call
`mathlib.twice`) and one it never launches, in fresh processes under the fake driver
(`zeroconf_support`): once to fill the store and the journal, then after an edit of
`twice` that its callers must be compiled again for. The harness counts the compiles of
the program's own process (`counts["built"]`); the helper's report says what it built;
the store's entries say what exists.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from zeroconf_support import MATHLIB, declare, run, write_program

ON = {"KBUILD_BACKGROUND": "2"}
LAUNCHED = ("k0", "k1", "k2", "k3", "k4", "k5")  # k6 calls mathlib too, never launched
# k2's compile (the second) starts the helper; the program then waits until the helper
# is done, so that the counts say who compiled what (a program goes on meanwhile).
READY = ("k0", "k1", "k2", "done", "k3", "k4", "k5")


def kernels_source(broken: str | None = None) -> str:
    out = ["from numba import cuda", "", "import mathlib", ""]
    for i in range(8):
        body = "mathlib.twice(x[i])" if i % 2 == 0 else f"x[i] + {i}.0"
        if f"k{i}" == broken:
            body += " + no_such_name"  # fails to type: this kernel alone
        out += ["", "@cuda.jit", f"def k{i}(x, out):", "    i = cuda.grid(1)",
                "    if i < x.size:", f"        out[i] = {body}", ""]
    out += ["", "@cuda.jit", "def unused(x, out):", "    i = cuda.grid(1)",
            "    if i < x.size:", "        out[i] = mathlib.twice(x[i]) + 7.0", ""]
    return "\n".join(out)


APP = """\
import json
import os
import signal

import numpy as np

import app_kernels as K


def _helper_pid():
    import kbuild.zeroconf as zc

    helper = zc.current().background
    with open("helper.json", "w") as f:
        json.dump({"pid": helper.process.pid if helper else None,
                   "running": helper is not None and helper.process.poll() is None}, f)


def main(device_array, which=()):
    x = device_array(np.arange(64, dtype=np.float32))
    out = device_array(np.zeros(64, np.float32))
    failed = []
    for name in which:
        if name == "die":  # killed: no atexit, no cleanup
            _helper_pid()
            os.kill(os.getpid(), signal.SIGKILL)
        if name == "interrupt":  # Ctrl-C: the program ends with KeyboardInterrupt
            _helper_pid()
            raise KeyboardInterrupt
        if name == "done":  # wait until the helper is done: who compiles what is then
            import kbuild.zeroconf as zc  # known (a program never waits for it)

            zc.current().background.wait(300)
            continue
        try:
            getattr(K, name)[2, 32](x, out)
        except Exception as exc:
            failed.append(name)
    with open("failed.json", "w") as f:
        json.dump(failed, f)
"""


def program(root: Path) -> Path:
    return write_program(root, kernels_source(), APP)


def edit_mathlib(root: Path) -> None:
    """`twice` returns another type: each caller's own code changes, and is compiled
    again (an edit of its body alone is relinked, in the program: see background.py)."""
    (root / "mathlib.py").write_text(MATHLIB.replace("v * 2.0", "int(v) * 3"))


def stored_targets(root: Path) -> list:
    """(target, signature) of every entry in the program's store."""
    found = []
    for path in (root / "kbuild").glob("v1/entries/*/*.json"):
        manifest = json.loads(path.read_text())
        if "target" in manifest:  # a kernel's entry (not a device function's object)
            found.append((manifest["target"], manifest["signature"]))
    return sorted(found)


def labels(names) -> list:
    return sorted(f"app_kernels:{n} void(float32[::1], float32[::1]) sm_80" for n in names)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """The program run once (store and journal filled), kept aside: (its folder, the copy)."""
    root = program(tmp_path_factory.mktemp("background") / "p")
    first = run(root, "kbuild", LAUNCHED, env=ON)
    assert first["counts"]["built"] == 6 and first["background"] is None  # none known
    kept = root.parent / "kept"
    shutil.copytree(root, kept, symlinks=True)
    return root, kept


@pytest.fixture
def edited(first_run):
    """The program after its first run, in the same folder (the journal is per program:
    its path), its device function edited."""
    root, kept = first_run
    shutil.rmtree(root)
    shutil.copytree(kept, root, symlinks=True)
    edit_mathlib(root)
    return root


def test_an_edit_is_rebuilt_in_the_background_and_served_from_it_alone(edited):
    second = run(edited, "kbuild", READY, env=ON)
    # The first two launches that missed (k0, k2) compiled in the program, the second
    # starting the helper; the helper built k4 (the other launched kernel that calls
    # mathlib), and the program's launch of k4 took that entry; the odd ones unchanged.
    assert second["counts"]["built"] == 2
    assert second["counts"]["served"] == 6 and not second["warnings"]
    report = second["background"]
    assert report["built"] == labels(["k4"]) and report["failed"] == []
    assert sorted(report["cached"]) == labels(["k0", "k1", "k3", "k5"])
    # The helper's entries are the ones a full keying in the program serves.
    third = run(edited, "kbuild", LAUNCHED, env={"KBUILD_BACKGROUND": "0",
                                                 "KBUILD_JOURNAL": "0"})
    assert third["counts"].get("built", 0) == 0
    assert sorted(map(tuple, third["served"])) == sorted(map(tuple, second["served"]))
    # Nothing the program does not launch: k6 and `unused` call the edited function too,
    # but were never launched (no entry, before or after the edit); only the launched
    # types; k0, k2 and k4 again under their new keys.
    assert {name for name, _ in stored_targets(edited)} == {f"app_kernels:{n}"
                                                            for n in LAUNCHED}
    assert {sig for _, sig in stored_targets(edited)} == {"void(float32[::1], float32[::1])"}
    assert len(stored_targets(edited)) == 6 + 3


@pytest.mark.parametrize("off", ["environment", "enable"])
def test_turned_off_nothing_is_built_in_the_background(edited, off):
    if off == "environment":
        second = run(edited, "kbuild", LAUNCHED, env={"KBUILD_BACKGROUND": "0"})
    else:
        second = run(edited, "kbuild", LAUNCHED, env=ON, enable={"background": False})
    assert second["background"] is None  # no helper started
    assert second["counts"]["built"] == 3


def test_an_edit_that_breaks_one_kernel_fails_that_one_only(tmp_path):
    root = program(tmp_path / "p")
    everything = tuple(f"k{i}" for i in range(8))
    run(root, "kbuild", everything, env=ON)
    edit_mathlib(root)
    (root / "app_kernels.py").write_text(kernels_source(broken="k6"))
    second = run(root, "kbuild", everything[:3] + ("done",) + everything[3:], env=ON)
    assert json.loads((root / "failed.json").read_text()) == ["k6"]
    report = second["background"]
    assert report["failed"] == labels(["k6"]) and report["built"] == labels(["k4"])
    assert second["counts"]["built"] == 2  # k0, k2: k4 is the helper's, k6 fails again
    assert second["counts"]["fallback"] == 1  # and numba compiles it, and says why
    assert {n for n, _ in stored_targets(root)} == {f"app_kernels:{n}" for n in everything}


def test_a_cold_store_builds_what_the_project_file_declares(tmp_path):
    root = program(tmp_path / "p")
    declared = ("k0", "k1", "k2", "k3", "k4", "k5")
    declare(root, {f"app_kernels:{n}": ["void(float32[::1], float32[::1])"] for n in declared})
    # No journal yet: the program's first two compiles (k0, k1) start the helper, which
    # builds the other declared kernels; the program takes them from the store.
    first = run(root, "kbuild", ("k0", "k1", "done", "k2", "k3", "k4", "k5"), env=ON)
    assert first["counts"]["built"] == 2 and first["counts"]["served"] == 6
    assert sorted(first["background"]["built"]) == labels(["k2", "k3", "k4", "k5"])
    assert not first["warnings"]
    # k6, k7 and `unused` are in the module, but declared nowhere and never launched.
    assert {n for n, _ in stored_targets(root)} == {f"app_kernels:{n}" for n in declared}


def _helpers_left(root: Path) -> list:
    """Processes of this program's helper (and its workers) still alive."""
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if b"kbuild.zeroconf.background" in cmdline and Path(cwd) == root:
            left.append(int(proc.name))
    return left


def _gone(root: Path) -> bool:
    for _ in range(100):
        if not _helpers_left(root):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("how", ["die", "interrupt"])
def test_a_killed_or_interrupted_program_leaves_no_helper_and_a_consistent_store(edited,
                                                                                   how):
    ended = run(edited, "kbuild", ("k0", "k1", "k2", how, "k3"), env=ON, check=False)
    assert ended["returncode"] != 0
    helper = json.loads((edited / "helper.json").read_text())
    assert helper["pid"] is not None  # the helper was started by k2's compile
    assert _gone(edited)
    # Whatever the helper had committed is whole: every entry served is verified against
    # a fresh compile of its sources, and what is missing is built.
    again = run(edited, "kbuild", LAUNCHED, env={"KBUILD_BACKGROUND": "0", "KBUILD_VERIFY": "1"})
    assert not again["warnings"], again["warnings"]
    assert again["counts"]["served"] == 6 and again["counts"].get("differ", 0) == 0
    assert again["counts"].get("fallback", 0) == 0


def test_unset_the_helper_is_off_below_four_cores_and_each_setting_is_honoured():
    """Left unset, the helper stays off on a small machine (on 2 cores it measured slower
    than compiling in the program); KBUILD_BACKGROUND and `enable(background=...)` say
    otherwise. Run with the process pinned to one core."""
    import subprocess
    import sys

    from support import REPO_ROOT

    script = (
        "import os; os.sched_setaffinity(0, {0})\n"
        "from kbuild.zeroconf import background as b\n"
        "os.environ.pop('KBUILD_BACKGROUND', None)\n"
        "seen = [b.setting(), b.setting(True), b.setting(False), b.setting(3)]\n"
        "for text in ('1', 'on', '0', 'off'):\n"
        "    os.environ['KBUILD_BACKGROUND'] = text\n"
        "    seen.append(b.setting())\n"
        "print(seen)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0, 1, 0, 1, 1, 1, 0, 0]"
