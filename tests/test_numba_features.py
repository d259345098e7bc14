"""numba-cuda features beyond plain device functions: each builds with no driver, and an
edit to what the kernel really depends on rebuilds it (table-driven, real builds).

Also numba-cuda's own test use cases (numba.cuda.tests.cudapy.*_usecases) build as they
are installed, from their module paths.
"""

import json
import textwrap

import pytest
from support import run

MODULES = {
    "overload": ("""
        from numba import cuda
        from numba.cuda.extending import overload

        def clamp01(x):
            pass

        @overload(clamp01, target="cuda")
        def ol_clamp01(x):
            def impl(x):
                return min(max(x, 0.0), 1.0)
            return impl

        @cuda.jit
        def k(a):
            i = cuda.grid(1)
            if i < a.size:
                a[i] = clamp01(a[i])
        """, "void(float32[::1])", ("max(x, 0.0), 1.0)", "max(x, 0.0), 2.0)")),
    "declare_device": ("""
        import os
        from numba import cuda
        HERE = os.path.dirname(__file__)
        mul = cuda.declare_device("mul_f32", "float32(float32, float32)",
                                  link=os.path.join(HERE, "ext.cu"))

        @cuda.jit
        def k(a):
            i = cuda.grid(1)
            if i < a.size:
                a[i] = mul(a[i], a[i])
        """, "void(float32[::1])", None),
    "eager_and_shared": ("""
        from numba import cuda, float32

        @cuda.jit("void(float32[::1])")
        def eager(a):
            a[0] = 1

        @cuda.jit
        def k(a):
            s = cuda.shared.array(32, dtype=float32)
            i = cuda.threadIdx.x
            s[i] = i
            cuda.syncthreads()
            a[i] = s[31 - i] * 2.0
        """, "void(float32[::1])", ("* 2.0", "* 3.0")),
    "extension_type": ("""
        from numba import cuda
        from numba.cuda import cgutils, int32, types
        from numba.cuda.cudaimpl import lower
        from numba.cuda.extending import (core_models, make_attribute_wrapper,
                                          register_model, type_callable)

        class Pair:
            pass

        class PairType(types.Type):
            def __init__(self):
                super().__init__(name="PairType")

        pair_type = PairType()

        @register_model(PairType)
        class PairModel(core_models.StructModel):
            def __init__(self, dmm, fe_type):
                super().__init__(dmm, fe_type, [("x", int32), ("y", int32)])

        make_attribute_wrapper(PairType, "x", "x")

        @type_callable(Pair)
        def type_pair(context):
            def typer(x, y):
                return pair_type
            return typer

        @lower(Pair, types.Integer, types.Integer)
        def lower_pair(context, builder, sig, args):
            obj = cgutils.create_struct_proxy(pair_type)(context, builder)
            obj.x = context.cast(builder, args[0], sig.args[0], int32)
            obj.y = context.cast(builder, args[1], sig.args[1], int32)
            return obj._getvalue()

        @cuda.jit
        def k(out):
            out[0] = Pair(3, 4).x
        """, "void(int32[::1])", ("builder, args[0], sig.args[0]", "builder, args[1], sig.args[1]")),
}
CU = 'extern "C" __device__ int mul_f32(float* r, float a, float b) { *r = a * b; return 0; }\n'


def _project(root, name):
    source, signature, _ = MODULES[name]
    (root / "feat").mkdir(parents=True)
    (root / "feat" / "__init__.py").write_text("")
    (root / "feat" / "ext.cu").write_text(CU)
    (root / "feat" / "m.py").write_text(textwrap.dedent(source))
    (root / "kbuild.toml").write_text(
        f'[project]\narch = ["sm_80"]\n\n[kernels."feat.m:k"]\nsignatures = ["{signature}"]\n')


def _build(root):
    done = run("build", "--json", "-j1", "--store", root / "store", cwd=root, home=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return [row["status"] for row in done.json["targets"]]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_feature_builds_and_its_dependency_edit_rebuilds(tmp_path, name):
    _project(tmp_path, name)
    assert _build(tmp_path) == ["built"]
    assert _build(tmp_path) == ["cached"]
    module = tmp_path / "feat" / "m.py"
    edit = MODULES[name][2]
    if edit is None:  # declare_device: the linked file is what changes
        (tmp_path / "feat" / "ext.cu").write_text(CU.replace("a * b", "a * b + 1.0f"))
    else:
        assert edit[0] in module.read_text()
        module.write_text(module.read_text().replace(*edit))
    assert _build(tmp_path) == ["built"]


USECASES = "numba.cuda.tests.cudapy"
ZERO_D = "Array(int64, 0, 'C')"


def test_numba_cuda_own_cache_use_cases_build(tmp_path):
    """The kernels numba-cuda's cache tests use, built from the installed package."""
    targets = {
        "cache_usecases:add_usecase_kernel": [f"void({ZERO_D}, {ZERO_D}, {ZERO_D})"],
        "cache_usecases:outer_kernel": [f"void({ZERO_D}, {ZERO_D}, {ZERO_D})"],
        "cache_usecases:record_return": [
            "void(Array(packed_record_type, 0, 'C'), packed_record_type[::1], int64)",
            "void(Array(aligned_record_type, 0, 'C'), aligned_record_type[::1], int64)"],
        "cache_usecases:closure1.func": [f"void({ZERO_D}, {ZERO_D})"],
        "cache_usecases:closure2.func": [f"void({ZERO_D}, {ZERO_D})"],
        "cache_usecases:renamed_function1.func": [f"void({ZERO_D}, {ZERO_D})"],
        "cache_usecases:renamed_function2.func": [f"void({ZERO_D}, {ZERO_D})"],
        "cache_usecases:many_locals": ["void()"],
        "cg_cache_usecases:cg_usecase_kernel": [f"void({ZERO_D}, {ZERO_D})"],
    }
    lines = ['[project]', 'arch = ["sm_80"]', '']
    for target, sigs in targets.items():
        lines += [f'[kernels."{USECASES}.{target}"]', f"signatures = {json.dumps(sigs)}", ""]
    (tmp_path / "kbuild.toml").write_text("\n".join(lines))
    done = run("build", "--json", "--store", tmp_path / "store", cwd=tmp_path, home=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = done.json["targets"]
    assert {r["status"] for r in rows} == {"built"} and len(rows) == 10
    keys = {r["target"].rpartition(":")[2]: r["key"] for r in rows}
    # Two functions named ambiguous_function with different bodies; two closures of one factory.
    assert keys["renamed_function1.func"] != keys["renamed_function2.func"]
    assert keys["closure1.func"] != keys["closure2.func"]


OWN_NAMES = '''
import numpy as np
from numba import cuda, from_dtype
from numpy import float32  # not a numba type: numba's float32 stays the signature's

Pair = from_dtype(np.dtype([("a", np.float32), ("b", np.float32)], align=True))
Record = np.dtype([("x", np.int32), ("y", np.float64)], align=True)
Tuple = from_dtype(np.dtype([("lo", np.int16), ("hi", np.int16)]))


@cuda.jit
def k(pairs, records, tuples, scale, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = (pairs[i].a + pairs[i].b + records[i].x + records[i].y
                  + tuples[i].lo + tuples[i].hi) * scale
'''


def test_a_modules_own_types_win_over_numba_types_of_the_same_name(tmp_path, run_kbuild):
    """`Pair`, `Record` and `Tuple` are numba.types members too; in a signature the kernel
    module's own record types are meant (issue 26: "type 'Pair' is not subscriptable")."""
    (tmp_path / "recs").mkdir()
    (tmp_path / "recs" / "__init__.py").write_text("")
    (tmp_path / "recs" / "kern.py").write_text(OWN_NAMES)
    signature = "void(Pair[::1], Record[::1], Tuple[::1], float32, float64[::1])"
    (tmp_path / "kbuild.toml").write_text(
        '[project]\narch = ["sm_80"]\n\n[kernels."recs.kern:k"]\n'
        f'signatures = ["{signature}"]\n')
    result = run_kbuild("build", "--json", cwd=tmp_path, store=tmp_path / "store")
    assert result.returncode == 0, result.stdout + result.stderr
    (row,) = result.json["targets"]
    # Built: the kernel's field reads typed against the module's records, and `float32`
    # (numpy's in the module) named numba's float32.
    assert row["status"] == "built", row["error"]
