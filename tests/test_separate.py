"""Separate compilation: device functions as LTO-IR objects, kernels relinked on a callee edit.

Every test compares against the ground truth a cold build in an empty store gives:
a relinked target must have exactly the artifacts a fresh build makes.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from conftest import blob_bytes, blob_files, entry_files
from support import NVVM_COMPILE, counting, counts
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

HELPERS = '''
from numba import cuda


@cuda.jit(device=True)
def shared(x):
    return x * 2.0 + 1.0


@cuda.jit(device=True)
def inner(x):
    return x - 0.5


@cuda.jit(device=True)
def outer(x):
    return inner(x) * 3.0


@cuda.jit(device=True, inline="always")
def inlined(x):
    return x + 4.0


@cuda.jit(device=True)
def typed(x):
    return x * 2.0
'''

KERNELS = '''
from numba import cuda

from pkg import helpers
from pkg.helpers import inlined, outer, shared


def _body(name, expr):
    return f"""
@cuda.jit{'(lineinfo=True)' if name == 'k_lineinfo' else ''}
def {name}(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = {expr}
"""


for _name, _expr in [("k_shared_a", "shared(x[i])"), ("k_shared_b", "shared(x[i]) + outer(x[i])"),
                     ("k_outer", "outer(x[i]) * 2.0"), ("k_inlined_a", "inlined(x[i])"),
                     ("k_inlined_b", "inlined(x[i]) * 2.0"), ("k_typed_a", "helpers.typed(x[i])"),
                     ("k_typed_b", "helpers.typed(x[i]) + 1.0"), ("k_lineinfo", "shared(x[i])")]:
    exec(_body(_name, _expr))
'''

# NVVM compiles of a target whose only new object is one device function's: its other
# objects are taken from the store.
NVVM_OF_ONE_NEW_OBJECT = 1

NAMES = ["k_shared_a", "k_shared_b", "k_outer", "k_inlined_a", "k_inlined_b", "k_typed_a",
         "k_typed_b", "k_lineinfo"]


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "helpers.py").write_text(HELPERS)
    (root / "pkg" / "kernels.py").write_text(KERNELS)
    toml = '[project]\nname = "sep"\narch = ["sm_80"]\n'
    for name in NAMES:
        toml += f'\n[kernels."pkg.kernels:{name}"]\nsignatures = ["void(float32[::1], float32[::1])"]\n'
    (root / "kbuild.toml").write_text(toml)
    return root


def _rows(result):
    assert result.returncode == 0, result.stderr + result.stdout
    return {r["target"].rpartition(":")[2]: r for r in result.json["targets"]}


def _edit(project, old, new):
    path = project / "pkg" / "helpers.py"
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))


def _fresh_artifacts(run_kbuild, project, store):
    return {name: r["artifacts"] for name, r in
            _rows(run_kbuild("build", "--json", cwd=project, store=store)).items()}


def test_a_cold_build_links_separate_objects_and_says_which_kernels_are_one_program(
        project, tmp_path, run_kbuild):
    rows = _rows(run_kbuild("build", "--json", cwd=project, store=tmp_path / "s"))
    assert {n: r["link"] for n, r in rows.items()} == {
        **{n: "lto" for n in NAMES}, "k_lineinfo": "whole"}
    assert "lineinfo" in rows["k_lineinfo"]["note"]
    assert all(r["note"] is None for n, r in rows.items() if n != "k_lineinfo")
    # One object per kernel linked apart, one per (device function, argument types).
    objects = entry_files(tmp_path / "s", kind="object")
    assert len(objects) == 7 + 4  # shared, inner, outer, typed; inlined lives in its callers

    human = run_kbuild("build", cwd=project, store=tmp_path / "s2")
    assert "linked as one program: lineinfo=True" in human.stdout

    whole = _rows(run_kbuild("build", "--json", "--whole-program", cwd=project,
                             store=tmp_path / "s3"))
    assert {r["link"] for r in whole.values()} == {"whole"}
    assert entry_files(tmp_path / "s3", kind="object") == {}


# (edit in helpers.py, targets rebuilt, of which relinked from stored objects)
EDITS = {
    "a body used by two kernels: one compile makes its object, the other relinks":
        ("return x * 2.0 + 1.0", "return x * 2.5 + 1.0",
         {"k_shared_a", "k_shared_b", "k_lineinfo"}, 1),
    "a callee's callee: its callers' objects are all reused":
        ("return x - 0.5", "return x - 0.75", {"k_shared_b", "k_outer"}, 1),
    "an inline='always' body is in its callers' objects: never relinked":
        ("return x + 4.0", "return x + 5.0", {"k_inlined_a", "k_inlined_b"}, 0),
    "a changed return type changes the callers' code: never relinked":
        ("return x * 2.0\n", "return int(x) * 2\n", {"k_typed_a", "k_typed_b"}, 0),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_an_edited_device_function_relinks_exactly_what_a_fresh_build_would_make(
        case, project, tmp_path, run_kbuild):
    old, new, rebuilt, relinked = EDITS[case]
    store = tmp_path / "store"
    _rows(run_kbuild("build", "--json", cwd=project, store=store))
    objects_before = set(entry_files(store, kind="object"))
    _edit(project, old, new)

    rows = _rows(run_kbuild("build", "--json", "-j", "2", cwd=project, store=store))
    assert {n for n, r in rows.items() if r["status"] == "built"} == rebuilt
    assert sum(r["link"] == "relink" for r in rows.values()) == relinked
    # Soundness: every artifact is what an empty store builds from the edited sources.
    fresh = _fresh_artifacts(run_kbuild, project, tmp_path / "fresh")
    assert {n: r["artifacts"] for n, r in rows.items()} == fresh
    if relinked:
        # Only the edited function's object is new: its callers' objects were reused.
        assert len(set(entry_files(store, kind="object")) - objects_before) == 1


def test_after_a_return_type_change_is_built_the_next_edit_relinks_its_callers(
        project, tmp_path, run_kbuild):
    """The callers' objects are keyed without their callees' return types: when the type
    changes, the objects compiled against the new one replace the stored ones, so the
    next edit of the callee relinks its callers as a fresh store would (issue 26)."""
    store = tmp_path / "store"
    _rows(run_kbuild("build", "--json", cwd=project, store=store))
    _edit(project, "return x * 2.0\n", "return int(x) * 2\n")
    rows = _rows(run_kbuild("build", "--json", cwd=project, store=store))
    assert {n: r["link"] for n, r in rows.items() if r["status"] == "built"} == \
        {"k_typed_a": "lto", "k_typed_b": "lto"}

    _edit(project, "return int(x) * 2\n", "return int(x) * 3\n")
    calls = tmp_path / "calls"
    rows = _rows(run_kbuild("build", "--json", cwd=project, store=store,
                            **counting(calls, NVVM_COMPILE)))
    assert sorted(r["link"] for r in rows.values() if r["status"] == "built") == \
        ["lto", "relink"]
    # One compile makes the callee's new object; the other caller relinks with it.
    assert counts(calls) == {NVVM_COMPILE: NVVM_OF_ONE_NEW_OBJECT}
    assert {n: r["artifacts"] for n, r in rows.items()} == \
        _fresh_artifacts(run_kbuild, project, tmp_path / "fresh")


IN_ONE_PROCESS = """
import json, sys
from pathlib import Path
from kbuild import Project
from kbuild.discover import forget_project_modules

toml, store, helpers = sys.argv[1:4]
Project.load(toml, store=store).build()
path = Path(helpers)
path.write_text(path.read_text().replace("return x * 2.0\\n", "return int(x) * 2\\n"))
forget_project_modules()
rows = Project.load(toml, store=store).build()
print(json.dumps({r.target.rpartition(":")[2]: r.artifacts for r in rows}))
"""


def test_a_process_that_compiled_an_object_for_other_callee_types_compiles_it_again(
        project, tmp_path, run_kbuild):
    """A resident process (`kbuild watch`) keeps the objects it made by key; a caller's
    object made against a callee's old return type is other code, never linked with
    the callee's new object."""
    from support import run

    out = run(project / "kbuild.toml", tmp_path / "store", project / "pkg" / "helpers.py",
              launcher=("-c", IN_ONE_PROCESS), cwd=project, home=tmp_path / "home",
              bytecode=False)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout.splitlines()[-1])
    assert rows == _fresh_artifacts(run_kbuild, project, tmp_path / "fresh")


def test_a_damaged_object_is_never_linked(project, tmp_path, run_kbuild):
    store = tmp_path / "store"
    _rows(run_kbuild("build", "--json", cwd=project, store=store))
    for path in entry_files(store, kind="object").values():
        blob = re.search(r'"ltoir": "([0-9a-f]{32})"', path.read_text()).group(1)
        blob_files(store)[blob].write_bytes(b"not LTO-IR")
    _edit(project, "return x * 2.0 + 1.0", "return x * 2.5 + 1.0")

    result = run_kbuild("build", "--json", cwd=project, store=store)
    rows = _rows(result)
    assert "corrupt" in result.stderr
    assert not any(r["link"] == "relink" for r in rows.values())
    assert {n: r["artifacts"] for n, r in rows.items()} == \
        _fresh_artifacts(run_kbuild, project, tmp_path / "fresh")


def _instructions(ptx: str) -> int:
    return sum(1 for line in ptx.splitlines()
               if line.strip().endswith(";") and not line.strip().startswith((".", "//")))


def test_linked_kernels_have_no_more_instructions_than_whole_program_ones(
        examples_project, tmp_path, run_kbuild):
    """No loss at run time: the examples linked from objects against numba's own build."""
    apart = run_kbuild("build", "--json", "--arch", "sm_90", cwd=examples_project,
                       store=tmp_path / "a")
    whole = run_kbuild("build", "--json", "--arch", "sm_90", "--whole-program",
                       cwd=examples_project, store=tmp_path / "w")
    blobs_a, blobs_w = blob_files(tmp_path / "a"), blob_files(tmp_path / "w")
    linked = 0
    for a, w in zip(apart.json["targets"], whole.json["targets"]):
        assert (a["target"], a["signature"]) == (w["target"], w["signature"])
        count_a = _instructions(blob_bytes(blobs_a[a["artifacts"]["ptx"]]).decode())
        count_w = _instructions(blob_bytes(blobs_w[w["artifacts"]["ptx"]]).decode())
        assert count_a <= count_w, textwrap.shorten(f"{a['target']} {a['signature']}", 80)
        linked += a["link"] == "lto"
    assert linked >= len(apart.json["targets"]) - 2  # only the grid-sync kernel is whole


COUNT_PARSES = """
import json, sys
from kbuild import Project
from kbuild.keying import normalize

parsed = []
real = normalize.normalized_ast
normalize.normalized_ast = lambda *a, **k: parsed.append(1) or real(*a, **k)
rows = Project.load(sys.argv[1], store=sys.argv[2]).build()
print(json.dumps({"parsed": len(parsed), "built": sorted(r.target for r in rows
                                                         if r.status == "built")}))
"""


def test_a_no_op_build_normalizes_no_source_and_an_edit_only_its_file(
        project, tmp_path, run_kbuild):
    import json

    from support import run

    store = tmp_path / "store"
    _rows(run_kbuild("build", "--json", cwd=project, store=store))
    assert list((store / "v1" / "facts").glob("*/*.json")), "no facts kept"

    def plan_in_a_new_process():
        out = run(project / "kbuild.toml", store, launcher=("-c", COUNT_PARSES), cwd=project,
                  home=tmp_path / "home")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.splitlines()[-1])

    assert plan_in_a_new_process() == {"parsed": 0, "built": []}
    _edit(project, "return x * 2.0 + 1.0", "return x * 2.5 + 1.0")
    after = plan_in_a_new_process()
    # Only the edited file's five device functions are normalized again.
    assert after["parsed"] == 5
    assert after["built"] == [f"pkg.kernels:{n}" for n in ("k_lineinfo", "k_shared_a",
                                                           "k_shared_b")]


# numba-cuda features through separate compilation: each kernel either links from objects
# with no more instructions than numba's whole-program build, or is built as one program
# for the reason given here.
FEATURES = '''
import math

import numpy as np
from numba import cuda, types
from numba.core.extending import overload
from numba.cuda import fp16

TABLE = np.arange(16, dtype=np.float32) * 0.5


@cuda.jit(device=True)
def fact(n):
    if n <= 1:
        return 1
    return n * fact(n - 1)


@cuda.jit(device=True)
def divmod2(a, b):
    return a // b, a % b


@cuda.jit(device=True)
def with_default(x, k=3.0):
    return x * k


@cuda.jit(device=True)
def apply(f, x):
    return f(x)


@cuda.jit(device=True)
def twice(x):
    return 2 * x


@cuda.jit(device=True, forceinline=True)
def forced(x):
    return x - 7


def pyhelper(x):
    return x


@overload(pyhelper, target="cuda")
def _pyhelper(x):
    def impl(x):
        return x * 3
    return impl


@cuda.jit(device=True)
def from_table(i):
    return cuda.const.array_like(TABLE)[i % 16]


@cuda.jit
def k_recursion(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = fact(i % 8)


@cuda.jit
def k_tuple(a, b, out):
    i = cuda.grid(1)
    if i < out.size:
        q, r = divmod2(a[i], b[i])
        out[i] = q + r


@cuda.jit
def k_defaults_and_literals(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = with_default(x[i]) + with_default(x[i], 2.0) + with_default(1.5, 4)


@cuda.jit
def k_function_argument(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = apply(twice, x[i])


@cuda.jit
def k_forceinline(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = forced(x[i])


@cuda.jit
def k_overload(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = pyhelper(x[i])


@cuda.jit
def k_const_array(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = from_table(i)


@cuda.jit
def k_shared_local_atomic(x, out):
    s = cuda.shared.array(128, dtype=types.float32)
    scratch = cuda.local.array(4, dtype=types.float32)
    i = cuda.grid(1)
    scratch[0] = x[i] if i < x.size else 0
    s[cuda.threadIdx.x] = scratch[0]
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        acc = 0.0
        for j in range(cuda.blockDim.x):
            acc += s[j]
        cuda.atomic.add(out, 0, acc)


@cuda.jit
def k_warp(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = cuda.shfl_down_sync(0xffffffff, x[i], 1) + cuda.popc(i)


@cuda.jit
def k_fp16(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = fp16.hmul(x[i], x[i])


@cuda.jit
def k_math(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = math.erf(x[i]) + math.lgamma(x[i] + 2.0) + cuda.libdevice.fast_expf(x[i])


@cuda.jit(fastmath=True, max_registers=32)
def k_fastmath_maxreg(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = twice(x[i]) / 3.0 + math.sqrt(x[i])


@cuda.jit(launch_bounds=(128,))
def k_launch_bounds(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = twice(x[i])
'''

F32 = "void(float32[::1], float32[::1])"
# kernel -> (signature, None when it links from objects, else a phrase of its note)
FEATURE_TARGETS = {
    "k_recursion": ("void(int64[::1])", None),
    "k_tuple": ("void(int32[::1], int32[::1], int32[::1])", None),
    "k_defaults_and_literals": (F32, None),
    "k_function_argument": (F32, "callee apply has a type kbuild cannot key"),
    "k_forceinline": ("void(int32[::1], int32[::1])", None),
    "k_overload": (F32, "which kbuild does not compile on its own"),
    "k_const_array": ("void(float32[::1])", None),
    "k_shared_local_atomic": (F32, None),
    "k_warp": (F32, None),
    "k_fp16": ("void(float16[::1], float16[::1])", "it links files"),
    "k_math": (F32, None),
    "k_fastmath_maxreg": (F32, None),
    "k_launch_bounds": (F32, None),
}


def test_numba_cuda_features_link_from_objects_or_say_why_not(tmp_path, run_kbuild):
    project = tmp_path / "features"
    (project / "feat").mkdir(parents=True)
    (project / "feat" / "__init__.py").write_text("")
    (project / "feat" / "kern.py").write_text(FEATURES)
    toml = ['[project]', 'paths = ["."]', 'arch = ["sm_90"]', '']
    for name, (signature, _) in FEATURE_TARGETS.items():
        toml += [f'[kernels."feat.kern:{name}"]', f'signatures = ["{signature}"]', ""]
    (project / "kbuild.toml").write_text("\n".join(toml))

    apart = run_kbuild("build", "--json", "-j", "2", cwd=project, store=tmp_path / "a")
    whole = run_kbuild("build", "--json", "-j", "2", "--whole-program", cwd=project,
                       store=tmp_path / "w")
    blobs_a, blobs_w = blob_files(tmp_path / "a"), blob_files(tmp_path / "w")
    for a, w in zip(apart.json["targets"], whole.json["targets"]):
        name = a["target"].rpartition(":")[2]
        reason = FEATURE_TARGETS[name][1]
        assert (a["status"], w["status"]) == ("built", "built"), (name, a["error"], w["error"])
        if reason is None:
            assert a["link"] == "lto", (name, a["note"])
        else:
            assert a["link"] == "whole" and reason in a["note"], (name, a["note"])
        ptx_a = blob_bytes(blobs_a[a["artifacts"]["ptx"]]).decode()
        count_a, count_w = _instructions(ptx_a), _instructions(
            blob_bytes(blobs_w[w["artifacts"]["ptx"]]).decode())
        assert count_a <= count_w, (name, count_a, count_w)
        if name == "k_launch_bounds":  # the kernel object's metadata survives the link
            assert ".maxntid 128" in ptx_a
        assert "_20at_200x" not in ptx_a  # no memory address mangled into a symbol
    again = run_kbuild("build", "--json", cwd=project, store=tmp_path / "a")
    assert {r["status"] for r in again.json["targets"]} == {"cached"}
    # A kernel passing a function as an argument: its bytes do not depend on the process
    # (numba names the argument's type by the function's memory address).
    alone = run_kbuild("build", "--json", "k_function_argument", cwd=project,
                       store=tmp_path / "alone")
    (row,) = alone.json["targets"]
    assert row["artifacts"] == next(r["artifacts"] for r in apart.json["targets"]
                                    if r["target"].endswith(":k_function_argument"))


# One Python function jitted twice, with other options: two device functions (numba
# compiles each with its own flags and mangles those into its symbol), never one.
TWICE_JITTED = '''
from numba import cuda


def ratio(x):
    return x * x / (x + x)


exact = cuda.jit(device=True)(ratio)
fast = cuda.jit(device=True, fastmath=True)(ratio)


@cuda.jit
def k_both(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = exact(x[i]) + fast(x[i])


@cuda.jit
def k_exact(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = exact(x[i])


@cuda.jit
def k_fast(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = fast(x[i])
'''


def test_one_function_jitted_with_two_sets_of_options_is_two_device_functions(
        tmp_path, run_kbuild):
    """`exact` and `fast` share their Python function. Each has its own tree and object:
    a kernel calling both links both objects (it was linked as one program after its split
    found one object for both), each kernel has its callee's float semantics, and an edit
    of the shared function rebuilds them all to a fresh build's bytes."""
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "twice.py").write_text(TWICE_JITTED)
    names = ("k_both", "k_exact", "k_fast")
    (root / "kbuild.toml").write_text('[project]\nname = "twice"\narch = ["sm_80"]\n' + "".join(
        f'\n[kernels."pkg.twice:{n}"]\nsignatures = ["void(float32[::1], float32[::1])"]\n'
        for n in names))
    store = tmp_path / "store"
    rows = _rows(run_kbuild("build", "--json", cwd=root, store=store))
    assert {n: (r["link"], r["note"]) for n, r in rows.items()} == \
        {n: ("lto", None) for n in names}
    blobs = blob_files(store)
    divisions = {n: set(re.findall(r"div\.[a-z.]*f32", blob_bytes(
        blobs[r["artifacts"]["ptx"]]).decode())) for n, r in rows.items()}
    assert divisions == {"k_both": {"div.rn.f32", "div.approx.f32"},
                         "k_exact": {"div.rn.f32"}, "k_fast": {"div.approx.f32"}}

    path = root / "pkg" / "twice.py"
    path.write_text(path.read_text().replace("(x + x)", "(x + x + x)"))
    rows = _rows(run_kbuild("build", "--json", "-j", "2", cwd=root, store=store))
    assert {n for n, r in rows.items() if r["status"] == "built"} == set(names)
    assert {n: r["artifacts"] for n, r in rows.items()} == \
        _fresh_artifacts(run_kbuild, root, tmp_path / "fresh")
