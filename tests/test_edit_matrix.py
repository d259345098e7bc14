"""Invalidation is sound and precise: an edit rebuilds exactly the targets that reach it.

The baseline (tests/editproj built into a temp store) is made once per test run;
each case copies the project to a new path and the store beside it, applies one
edit, runs the real `kbuild build --json` once and compares the set of targets
with a "built" row to the expected set: nothing missed, nothing extra.

Every test runs for each backend (`editmatrix_support.VARIANTS`): numba-cuda here, and
numba-cuda-mlir on the same project ported to it in test_edit_matrix_mlir.py (skipped
where it is not installed).
"""

from __future__ import annotations

import pytest

from editmatrix_support import (
    ALL, PRECISION, SOUNDNESS, TARGETS, VARIANTS, build, checkout, copy_project, copy_tree,
    keys_of, make_baseline, replace, with_status,
)
from spurious_support import check as check_spurious


@pytest.fixture(scope="module", params=VARIANTS[:1], ids=lambda v: v.id)
def variant(request):
    """The backend this module's tests run for: numba-cuda (numba-cuda-mlir's run is
    test_edit_matrix_mlir.py, a file of its own so that the two share the workers)."""
    return request.param.require()


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, request, variant):
    """(project, store, build JSON) of a clean build of tests/editproj (ported to the
    variant's backend)."""
    template = request.getfixturevalue(
        "editproj_mlir_template" if variant.backend == "numba-cuda-mlir" else "editproj_template")
    return make_baseline(tmp_path_factory.mktemp("baseline"), template)


def test_baseline_builds_every_target(baseline, variant):
    _, _, result = baseline
    assert with_status(result, "built") == variant.supported(ALL)
    assert len(result["targets"]) == sum(n for k, n in TARGETS.items()
                                         if k in variant.supported(ALL))
    assert result["summary"]["failed"] == 0


def test_copied_checkout_and_store_are_a_full_hit(baseline, variant, tmp_path):
    """Keys never depend on the checkout path: a copy elsewhere is entirely cached."""
    project, store, first = baseline
    result = build(variant.port(copy_project(tmp_path / "elsewhere" / "proj")),
                   copy_tree(store, tmp_path / "store"))
    assert with_status(result, "cached") == variant.supported(ALL)
    assert result["summary"]["built"] == 0
    assert keys_of(result) == keys_of(first)


def _run_case(baseline, variant, tmp_path, case):
    """Apply the edit to a checkout of the baseline (whose store holds the journal of the
    baseline's build) and build; then build again, which the journal that build wrote
    must answer (direct mode) with the same keys."""
    reason = variant.skip_reason(case.rebuilt)
    if reason:
        pytest.skip(reason)
    project, store = checkout(baseline, tmp_path)
    case.apply(project)
    variant.port(project)
    result = build(project, store, *case.args, env_extra=case.env)
    assert result["summary"]["failed"] == 0, [r["error"] for r in result["targets"] if r["error"]]
    assert result["mode"]["used"] == ("direct" if case.direct else "full"), result["mode"]
    again = build(project, store, *case.args, env_extra=case.env)
    assert again["mode"]["used"] == "direct", again["mode"]
    assert with_status(again, "cached") == variant.supported(ALL)
    assert keys_of(again) == keys_of(result)
    return result


@pytest.mark.parametrize("case", SOUNDNESS, ids=lambda c: c.id)
def test_soundness(baseline, variant, tmp_path, case):
    result = _run_case(baseline, variant, tmp_path, case)
    assert with_status(result, "built") == variant.supported(case.rebuilt)
    assert with_status(result, "cached") == variant.supported(ALL - case.rebuilt)
    check_spurious(f"edit-{variant.id}", case.id, baseline[2], result)


@pytest.mark.parametrize("case", PRECISION, ids=lambda c: c.id)
def test_precision(baseline, variant, tmp_path, case):
    result = _run_case(baseline, variant, tmp_path, case)
    assert with_status(result, "built") == variant.supported(case.rebuilt)
    check_spurious(f"edit-{variant.id}", case.id, baseline[2], result)
    unchanged = ALL - case.rebuilt
    assert {k: v for k, v in keys_of(result).items() if k[0].rpartition(":")[2] in unchanged} \
        == {k: v for k, v in keys_of(baseline[2]).items() if k[0].rpartition(":")[2] in unchanged}


def test_signature_edit_rebuilds_only_the_new_signature(baseline, variant, tmp_path):
    """Of k_plain's two signatures, only the edited one is a new target."""
    _, store, _ = baseline
    project = copy_project(tmp_path / "editproj")
    replace("kbuild.toml", '"void(float64[::1], float64[::1])"',
            '"void(float64[::1], float64[:])"')(project)
    result = build(variant.port(project), copy_tree(store, tmp_path / "store"))
    built = [(r["target"], r["signature"]) for r in result["targets"] if r["status"] == "built"]
    assert built == [("lab.kernels:k_plain", "void(float64[::1], float64[:])")]


def _write(root, files: dict) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_library_outside_the_project_is_keyed_by_value(variant, tmp_path):
    """A constant read through a module that is not under the project's paths.

    `extlib` sits on PYTHONPATH beside the project (a sibling checkout, a vendored
    package): no key input records its version, so what the kernel reads from it
    must be keyed by value, not by the name `extlib.GAIN`.
    """
    project, vendor = tmp_path / "proj", tmp_path / "vendor"
    _write(vendor, {"extlib/__init__.py": "", "extlib/gains.py": "GAIN = 1.5\n"})
    _write(project, {
        "kbuild.toml": '[project]\npaths = ["."]\n\n[kernels."app.k:k_gain"]\n'
                       'signatures = ["void(float32[::1])"]\n',
        "app/__init__.py": "",
        "app/k.py": "from numba import cuda\n\nfrom extlib import gains\n\n\n"
                    "@cuda.jit\ndef k_gain(x):\n    x[0] = x[0] * gains.GAIN\n",
    })
    variant.port(project)
    env = {"PYTHONPATH": str(vendor)}
    store = tmp_path / "store"
    assert with_status(build(project, store, env_extra=env), "built") == {"k_gain"}
    (vendor / "extlib" / "gains.py").write_text("GAIN = 2.5\n")
    assert with_status(build(project, store, env_extra=env), "built") == {"k_gain"}
