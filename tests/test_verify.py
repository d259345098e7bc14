"""`kbuild build --verify`, `kbuild verify` and KBUILD_VERIFY: what the store serves,
rebuilt from source and compared byte for byte.

The project's `@overload` reads an environment variable through C (`getenv` from a libc
loaded at import, called at typing time): a channel no key can list. Changing the variable leaves the key as it
was, so a plain build serves the old binary; verifying rebuilds it, reports it, replaces
the entry, and exits 1.
"""

from __future__ import annotations

import textwrap

import pytest

from support import run as run_process

EXT = '''
import ctypes

from numba.extending import overload


def gain(x):
    return x


# Loaded at import (loading a C library while compiling fails the target: its reads are
# unseen) and kept where keys do not look (a library module's attribute); called at
# typing time, it reads the environment through C: no os.environ access kbuild could
# observe.
ctypes.kb_test_libc = ctypes.CDLL(None)
ctypes.kb_test_libc.getenv.restype = ctypes.c_char_p


def _gain_from_c():
    return float(ctypes.kb_test_libc.getenv(b"KB_GAIN") or b"2.0")


@overload(gain)
def _ol_gain(x):
    g = _gain_from_c()

    def impl(x):
        return x * g
    return impl
'''

KERNELS = '''
from numba import cuda

from ext import gain


@cuda.jit
def scaled(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = gain(x[i])


@cuda.jit
def shifted(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = x[i] + 1.0
'''

TOML = '''
[project]
name = "vf"
paths = ["."]
arch = ["sm_80"]

[kernels."kern:scaled"]
signatures = ["void(float32[::1], float32[::1])"]

[kernels."kern:shifted"]
signatures = ["void(float32[::1], float32[::1])"]
'''


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "ext.py").write_text(textwrap.dedent(EXT))
    (root / "kern.py").write_text(textwrap.dedent(KERNELS))
    (root / "kbuild.toml").write_text(textwrap.dedent(TOML))
    return root


def _run(project, *args, gain, env=None):
    return run_process(*args, "--json", cwd=project, home=project.parent / "home",
                       store=project.parent / "store", env={"KB_GAIN": gain, **(env or {})})


def _rows(result):
    return {r["target"]: r for r in result.json["targets"]}


def test_verify_catches_what_no_key_lists_and_replaces_it(project, tmp_path):
    assert _run(project, "build", gain="2.0").returncode == 0
    stale = _run(project, "build", gain="3.0")
    assert stale.returncode == 0 and _rows(stale)["kern:scaled"]["status"] == "cached"

    checked = _run(project, "build", "--verify", gain="3.0")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    row = _rows(checked)["kern:scaled"]
    assert row["status"] == "failed" and row["verified"] == "differs"
    assert row["error"].startswith("stale: the cached ptx and cubin differ from a fresh build")
    assert _rows(checked)["kern:shifted"]["verified"] == "same"
    assert checked.json["summary"]["verified"] == 2 and checked.json["summary"]["differ"] == 1

    # The entry is now what a fresh store builds for today's value, and checks out.
    again = _run(project, "verify", gain="3.0")
    assert again.returncode == 0, again.stdout + again.stderr
    assert {r["verified"] for r in again.json["targets"]} == {"same"}
    fresh = run_process("build", "--json", cwd=project, home=tmp_path / "home2",
                        store=tmp_path / "fresh-store", env={"KB_GAIN": "3.0"})
    assert _rows(fresh)["kern:scaled"]["artifacts"] == _rows(again)["kern:scaled"]["artifacts"]


def test_kbuild_verify_env_checks_a_build_and_verify_samples(project):
    assert _run(project, "build", gain="2.0").returncode == 0
    by_env = _run(project, "build", gain="5.0", env={"KBUILD_VERIFY": "1"})
    assert by_env.returncode == 1
    assert _rows(by_env)["kern:scaled"]["verified"] == "differs"
    assert by_env.json["mode"]["used"] == "full"  # verifying keys every target

    half = _run(project, "verify", "--sample", "50%", gain="5.0")
    assert half.returncode == 0 and half.json["summary"]["verified"] == 1


def test_verify_says_what_it_cannot_do(project):
    nothing = _run(project, "verify", gain="2.0")
    assert nothing.returncode == 0
    assert {r["status"] for r in nothing.json["targets"]} == {"skipped"}
    assert "nothing to verify" in nothing.json["targets"][0]["error"]
    bad = _run(project, "build", "--verify=150%", gain="2.0")
    assert bad.returncode == 2 and "from 1% to 100%" in bad.json["error"]


ZC_KERNELS = '''\
from numba import cuda

from ext import gain


@cuda.jit
def scale(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = gain(x[i])


@cuda.jit
def shift(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] + 1.0
'''


def test_kbuild_verify_under_zero_config_never_launches_what_differs(tmp_path):
    """KBUILD_VERIFY=1: each kernel served from the store is rebuilt before its launch;
    one whose bytes differ is replaced, and the fresh build is what is loaded."""
    import zeroconf_support as zc

    root = zc.write_program(tmp_path / "prog", kernels=ZC_KERNELS, ext=textwrap.dedent(EXT))
    store = {"store": str(tmp_path / "store")}
    first = zc.run(root, "kbuild", enable=store, env={"KB_GAIN": "2.0"})
    assert first["counts"]["built"] == 2
    fresh = zc.run(root, "kbuild", enable={"store": str(tmp_path / "fresh")},
                   env={"KB_GAIN": "3.0"})
    stale = zc.run(root, "kbuild", enable=store, env={"KB_GAIN": "3.0"})
    assert stale["counts"]["hits"] == 2 and stale["loads"] != fresh["loads"]  # no key saw it

    checked = zc.run(root, "kbuild", enable=store, env={"KB_GAIN": "3.0", "KBUILD_VERIFY": "1"})
    assert checked["counts"]["verified"] == 2 and checked["counts"]["differ"] == 1
    assert checked["loads"] == fresh["loads"]  # the fresh build launched, never the stale one
    assert any("differs from a fresh build" in w for w in checked["warnings"])
    after = zc.run(root, "kbuild", enable=store, env={"KB_GAIN": "3.0"})
    assert after["loads"] == fresh["loads"] and after["counts"].get("built", 0) == 0
