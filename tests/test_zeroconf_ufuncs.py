"""Kernels numba makes with `exec` over a copy of the user's module namespace
(`@cuda.guvectorize`, `@cuda.vectorize`) are cached like any other: keyed by their bytecode
(what numba compiles) and the core function they call, which is keyed by its source. A
kernel `exec`'d in a namespace of no module still falls back to numba, saying so."""

from __future__ import annotations

from zeroconf_support import run, write_program

UFUNCS = """\
from numba import cuda


@cuda.guvectorize(["void(float32[:], float32[:])"], "(n)->(n)", target="cuda")
def gscale(x, out):
    for i in range(x.shape[0]):
        out[i] = x[i] * 3
"""

APP = """\
from numba import cuda


def main(device_array, which):
    import ufuncs  # noqa: F401 - the signature is given: numba compiles the kernel now
    namespace = {"cuda": cuda}
    exec("def nowhere(x):\\n    x[0] = 1.0\\n", namespace)
    cuda.jit("void(float32[::1])")(namespace["nowhere"])
"""


def test_a_guvectorize_kernel_is_built_once_served_after_and_rebuilt_when_its_core_changes(
        tmp_path):
    root = write_program(tmp_path / "prog", app=APP, ufuncs=UFUNCS)
    env = {"KBUILD_STORE": tmp_path / "store"}
    first = run(root, "kbuild", env=env)
    assert first["counts"]["built"] == 1 and first["counts"]["served"] == 1, first
    assert [s[:2] for s in first["served"]] == \
        [["ufuncs:__gufunc_gscale", "void(float32[:, :], float32[:, :])"]]
    (nowhere,) = first["warnings"]  # exec'd in a namespace of no module: numba's compile
    assert "nowhere is compiled by numba, not cached" in nowhere and "no source file" in nowhere

    second = run(root, "kbuild", env=env)
    assert second["counts"].get("built", 0) == 0 and second["counts"]["hits"] == 1, second

    (root / "ufuncs.py").write_text(UFUNCS.replace("x[i] * 3", "x[i] * 4"))
    edited = run(root, "kbuild", env=env)
    assert edited["counts"]["built"] == 1 and edited["counts"].get("hits", 0) == 0, edited
