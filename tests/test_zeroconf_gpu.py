"""Zero-config caching on a real GPU (`pytest --gpu`): a program with lazy kernels gives,
under `kbuild.enable()`, what numba's own JIT gives, cold and warm, and a warm run
compiles nothing. Skipped where there is no GPU; tests/test_zeroconf*.py cover the same
path down to the driver call without one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[1]

MATHLIB = """
from numba import cuda


@cuda.jit(device=True)
def poly(v, k):
    return v * v * k + 1.0
"""

KERNELS = """
import numpy as np
from numba import cuda

import mathlib

POINT = np.dtype([("x", np.float32), ("y", np.float32)], align=True)


@cuda.jit
def apply_poly(x, k, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = mathlib.poly(x[i], k)


@cuda.jit
def grid2d(a, out):
    i, j = cuda.grid(2)
    if i < a.shape[0] and j < a.shape[1]:
        out[i, j] = a[i, j] * (i + 1) - j


@cuda.jit
def norms(points, out):
    i = cuda.grid(1)
    if i < points.size:
        out[i] = (points[i].x * points[i].x + points[i].y * points[i].y) ** 0.5


def make_scaler(factor):
    @cuda.jit
    def scale(x, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = x[i] * factor
    return scale


scale3 = make_scaler(3.0)
scale5 = make_scaler(5.0)
"""

APP = """
import json, sys
import numpy as np
from numba import cuda

if sys.argv[1] == "kbuild":
    import kbuild
    kbuild.enable(store=sys.argv[2])
import kernels

rng = np.random.default_rng(7)
n = 4096
x = rng.standard_normal(n).astype(np.float32)
a = rng.standard_normal((64, 48))
pts = np.zeros(n, dtype=kernels.POINT)
pts["x"], pts["y"] = rng.standard_normal(n), rng.standard_normal(n)
outs = {}
for name, kernel, args, shape, dtype in [
        ("poly32", kernels.apply_poly, (x, np.float32(0.5)), n, np.float32),
        ("poly64", kernels.apply_poly, (x.astype(np.float64), 0.25), n, np.float64),
        ("grid2d", kernels.grid2d, (a,), a.shape, np.float64),
        ("norms", kernels.norms, (pts,), n, np.float32),
        ("scale3", kernels.scale3, (x,), n, np.float32),
        ("scale5", kernels.scale5, (x,), n, np.float32)]:
    out = cuda.to_device(np.full(shape, np.nan, dtype=dtype))
    if len(np.shape(np.empty(shape))) == 2:
        kernel[(8, 6), (8, 8)](*args, out)
    else:
        kernel[(n + 127) // 128, 128](*args, out)
    outs[name] = out.copy_to_host()
cuda.synchronize()
np.savez(sys.argv[3], **outs)
counts = {}
if sys.argv[1] == "kbuild":
    from kbuild import zeroconf
    counts = dict(zeroconf.current().counts)
print(json.dumps(counts))
"""


def _program(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in (("mathlib.py", MATHLIB), ("kernels.py", KERNELS), ("app.py", APP)):
        (root / name).write_text(textwrap.dedent(text))
    return root


def _run(root: Path, mode: str, store: Path, out: Path) -> dict:
    import os

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(root)]),
               HOME=str(root), XDG_CACHE_HOME=str(root / ".cache"),
               NUMBA_CACHE_DIR=str(root / "numba-cache"))
    env.pop("KBUILD_ENABLE", None)
    done = subprocess.run([sys.executable, "app.py", mode, str(store), str(out)], cwd=root,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_lazy_kernels_under_enable_match_numbas_jit_cold_and_warm(tmp_path):
    root = _program(tmp_path / "app")
    store = tmp_path / "store"
    _run(root, "jit", store, tmp_path / "jit.npz")
    cold = _run(root, "kbuild", store, tmp_path / "cold.npz")
    warm = _run(root, "kbuild", store, tmp_path / "warm.npz")
    jit, first, second = (np.load(tmp_path / f"{m}.npz") for m in ("jit", "cold", "warm"))
    for name in jit.files:
        assert not np.isnan(first[name]).any(), name  # every element written
        np.testing.assert_allclose(first[name], jit[name], rtol=1e-6, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(second[name], first[name], err_msg=name)
    assert cold.get("built", 0) >= 1, cold
    assert warm.get("built", 0) == 0 and warm.get("fallback", 0) == 0, warm
    assert warm.get("hits", 0) >= 6, warm
