"""The failures that started kbuild (PRODUCT.md), each as a named test, plus their mirror
images: things that must stay distinct do.

Builds run the real CLI on copies of tests/editproj; the "distinct" checks key
small modules written to a temp directory, in this process (keying is pure).
"""

from __future__ import annotations

import itertools
import sys
import textwrap

import numba
import numpy as np
import pytest

from editmatrix_support import (
    ALL, build, checkout, load_module, make_baseline, manifest, replace, run_kbuild, target_key,
    with_status,
)

F32_ARRAY = numba.float32[::1]
_names = itertools.count()


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, editproj_template):
    return make_baseline(tmp_path_factory.mktemp("baseline"), editproj_template)


def _row(result, short_name):
    (row,) = [r for r in result["targets"] if r["target"].endswith(":" + short_name)]
    return row


def _inputs(store, key) -> dict:
    return {tuple(path): text for path, text, _ in manifest(store, key)["inputs"]}


# -- the five failures ------------------------------------------------------------------

def test_cross_file_callee_edit_rebuilds_the_kernel(baseline, tmp_path):
    """numba #1833 / #9483: `cache=True` checks only the kernel's own file's timestamp."""
    project, store = checkout(baseline, tmp_path)
    before = _row(baseline[2], "k_sq")
    replace("lab/mathx.py", "def sq(x):\n    return x * x\n",
            "def sq(x):\n    return x * x + 1\n")(project)
    after = _row(build(project, store), "k_sq")
    assert after["status"] == "built"
    assert after["key"] != before["key"]
    assert after["artifacts"]["ptx"] != before["artifacts"]["ptx"]
    again = build(project, store)
    assert _row(again, "k_sq")["status"] == "cached"
    assert with_status(again, "built") == set()


def test_grid_sync_kernel_builds_caches_and_rebuilds_as_cooperative(baseline, tmp_path):
    """numba 0.59 #9432 (fixed by #9447): a cached grid-sync kernel lost its cooperative launch."""
    project, store = checkout(baseline, tmp_path)
    first = _row(baseline[2], "k_coop")
    assert first["status"] == "built"
    assert manifest(store, first["key"])["cooperative"] is True
    cached = _row(build(project, store), "k_coop")
    assert (cached["status"], cached["key"]) == ("cached", first["key"])
    assert manifest(store, cached["key"])["cooperative"] is True
    replace("lab/coop.py", "data[i] *= 2", "data[i] *= 3")(project)
    rebuilt = _row(build(project, store), "k_coop")
    assert rebuilt["status"] == "built" and rebuilt["key"] != first["key"]
    entry = manifest(store, rebuilt["key"])
    assert entry["cooperative"] is True
    ptx = run_ptx(project, store, entry["artifacts"]["ptx"])
    assert "cudaCGGetIntrinsicHandle" in ptx and "cudaCGSynchronize" in ptx


def run_ptx(project, store, blob: str) -> str:
    from support import run

    proc = run("cat", blob, "--store", store, cwd=project.parent, home=project.parent / "home",
               bytecode=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_kernel_omitting_a_default_argument_builds(baseline):
    """numba #10006: `shift(x)` with `def shift(x, delta=1.0)` must compile, and key the default."""
    _, store, result = baseline
    row = _row(result, "k_shift")
    assert row["status"] == "built" and row["error"] is None
    inputs = _inputs(store, row["key"])
    assert inputs[("target", "kernel lab.kernels:k_shift", "callee lab.mathx:shift",
                   "default #1")] == "1.0"


def test_struct_array_keys_are_equal_across_processes(baseline, tmp_path):
    """NVIDIA Warp #287: `<Struct object at 0x...>` in a hash recompiled every run."""
    project, store = checkout(baseline, tmp_path)
    keys = {}
    for seed in ("11", "12"):
        rows = run_kbuild(project, store, "status", "k_points", "k_origin",
                          env_extra={"PYTHONHASHSEED": seed})["targets"]
        assert [r["status"] for r in rows] == ["up-to-date", "up-to-date"]
        keys[seed] = [r["key"] for r in rows]
    assert keys["11"] == keys["12"] == [_row(baseline[2], "k_points")["key"],
                                        _row(baseline[2], "k_origin")["key"]]
    for key in keys["11"]:
        assert not any("0x" in text for text in _inputs(store, key).values())


def test_recreated_equal_closures_hit_the_cache(baseline, tmp_path):
    """JAX/Equinox #686: `make_scaler(2.0)` made again in a new process is the same key."""
    project, store = checkout(baseline, tmp_path)
    result = build(project, store, env_extra={"PYTHONHASHSEED": "21"})
    assert with_status(result, "cached") == ALL
    assert _row(result, "k_double")["key"] == _row(baseline[2], "k_double")["key"]


def test_recreated_equal_closures_key_equal_in_one_process(tmp_path):
    module = _module(tmp_path, SCALERS)
    one = target_key(module.make_kernel(2.0), "m:k", [F32_ARRAY], [tmp_path])
    two = target_key(module.make_kernel(2.0), "m:k", [F32_ARRAY], [tmp_path])
    assert one.digest == two.digest


# -- distinct things stay distinct --------------------------------------------------------

SCALERS = """
    from numba import cuda


    def make_scaler(factor):
        @cuda.jit(device=True)
        def scale(x):
            return x * factor
        return scale


    def make_kernel(factor):
        scale = make_scaler(factor)

        @cuda.jit
        def k(x):
            x[0] = scale(x[0])
        return k


    double, triple = make_scaler(2.0), make_scaler(3.0)


    @cuda.jit
    def both(x):
        x[0] = double(x[0]) + triple(x[0])


    @cuda.jit
    def both_swapped(x):
        x[0] = triple(x[0]) + double(x[0])
"""


def _module(tmp_path, source: str):
    name = f"kbuild_seed_{next(_names)}"
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    try:
        return load_module(path, name)
    except Exception:
        sys.modules.pop(name, None)
        raise


def test_closures_from_one_factory_with_different_values_get_different_keys(tmp_path):
    module = _module(tmp_path, SCALERS)
    two = target_key(module.make_kernel(2.0), "m:k", [F32_ARRAY], [tmp_path])
    three = target_key(module.make_kernel(3.0), "m:k", [F32_ARRAY], [tmp_path])
    assert two.digest != three.digest


def test_two_closures_reached_by_one_kernel_are_both_keyed(tmp_path):
    """`double` and `triple` share a qualified name; each is keyed under its own name."""
    module = _module(tmp_path, SCALERS)
    node = target_key(module.both, "m:both", [F32_ARRAY], [tmp_path])
    labels = {path[2] for path, _, _ in node.flatten() if len(path) == 3}
    callee = f"callee {module.__name__}:make_scaler.<locals>.scale"
    assert {f"{callee} (as double)", f"{callee} (as triple)"} <= labels


def test_same_name_redefined_in_one_module_gets_different_keys(tmp_path):
    """`helper` and `k` each defined twice in one file: each version keys its own body."""
    from kbuild.backend.objectmodel import NUMBA_CUDA
    from kbuild.keying.keyer import Keyer
    from kbuild.sources import ProjectSources

    module = _module(tmp_path, """
        from numba import cuda


        @cuda.jit(device=True)
        def helper(x):
            return x + 1.0


        @cuda.jit
        def k(x):
            x[0] = x[0] + 1.0


        first_helper, first_k = helper, k


        @cuda.jit(device=True)
        def helper(x):
            return x + 2.0


        @cuda.jit
        def k(x):
            x[0] = x[0] + 2.0
    """)
    label = f"callee {module.__name__}:helper"
    one, two = (Keyer(ProjectSources([str(tmp_path)]), NUMBA_CUDA).function_node(f, label, "test")
                for f in (module.first_helper, module.helper))
    assert (one.label, one.summary) == (two.label, two.summary)
    assert one.digest != two.digest
    assert target_key(module.first_k, "m:k", [F32_ARRAY], [tmp_path]).digest \
        != target_key(module.k, "m:k", [F32_ARRAY], [tmp_path]).digest


def test_same_name_from_exec_of_two_sources_gets_different_keys(tmp_path):
    """Two versions of `def k` exec'd under one file name (no source to read: bytecode)."""
    from numba import cuda

    kernels = []
    for body in ("x[0] = x[0] + 1.0", "x[0] = x[0] + 2.0"):
        scope = {"cuda": cuda}
        code = compile(f"@cuda.jit\ndef k(x):\n    {body}\n", "<generated>", "exec")
        exec(code, scope)  # noqa: S102 - the point of the test
        kernels.append(scope["k"])
    one, two = (target_key(k, "gen:k", [F32_ARRAY], [tmp_path]) for k in kernels)
    assert one.digest != two.digest
    assert dict((p, t) for p, t, _ in one.flatten())[("target", "kernel gen:k", "body")] == "bytecode"


def test_same_factory_name_with_different_bodies_gets_different_keys(tmp_path):
    module = _module(tmp_path, """
        from numba import cuda


        def make(kind):
            if kind == "add":
                @cuda.jit
                def k(x):
                    x[0] = x[0] + 1.0
            else:
                @cuda.jit
                def k(x):
                    x[0] = x[0] * 2.0
            return k
    """)
    add, mul = (target_key(module.make(kind), "m:k", [F32_ARRAY], [tmp_path])
                for kind in ("add", "mul"))
    assert add.digest != mul.digest


def test_packed_and_aligned_records_get_different_keys():
    """Same fields at the same offsets; only the size and the aligned flag differ."""
    from kbuild.backend.objectmodel import NUMBA_CUDA
    from kbuild.keying.keyer import signature_node

    fields = [("x", np.float32), ("y", np.float32), ("tag", np.uint8)]
    aligned = numba.from_dtype(np.dtype(fields, align=True))
    packed = numba.from_dtype(np.dtype(fields, align=False))
    assert [f.offset for f in aligned.fields.values()] == [f.offset for f in packed.fields.values()]
    def key(argtypes):
        return signature_node(argtypes, "s", NUMBA_CUDA).digest

    assert key((aligned[::1],)) != key((packed[::1],))
    assert key((aligned,)) != key((packed,))


def test_swapped_callee_names_get_different_keys(tmp_path):
    """`double(x) + triple(x)` vs `triple(x) + double(x)` after swapping what the names mean."""
    module = _module(tmp_path, SCALERS)
    before = target_key(module.both, "m:both", [F32_ARRAY], [tmp_path])
    module.double, module.triple = module.triple, module.double
    after = target_key(module.both, "m:both", [F32_ARRAY], [tmp_path])
    assert before.digest != after.digest


def test_source_edited_after_import_never_passes_for_the_loaded_code(tmp_path):
    """A long-lived process (Project.load() in a notebook) imported v1; the file now says v2.

    inspect reads v2 from disk, numba would compile v1's bytecode: the key must
    not be v2's key, or v1's binary would be stored where every fresh process finds it.
    """
    source = """
        from numba import cuda


        @cuda.jit
        def k(x):
            x[0] = x[0] * 2.0
    """
    module = _module(tmp_path, source)
    path = module.__file__
    with open(path, "w") as fh:
        fh.write(textwrap.dedent(source).replace("* 2.0", "* 3.0"))
    stale = target_key(module.k, "m:k", [F32_ARRAY], [tmp_path])
    fresh_module = load_module(path, module.__name__)
    fresh = target_key(fresh_module.k, "m:k", [F32_ARRAY], [tmp_path])
    assert stale.digest != fresh.digest
