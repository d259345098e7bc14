"""Kernels numba makes with `exec` over a copy of the user's module namespace
(`@cuda.guvectorize`, `@cuda.vectorize`) are cached like any other: keyed by their bytecode
(what numba compiles) and the core function they call, which is keyed by its source. A
kernel `exec`'d in a namespace of no module still falls back to numba, saying so."""

from __future__ import annotations

import json
import subprocess
import sys

from zeroconf_support import env_for

UFUNCS = """\
from numba import cuda


@cuda.guvectorize(["void(float32[:], float32[:])"], "(n)->(n)", target="cuda")
def gscale(x, out):
    for i in range(x.shape[0]):
        out[i] = x[i] * 3
"""

PROGRAM = """\
import json, sys, warnings
import kbuild
from kbuild.backend import compiler, fakedriver

with fakedriver.installed((8, 0), record=False), compiler.targeting((8, 0)):
    session = kbuild.enable(store=sys.argv[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import ufuncs  # the signature is given: numba compiles the kernel at import
        from numba import cuda
        namespace = {"cuda": cuda}
        exec("def nowhere(x):\\n    x[0] = 1.0\\n", namespace)
        cuda.jit("void(float32[::1])")(namespace["nowhere"])
    print(json.dumps({"counts": dict(session.counts),
                      "served": [s[:2] for s in session.served],
                      "warnings": [str(w.message) for w in caught
                                   if "kbuild" in str(w.message)]}))
"""


def _run(root) -> dict:
    done = subprocess.run([sys.executable, "program.py", str(root / "store")], cwd=root,
                          env=env_for(root), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_guvectorize_kernel_is_built_once_served_after_and_rebuilt_when_its_core_changes(
        tmp_path):
    (tmp_path / "ufuncs.py").write_text(UFUNCS)
    (tmp_path / "program.py").write_text(PROGRAM)
    first = _run(tmp_path)
    assert first["counts"]["built"] == 1 and first["counts"]["served"] == 1, first
    assert first["served"] == [["ufuncs:__gufunc_gscale", "void(float32[:, :], float32[:, :])"]]
    (nowhere,) = first["warnings"]  # exec'd in a namespace of no module: numba's compile
    assert "nowhere is compiled by numba, not cached" in nowhere and "no source file" in nowhere

    second = _run(tmp_path)
    assert second["counts"].get("built", 0) == 0 and second["counts"]["hits"] == 1, second

    (tmp_path / "ufuncs.py").write_text(UFUNCS.replace("x[i] * 3", "x[i] * 4"))
    edited = _run(tmp_path)
    assert edited["counts"]["built"] == 1 and edited["counts"].get("hits", 0) == 0, edited
