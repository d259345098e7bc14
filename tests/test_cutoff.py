"""Early cutoff: an edit that changes a target's key but not what its compile hands to the
linker reuses the earlier link's output (or the earlier cubin of the same PTX).

Every case counts the work done (NVVM compiles, nvJitLink links, PTX -> cubin assemblies)
and checks soundness against the ground truth: the launched bytes equal what an empty
store builds from the edited sources, and the targets' entries are committed under their
new keys (the next build is all cached).
"""

from __future__ import annotations

import json

import pytest

from conftest import blob_files, entry_files
from support import NVVM_COMPILE, counting, counts
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

LINK_PTX = "kbuild.backend.lto:link_ptx"  # nvJitLink: LTO-IR objects -> PTX
ASSEMBLE = "numba.cuda.cudadrv.driver:_Linker.complete"  # PTX -> cubin (ours and numba's)
WORK = (NVVM_COMPILE, LINK_PTX, ASSEMBLE)

CONSTS = '''"""Constants the device functions read."""

from collections import namedtuple

import numpy as np

Pair = namedtuple("Pair", ["u", "v"])
SCALE = 2.5
# A NaN whose payload lies in bits a conversion to float32 drops.
FILL = np.array([0x7FF8000000000001], dtype=np.uint64).view(np.float64)[0]
DEBUG = False
'''

HELPERS = '''from numba import cuda, float32

from pkg import consts
from pkg.consts import DEBUG, FILL, Pair


@cuda.jit(device=True)
def scaled(x):
    if DEBUG:
        x = x + 1.0
    return x * consts.SCALE


@cuda.jit(device=True)
def filled(x):
    return x if x == x else float32(FILL)


@cuda.jit(device=True)
def paired(x):
    p = Pair(u=x, v=x * 2.0)
    return p.u - p.v


@cuda.jit(device=True)
def offset(x):
    return x - 3.0
'''

KERNELS = '''from numba import cuda

from pkg.helpers import filled, offset, paired, scaled


@cuda.jit
def k_a(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = scaled(x[i]) + filled(x[i]) + paired(x[i]) + offset(x[i])


@cuda.jit
def k_b(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = scaled(x[i]) * 2.0 + filled(x[i]) + paired(x[i])


@cuda.jit
def k_c(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = scaled(x[i]) - 1.0 + offset(x[i])
'''

MOVED = '''

@cuda.jit(device=True)
def offset(x):
    return x - 3.0
'''


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "consts.py").write_text(CONSTS)
    (root / "pkg" / "helpers.py").write_text(HELPERS)
    (root / "pkg" / "more.py").write_text("from numba import cuda\n")
    (root / "pkg" / "kernels.py").write_text(KERNELS)
    toml = '[project]\nname = "cutoff"\narch = ["sm_80"]\n'
    for name in ("k_a", "k_b", "k_c"):
        toml += f'\n[kernels."pkg.kernels:{name}"]\nsignatures = ["void(float32[::1], float32[::1])"]\n'
    (root / "kbuild.toml").write_text(toml)
    return root


def _edit(project, path, old, new):
    file = project / "pkg" / path
    text = file.read_text()
    assert text.count(old) == 1, (path, old)
    file.write_text(text.replace(old, new))


def _rows(result):
    assert result.returncode == 0, result.stderr + result.stdout
    return {r["target"].rpartition(":")[2]: r for r in result.json["targets"]}


def _build(run_kbuild, project, store, *args, calls=None):
    extra = counting(calls, *WORK) if calls is not None else {}
    return _rows(run_kbuild("build", "--json", "-j", "1", *args, cwd=project, store=store,
                            **extra))


# edit -> (the edits, {target: cutoff} of the targets rebuilt, the work it may cost)
EDITS = {
    # The function compiles to the same LTO-IR object: its one compile is all the work.
    "an `if DEBUG:` branch compiled away": (
        [("helpers.py", "x = x + 1.0", "x = x + 2.0")],
        {"k_a": "link", "k_b": "link", "k_c": "link"},
        {NVVM_COMPILE: 1}),
    # The tuple's fields in another order: numba's type of it changed, an observed value
    # of what the compile read (namedtuples are keyed by their fields, their order and
    # defaults), so the first caller compiles its objects again, as for any observed
    # value, and the second its own object (its compile read the value through the device
    # function numba kept from the first: a kept answer's reads are read by every compile
    # it serves); the same linked PTX: the callers link again, nothing is assembled.
    "a namedtuple's fields swapped, used by keyword": (
        [("consts.py", '["u", "v"]', '["v", "u"]')],
        {"k_a": "cubin", "k_b": "cubin"},
        {NVVM_COMPILE: 6, LINK_PTX: 2}),
    # A global value read while compiling changed: the first caller compiles all of its
    # objects again (each records what its compile read), the other its own object (it
    # read the value through the kept device function), then links; one PTX.
    "a NaN payload a float32 conversion drops": (
        [("consts.py", "0x7FF8000000000001", "0x7FF8000000000002")],
        {"k_a": "cubin", "k_b": "cubin"},
        {NVVM_COMPILE: 6, LINK_PTX: 2}),
    # The callers' own objects call it by another name now, and compile again; their
    # linked PTX is the same.
    "a device function moved to another module": (
        [("helpers.py", MOVED, ""), ("more.py", "\n", "\n" + MOVED),
         ("kernels.py", "filled, offset, paired, scaled",
          "filled, paired, scaled\nfrom pkg.more import offset")],
        {"k_a": "cubin", "k_c": "cubin"},
        {NVVM_COMPILE: 6, LINK_PTX: 2}),
    # A class defined in the module is keyed by the module's source: the function that
    # reads it compiles again, to the same object.
    "a comment in the constants module": (
        [("consts.py", "SCALE = 2.5", "SCALE = 2.5  # the scale")],
        {"k_a": "link", "k_b": "link"},
        {NVVM_COMPILE: 1}),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_an_edit_that_changes_no_output_reuses_it_and_launches_what_a_fresh_build_makes(
        case, project, tmp_path, run_kbuild):
    edits, rebuilt, work = EDITS[case]
    store, calls = tmp_path / "store", tmp_path / "calls"
    before = _build(run_kbuild, project, store)
    for edit in edits:
        _edit(project, *edit)

    rows = _build(run_kbuild, project, store, calls=calls)
    assert {n: r["cutoff"] for n, r in rows.items() if r["status"] == "built"} == rebuilt
    assert counts(calls) == work
    # Soundness: the bytes are a fresh build's (the earlier ones, as nothing compiled
    # changed), each under the target's new key, which the next build finds.
    fresh = _build(run_kbuild, project, tmp_path / "fresh")
    assert {n: r["artifacts"] for n, r in rows.items()} == \
        {n: r["artifacts"] for n, r in fresh.items()} == \
        {n: r["artifacts"] for n, r in before.items()}
    assert {n: r["key"] for n, r in rows.items()} == {n: r["key"] for n, r in fresh.items()}
    assert {r["status"] for r in _build(run_kbuild, project, store).values()} == {"cached"}


def test_a_whole_program_build_reuses_the_cubin_of_the_same_program(project, tmp_path, run_kbuild):
    store, calls = tmp_path / "store", tmp_path / "calls"
    _build(run_kbuild, project, store, "--whole-program")
    _edit(project, "helpers.py", "x = x + 1.0", "x = x + 2.0")

    rows = _build(run_kbuild, project, store, "--whole-program", calls=calls)
    assert {n: (r["status"], r["link"], r["cutoff"]) for n, r in rows.items()} == \
        {n: ("built", "whole", "cubin") for n in ("k_a", "k_b", "k_c")}
    # Each kernel's PTX and LTO-IR (numba makes its cubin from the LTO-IR); no link.
    assert counts(calls) == {NVVM_COMPILE: 6}
    fresh = _build(run_kbuild, project, tmp_path / "fresh", "--whole-program")
    assert {n: r["artifacts"] for n, r in rows.items()} == \
        {n: r["artifacts"] for n, r in fresh.items()}


def test_the_row_says_what_was_reused(project, tmp_path, run_kbuild):
    store = tmp_path / "store"
    _build(run_kbuild, project, store)
    _edit(project, "helpers.py", "x = x + 1.0", "x = x + 2.0")
    out = run_kbuild("build", "-j", "1", cwd=project, store=store)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("built")]
    assert len(lines) == 3
    assert all(line.endswith("(unchanged objects: an earlier link's PTX and cubin reused)")
               for line in lines), lines
    assert sum("relinked: only device function pkg.helpers:scaled changed" in line
               for line in lines) == 2


def test_a_record_that_names_another_kernels_binaries_is_never_used(
        project, tmp_path, run_kbuild):
    """A cutoff record is bound to its kernel and arch like a target's entry: one whose
    PTX and cubin define another kernel is dropped with a warning, and the link runs."""
    store = tmp_path / "store"
    before = _build(run_kbuild, project, store)
    records = [json.loads(p.read_text()) | {"path": p}
               for p in entry_files(store, kind="output").values()]
    assert len(records) == 2 * 3  # per target: its link's objects, its PTX
    other = before["k_c"]["artifacts"]
    for record in records:
        if record["artifacts"]["ptx"] != other["ptx"]:
            path = record.pop("path")
            path.write_text(json.dumps(dict(record, artifacts=dict(other))))
    _edit(project, "helpers.py", "x = x + 1.0", "x = x + 2.0")

    result = run_kbuild("build", "--json", "-j", "1", cwd=project, store=store)
    rows = _rows(result)
    assert {n: r["cutoff"] for n, r in rows.items()} == {"k_a": None, "k_b": None,
                                                        "k_c": "link"}
    assert "(early-cutoff record of _ZN3pkg7kernels3k_a" in result.stderr
    assert "does not define the kernel" in result.stderr
    assert {n: r["artifacts"] for n, r in rows.items()} == \
        {n: r["artifacts"] for n, r in before.items()}


def test_a_corrupt_blob_behind_a_record_is_made_again(project, tmp_path, run_kbuild):
    store = tmp_path / "store"
    before = _build(run_kbuild, project, store)
    blob_files(store)[before["k_b"]["artifacts"]["cubin"]].write_bytes(b"not a cubin")
    _edit(project, "helpers.py", "x = x + 1.0", "x = x + 2.0")

    rows = _build(run_kbuild, project, store)
    assert rows["k_b"]["cutoff"] is None
    assert {n: r["artifacts"] for n, r in rows.items()} == \
        {n: r["artifacts"] for n, r in before.items()}
