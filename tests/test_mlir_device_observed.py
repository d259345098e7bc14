"""numba-cuda-mlir's device-function paths are observed as numba-cuda's are.

A device function numba-cuda-mlir compiled earlier in the process (kept per argument
types, reused by a later kernel's compile), and an eager one (`@cuda.jit("sig",
device=True)`, compiled at import and never again), ran an overload that reads a
constant by computed name. Each case edits that constant in a copy of the built project,
builds incrementally against a copy of the store and afresh into an empty store (-j1: every
kernel compiles in one process, after the eager import): no target is served `cached`
with other bytes than the fresh build's, and exactly the kernels whose device function
read the constant rebuild.

numba-cuda-mlir 0.6.0 types a callee's body again in each caller's compile, eager or kept,
inlined or not: what hid the read was its typing templates' kept overload result
(`_overload_result_cache`), which the eager import made. Its device-function compile and
call paths are hooked too (the same mechanism as numba-cuda's): these cases guard them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from editmatrix_support import build, copy_tree, fresh_checkout, reference, short
from mlir_support import needs_mlir
from support import WARM_MLIR

pytestmark = needs_mlir

CONFIG = '''\
[project]
name = "devobs"
backend = "numba-cuda-mlir"
paths = ["."]
arch = ["sm_80"]
''' + "".join(f'\n[kernels."dv.kernels:{k}"]\nsignatures = ["void(float32[::1])"]\n'
              for k in ("k_dev_eager", "k_dev_eager_callee", "k_kept_a", "k_kept_b",
                        "k_kept_c", "k_kept_d"))

EXT = '''\
import importlib

from numba_cuda_mlir import cuda
from numba_cuda_mlir.numba_cuda.extending import overload


def read(name):
    return getattr(importlib.import_module("dv.consts"), "".join(name))  # by computed name


def scaled(x):
    pass


@overload(scaled)
def ol_scaled(x):
    v = read(("SC", "ALE"))
    return lambda x: x * v


def shifted(x):
    pass


@overload(shifted)
def ol_shifted(x):
    v = read(("OFF", "SET"))
    return lambda x: x + v


# Compiled when the module is imported (an eager signature): its compile typed `scaled`.
# A small one is inlined in numba IR (typed again in each caller); one never inlined is
# a callee whose code numba-cuda-mlir never compiles again.
@cuda.jit("float32(float32)", device=True)
def dev_eager(x):
    return scaled(x) + 2.0


@cuda.jit("float32(float32)", device=True, inline="never")
def dev_eager_callee(x):
    return scaled(x) + 4.0


# Compiled for k_kept_a and kept: k_kept_b's compile reuses it (and the answer the
# eager import made for `scaled`).
@cuda.jit(device=True)
def dev_kept(x):
    return scaled(x) + 1.0


# Never inlined in numba IR (a small device function is, and is typed again in each
# caller): compiled as a callee first for k_kept_c and kept for k_kept_d.
@cuda.jit(device=True, inline="never")
def dev_shifted(x):
    return shifted(x) * 2.0
'''

KERNELS = '''\
from numba_cuda_mlir import cuda

from .ext import dev_eager, dev_eager_callee, dev_kept, dev_shifted


@cuda.jit
def k_dev_eager(a):
    a[0] = dev_eager(a[0])


@cuda.jit
def k_dev_eager_callee(a):
    a[0] = dev_eager_callee(a[0])


@cuda.jit
def k_kept_a(a):
    a[0] = dev_kept(a[0])


@cuda.jit
def k_kept_b(a):
    a[0] = dev_kept(a[0]) * 3.0


@cuda.jit
def k_kept_c(a):
    a[0] = dev_shifted(a[0])


@cuda.jit
def k_kept_d(a):
    a[0] = dev_shifted(a[0]) - 1.0
'''

FILES = {"kbuild.toml": CONFIG, "dv/__init__.py": "", "dv/ext.py": EXT,
         "dv/kernels.py": KERNELS, "dv/consts.py": "SCALE = 2.0\nOFFSET = 0.5\n"}
ALL = {"k_dev_eager", "k_dev_eager_callee", "k_kept_a", "k_kept_b", "k_kept_c", "k_kept_d"}


def _write(project: Path) -> Path:
    for name, text in FILES.items():
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return project


def _rows(result: dict) -> dict:
    return {short(r["target"]): r for r in result["targets"]}


def _ptx(result: dict) -> dict:
    return {t: (r["artifacts"] or {}).get("ptx") for t, r in _rows(result).items()}


def _with_status(result: dict, status: str) -> set:
    return {t for t, r in _rows(result).items() if r["status"] == status}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    where = tmp_path_factory.mktemp("devobs")
    result = build(_write(where / "proj"), where / "store", "-j1")
    assert _with_status(result, "built") == ALL, [r["error"] for r in result["targets"]]
    return where, result


@pytest.mark.parametrize("old, new, rebuilt", [
    ("SCALE = 2.0", "SCALE = 2.5",
     {"k_dev_eager", "k_dev_eager_callee", "k_kept_a", "k_kept_b"}),
    # A guard: numba-cuda-mlir 0.6.0 types a kept callee's body again in each caller
    # (its overloads' hooks see that), so this case held before the callee path was hooked.
    ("OFFSET = 0.5", "OFFSET = 0.75", {"k_kept_c", "k_kept_d"}),
], ids=["read-by-eager-and-kept-device-functions", "read-by-a-kept-device-function"])
def test_incremental_matches_fresh(baseline, tmp_path, old, new, rebuilt):
    where, before = baseline
    project = fresh_checkout(where / "proj", tmp_path)
    copy_tree(where / "store", tmp_path / "store")
    consts = project / "dv" / "consts.py"
    consts.write_text(consts.read_text().replace(old, new))
    incremental = build(project, tmp_path / "store", "-j1")
    fresh = reference(project, tmp_path / "fresh-store", warm=WARM_MLIR)
    now, clean = _ptx(incremental), _ptx(fresh)
    stale = {t for t in _with_status(incremental, "cached") if now[t] != clean[t]}
    assert not stale, f"stale binaries served for {sorted(stale)}"
    assert _with_status(incremental, "built") == rebuilt
    assert {t for t in ALL if now[t] != _ptx(before)[t]} == rebuilt


# -- under zero configuration (test_zeroconf_mlir's program, its kernel calling an eager
# device function whose overload reads a constant by computed name) -------------------------

ZK = '''\
import importlib

from numba_cuda_mlir import cuda
from numba_cuda_mlir.numba_cuda.extending import overload


def scaled(x):
    pass


@overload(scaled)
def ol_scaled(x):
    v = getattr(importlib.import_module("zconsts"), "SC" + "ALE")
    return lambda x: x * v


@cuda.jit("float32(float32)", device=True)
def dev_eager(x):
    return scaled(x) + 2.0


@cuda.jit
def saxpy(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * dev_eager(x[i]) + y[i]
'''


def _program(root: Path, store: Path, tmp: Path) -> dict:
    """test_zeroconf_mlir's program, importing its kernels where no driver is asked (an
    eager device function compiles at import, for the pinned arch)."""
    import test_zeroconf_mlir as zc
    from support import run

    program = zc.PROGRAM.replace("\nimport zk\n", "\nfrom kbuild.backend.mlir.nodriver "
                                 "import pinned_target as _pin\nwith _pin((9, 0)):\n"
                                 "    import zk\n")
    assert program != zc.PROGRAM
    done = run(str(store), "build", cwd=root, home=tmp / "home", launcher=("-c", program))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_zero_config_rebuilds_when_an_eager_device_function_read_changes(tmp_path):
    root = tmp_path / "prog"
    (root / "app").mkdir(parents=True)
    (root / "app" / "zk.py").write_text(ZK)
    consts = root / "app" / "zconsts.py"
    consts.write_text("SCALE = 2.0\n")
    store = tmp_path / "store"
    first = _program(root, store, tmp_path)
    assert first["counts"] == {"built": 1, "served": 1}
    consts.write_text("SCALE = 2.5\n")
    edited = _program(root, store, tmp_path)
    fresh = _program(root, tmp_path / "fresh", tmp_path)
    assert edited["cubin"] == fresh["cubin"] != first["cubin"]
    assert edited["counts"] == {"built": 1, "served": 1}
