"""Project.load() and launchers: selection, freshness and zero compiles on a warm store.

The simulator must be chosen before numba is imported, so simulator runs
happen in fresh interpreters; the real loader path is checked up to the
driver (no GPU here) in this process.
"""

import json
import shutil
import textwrap

import pytest
from conftest import copy_examples
from support import run


@pytest.fixture(scope="module")
def warm(tmp_path_factory, examples_template):
    """A copy of the examples and a store holding all of them (the session's cold build)."""
    root = tmp_path_factory.mktemp("launch")
    made = examples_template()
    made.copy_to(root, root / "store")
    return root, root / "store"


def _python(root, code, env=None):
    """`python -c code` in `root` (HOME there too)."""
    return run(launcher=("-c", code), cwd=root, home=root, env=env)


def _kbuild(root, store, *args):
    return run(*args, "--store", store, cwd=root, home=root)


def _sim(root, store, body, on_miss="error"):
    code = textwrap.dedent("""
        import json, numpy as np
        from kbuild import Project
        proj = Project.load("kbuild.toml", store=%r, on_miss=%r)
        out = {}
    """ % (str(store), on_miss)) + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    done = _python(root, code, env={"NUMBA_ENABLE_CUDASIM": "1"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_simulator_runs_every_example_like_numpy(warm):
    root, store = warm
    out = _sim(root, store, """
        from examples import saxpy, geometry, closures, elementwise
        x = np.arange(16, dtype=np.float32); y = np.ones(16, np.float32)
        o = np.zeros(16, np.float32)
        proj.kernel("examples.saxpy:saxpy")[2, 8](np.float32(2.0), x, y, o)
        out["saxpy"] = bool(np.allclose(o, saxpy.reference_saxpy(np.float32(2.0), x, y)))
        pts = np.zeros(4, geometry.POINT_DTYPE); pts["x"] = 3; pts["y"] = 4
        n = np.zeros(4, np.float32)
        proj["point_norms"][1, 4](pts, n)
        out["norms"] = n.tolist()
        d = np.zeros(16, np.float64)
        proj["apply_double"][2, 8](x.astype(np.float64), d)
        out["double"] = bool(np.allclose(d, 2 * x))
    """)
    assert out == {"saxpy": True, "norms": [5.0] * 4, "double": True}


def test_signature_mismatch_lists_declared_signatures(warm):
    root, store = warm
    out = _sim(root, store, """
        x = np.zeros(4, np.int32)
        try:
            proj["saxpy"][1, 4](x, x, x, x)
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
    """)
    assert out["error"].startswith("LaunchError: no declared signature of 'examples.saxpy:saxpy'")
    assert "declared: void(float32, float32[::1], float32[::1], float32[::1])" in out["error"]
    assert "array(int32, 1d, C)" in out["error"]


def test_stale_source_is_never_launched(warm, tmp_path):
    root, store = warm
    copy = tmp_path / "proj"
    copy_examples(root, copy)
    store_copy = tmp_path / "store"
    shutil.copytree(store, store_copy)
    mathx = copy / "examples" / "mathx.py"
    mathx.write_text(mathx.read_text().replace("return x * x", "return x * x + 0.0 * x"))
    assert "0.0 * x" in mathx.read_text()
    out = _sim(copy, store_copy, """
        x = np.ones(4, np.float32)
        try:
            proj["square_shift"][1, 4](x, np.zeros(4, np.float32))
        except Exception as exc:
            out["error"] = str(exc)
    """)
    assert "examples.elementwise:square_shift" in out["error"]
    assert "callee examples.mathx:sq changed (body)" in out["error"]


def test_on_miss_build_builds_into_the_store(warm, tmp_path):
    root, _ = warm
    empty = tmp_path / "empty-store"
    out = _sim(root, empty, """
        x = np.arange(4, dtype=np.float32); o = np.zeros(4, np.float32)
        proj["saxpy"][1, 4](np.float32(1.0), x, x, o)
        out["o"] = o.tolist()
    """, on_miss="build")
    assert out["o"] == [0.0, 2.0, 4.0, 6.0]
    status = _kbuild(root, empty, "status", "--json", "saxpy", "--arch", "sm_90")
    assert [r["status"] for r in json.loads(status.stdout)["targets"]] == ["up-to-date"]


def test_warm_store_loads_without_compiling(warm):
    """The real (non-simulator) path up to the driver: no typing, lowering or NVVM."""
    root, store = warm
    code = textwrap.dedent("""
        import json
        import numba.cuda.compiler as C, numba.cuda.cudadrv.nvvm as N
        calls = []
        for mod, name in ((C, "compile_cuda"), (N, "compile_ir")):
            orig = getattr(mod, name)
            setattr(mod, name, lambda *a, _o=orig, **k: calls.append(1) or _o(*a, **k))
        from kbuild import Project
        from kbuild.backend.loader import rebuild_kernel
        proj = Project.load("kbuild.toml", store=%r, on_miss="error")
        result = {}
        for name in ("examples.saxpy:saxpy", "examples.reductions:mirror_sum"):
            launcher = proj.kernel(name)
            sig = next(iter(launcher.resolved.argtypes))
            found = launcher.artifact(sig, "sm_90")
            manifest, cubin = found.manifest, found.binary
            assert (found.arch, found.kind) == ("sm_90", "cubin")
            k = rebuild_kernel(manifest, launcher.resolved.argtypes[sig], cubin, "cubin",
                               (9, 0), launcher.resolved.kernel.targetoptions)
            result[name] = [k.cooperative, bytes(k.library.get_cubin((9, 0, "a")).code) == cubin]
        result["compiles"] = len(calls)
        print(json.dumps(result))
    """ % str(store))
    done = _python(root, code)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"examples.saxpy:saxpy": [False, True],
                      "examples.reductions:mirror_sum": [True, True], "compiles": 0}


@pytest.mark.parametrize("built, device, expected", [
    (("sm_80", "sm_90"), "sm_90", ("sm_90", "cubin")),
    (("sm_80", "sm_90"), "sm_89", ("sm_80", "ptx")),
    (("sm_80", "sm_90"), "sm_120", ("sm_90", "ptx")),
    (("sm_80",), "sm_75", (None, None)),
    # An arch-specific build (numba-cuda's JIT target from 9.0 on) runs on its cc alone.
    (("sm_90a",), "sm_90", ("sm_90a", "cubin")),
    (("sm_90", "sm_90a"), "sm_90", ("sm_90", "cubin")),
    (("sm_80", "sm_90a"), "sm_100", ("sm_80", "ptx")),
    (("sm_90a",), "sm_100", (None, None)),
])
def test_artifact_choice(built, device, expected):
    from kbuild.launch import choose_artifact

    assert choose_artifact(built, device) == expected
