"""Denormal inputs on a real GPU (`pytest --gpu`): kbuild's binaries give numba's JIT's
results bit for bit, for every option of the equivalence matrix (fastmath True, fastmath
flags, opt, max_registers, lineinfo, debug), through `kbuild build` + `Project.load()` and
through `kbuild.enable()`, cold and warm.

tests/test_equivalence.py checks the same kernels' PTX against numba's without a GPU (the
float instruction variants: `.ftz`, rounding, `.approx`); this is the check by results,
where a lost flush-to-zero shows as a denormal that numba's binary flushes and ours keeps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from support import run
from test_equivalence import FORMS, SIGNATURES, SUFFIXES, _matrix_project

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[1]


def _device_arch() -> str:
    from numba import cuda

    major, minor = cuda.get_current_device().compute_capability
    return f"sm_{major}{minor}"


def _inputs(dtype) -> np.ndarray:
    """Denormals of both signs and sizes, their neighbours, zeros, normals and random."""
    info = np.finfo(dtype)
    tiny, smallest = info.tiny, info.smallest_subnormal
    special = [smallest, -smallest, smallest * 3, tiny / 2, -tiny / 2, tiny / 1024,
               tiny * (1 - info.eps), tiny, -tiny, tiny * 2, 0.0, -0.0, 1.0, 2.5, 1e-30,
               np.float32(1e-39), np.float32(-1e-40)]
    rng = np.random.default_rng(3)
    n = 1024 - len(special)
    scaled = rng.standard_normal(n) * tiny * rng.uniform(0, 2, n)
    return np.concatenate([np.array(special, dtype), scaled.astype(dtype)]).astype(dtype)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _names():
    return [(f"eq.forms:{base}_{suffix}", base) for suffix in SUFFIXES for base in SIGNATURES]


def _launch(kernel, x) -> np.ndarray:
    from numba import cuda

    out = cuda.to_device(np.full_like(x, np.nan))
    kernel[(x.size + 127) // 128, 128](cuda.to_device(x), out)
    cuda.synchronize()
    return out.copy_to_host()


def test_built_fastmath_kernels_match_numbas_jit_bitwise_on_denormals(tmp_path):
    from kbuild import Project

    arch = _device_arch()
    project, _ = _matrix_project(tmp_path)
    toml = project / "kbuild.toml"
    toml.write_text(toml.read_text().replace('arch = ["sm_90"]', f'arch = ["{arch}"]'))
    home, store = tmp_path / "home", tmp_path / "store"
    built = run("build", "--json", cwd=project, home=home, store=store)
    assert built.returncode == 0, built.stdout + built.stderr
    proj = Project.load(toml, store=store, on_miss="error")
    proj.plan()  # the project's roots on sys.path: `eq.forms` imports
    import importlib

    forms = importlib.import_module("eq.forms")
    differ, flushed = [], 0
    for name, base in _names():
        dtype = np.float64 if base == "doubles" else np.float32
        x = _inputs(dtype)
        ours = _launch(proj.kernel(name), x)
        theirs = _launch(getattr(forms, name.partition(":")[2]), x)  # numba's own JIT
        if not np.array_equal(_bits(ours), _bits(theirs)):
            bad = np.flatnonzero(_bits(ours) != _bits(theirs))
            differ.append((name, [(float(x[i]), float(ours[i]), float(theirs[i]))
                                  for i in bad[:4]], len(bad)))
        if "fast" in name and base != "doubles":
            flushed += int(np.sum((ours == 0) & (x != 0)))
    assert [name for name, _, _ in differ] == [], differ
    assert flushed > 0  # the inputs do reach flush-to-zero in the fastmath kernels


APP = """
import json, sys
import numpy as np
from numba import cuda

if sys.argv[1] == "kbuild":
    import kbuild
    kbuild.enable(store=sys.argv[2])
from eq import forms

x32 = np.load(sys.argv[4])
x64 = np.load(sys.argv[5])
outs = {}
for name in json.loads(sys.argv[6]):
    kernel = getattr(forms, name)
    x = x64 if name.startswith("doubles") else x32
    out = cuda.to_device(np.full_like(x, np.nan))
    kernel[(x.size + 127) // 128, 128](cuda.to_device(x), out)
    outs[name] = out.copy_to_host()
cuda.synchronize()
np.savez(sys.argv[3], **outs)
counts = {}
if sys.argv[1] == "kbuild":
    from kbuild import zeroconf
    counts = dict(zeroconf.current().counts)
print(json.dumps(counts))
"""


def test_enabled_fastmath_kernels_match_numbas_jit_bitwise_on_denormals(tmp_path):
    root = tmp_path / "app"
    (root / "eq").mkdir(parents=True)
    (root / "eq" / "__init__.py").write_text("")
    (root / "eq" / "forms.py").write_text(textwrap.dedent(FORMS))
    (root / "app.py").write_text(textwrap.dedent(APP))
    np.save(root / "x32.npy", _inputs(np.float32))
    np.save(root / "x64.npy", _inputs(np.float64))
    names = [name.partition(":")[2] for name, _ in _names()]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(root)]),
               HOME=str(root), XDG_CACHE_HOME=str(root / ".cache"))
    env.pop("KBUILD_ENABLE", None)

    def program(mode, out):
        done = subprocess.run([sys.executable, "app.py", mode, str(tmp_path / "store"),
                               str(tmp_path / out), "x32.npy", "x64.npy", json.dumps(names)],
                              cwd=root, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    program("jit", "jit.npz")
    cold = program("kbuild", "cold.npz")
    warm = program("kbuild", "warm.npz")
    jit, first, second = (np.load(tmp_path / f"{m}.npz") for m in ("jit", "cold", "warm"))
    for name in names:
        assert np.array_equal(_bits(first[name]), _bits(jit[name])), name
        assert np.array_equal(_bits(second[name]), _bits(jit[name])), name
    assert cold.get("built", 0) >= 1, cold
    assert warm.get("built", 0) == 0 and warm.get("fallback", 0) == 0, warm
