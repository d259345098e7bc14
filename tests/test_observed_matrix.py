"""Sound by construction: what numba consulted while compiling is what a target is keyed by.

An edit matrix per channel the static walk over a kernel's source cannot follow
(tests/obsproj; `obext` is an installed package outside the project, on PYTHONPATH).
Each case edits a copy of the project (or the environment), runs an incremental
build against a copy of the baseline store, and a fresh build of the edited project
into an empty store, as the issue's hidden suite does:

- a target whose PTX or cubin differs from the fresh build must not be `cached`
  (a stale binary served);
- exactly the targets the case names are built; the others stay `cached`
  (an edit nobody's compile read changes nothing).

Every test runs for each backend (`editmatrix_support.VARIANTS`): numba-cuda here, whose
front end is `numba.core` and `numba.cuda`, and in test_observed_matrix_mlir.py
numba-cuda-mlir, whose vendored copy of it is `numba_cuda_mlir.numba_cuda` (the project
and `obext` ported to it after each edit; skipped where it is not installed).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from editmatrix_support import (
    VARIANTS, artifacts, build, case, copy_tree, fresh_checkout, kbuild_result, reference,
    replace, run_kbuild, short, with_status,
)
from spurious_support import check as check_spurious
from support import shared_dir, template

HERE = Path(__file__).resolve().parent
PROJECT, VENDOR = HERE / "obsproj", HERE / "obsvendor"
TARGETS = frozenset({"k_overload", "k_method", "k_attr", "k_jitable", "k_fast", "k_lazy",
                     "k_factory", "k_link", "k_eager", "k_builtin", "k_const", "k_debug",
                     "k_pick", "k_calc"})

CASES = [
    case("overload-body", replace("ob/ext.py", "return x * s\n", "return x * s + 1.0\n"),
         {"k_overload"}),
    case("global-read-by-overload", replace("ob/consts.py", "SCALE = 2.0", "SCALE = 2.5"),
         {"k_overload", "k_const"}),
    # k_method's and k_attr's overloads both read class Cfg; each rebuilds only when an
    # attribute it reads changes (the static key keys `Cls.ATTR` reads by value).
    case("class-attribute-read-at-typing",
         replace("ob/cfg.py", "OWN = 4.0", "OWN = 4.5"), {"k_method"}),
    case("inherited-attribute-read-at-typing",
         replace("ob/base.py", "GAIN = 1.5", "GAIN = 1.75"), {"k_method"}),
    case("attribute-derived-from-another-module",
         replace("ob/other.py", "X = 3.0", "X = 3.5"), {"k_attr"}),
    case("env-var-read-at-typing", lambda root: None, {"k_attr"}, env={"OB_BIAS": "1.5"}),
    case("register-jitable-in-another-package",
         replace("../vendor/obext/jitables.py", "return x * 3\n", "return x * 3 + 1\n"),
         {"k_jitable"}),
    case("overload-jit-options-fastmath",
         replace("ob/ext.py", '"fastmath": False', '"fastmath": True'), {"k_fast"}),
    case("lazily-imported-module", replace("ob/lazyconsts.py", "K = 0.5", "K = 0.75"),
         {"k_lazy"}),
    case("module-passed-as-value", replace("ob/factors.py", "FACTOR = 1.25", "FACTOR = 1.5"),
         {"k_factory"}),
    case("link-file-header", replace("ob/lib/gain.h", "3.0f", "4.0f"), {"k_link"}),
    case("link-file", replace("ob/lib/gain.cu", "x * OB_LINK_GAIN;", "x * OB_LINK_GAIN + 1.0f;"),
         {"k_link"}),
    case("device-function-explicit-signature", replace("ob/kernels.py", "x / 3", "x / 5"),
         {"k_eager"}),
    case("name-injected-into-builtins",
         replace("ob/__init__.py", "OB_GAIN = 2.0", "OB_GAIN = 3.0"), {"k_builtin"}),
    # numba prunes `if DEBUG:` on the global's value before typing: the callee only that
    # branch calls is not compiled, so its body is no input; the global is.
    case("callee-in-pruned-branch", replace("ob/kernels.py", "return x * 2.0",
                                            "return x * 3.0"), set()),
    case("pruned-branch-enabled", replace("ob/kernels.py", "DEBUG = False", "DEBUG = True"),
         {"k_debug"}),
    # An overload's selector returns one nested implementation per argument types: only
    # the one numba received is compiled; a helper the selector calls is run.
    case("unselected-overload-implementation", replace("ob/ext.py", "return x + 1\n",
                                                       "return x + 2\n"), set()),
    case("selected-overload-implementation", replace("ob/ext.py", "return x * 2.0\n",
                                                     "return x * 2.5\n"), {"k_pick"}),
    # Two registrations of one function: the implementation the one not chosen returns
    # is never compiled; the chosen one's is (observed as it is compiled).
    case("unselected-registration-implementation",
         replace("ob/ext.py", "return x + 7\n", "return x + 8\n"), set()),
    case("selected-registration-implementation",
         replace("ob/ext.py", "return x * 3.0\n", "return x * 3.5\n"), {"k_pick"}),
    case("helper-the-selector-calls", replace("ob/ext.py", "return 2.0\n", "return 3.0\n"),
         {"k_calc"}),
    # An observation's digest is what was observed, never its module's other bytes.
    case("comment-in-module-an-overload-reads", replace("ob/consts.py", "UNUSED = 5.0",
                                                       "UNUSED = 5.0  # not read"), set()),
    case("comment-in-lazily-imported-module", replace("ob/lazyconsts.py", "K = 0.5",
                                                     "K = 0.5  # read lazily"), set()),
    case("comment-beside-overloads", replace("ob/ext.py", "def scale_it(x):",
                                             "# a stub\ndef scale_it(x):"), set()),
    case("unrelated-constant", replace("ob/consts.py", "UNUSED = 5.0", "UNUSED = 6.0"), set()),
    # CUDA typing never tries a template registered for another target (numba-cuda's
    # `order_by_target_specificity`): a CPU overload of the stub is no input of a kernel.
    case("overload-of-the-stub-for-another-target",
         replace("ob/ext.py", '@overload_method(types.Array, "ob_gained"',
                 '@overload(scale_it, target="cpu")\ndef ol_scale_it_cpu(x):\n'
                 '    def impl(x):\n        return x - 1.0\n\n    return impl\n\n\n'
                 '@overload_method(types.Array, "ob_gained"'), set()),
]


def _checkout(where: Path) -> Path:
    """tests/obsproj at where/proj and tests/obsvendor at where/vendor; the project path."""
    fresh_checkout(VENDOR, where, "vendor")
    return fresh_checkout(PROJECT, where)


def _ported(variant, project: Path) -> Path:
    return variant.port(project, project.parent / "vendor")


def _env(project: Path, extra=None) -> dict:
    # numba-cuda compiles .cu link files with NVRTC, which finds `#include "gain.h"` only on
    # its search path.
    return {"PYTHONPATH": str(project.parent / "vendor"),
            "NUMBA_CUDA_NVRTC_EXTRA_SEARCH_PATHS": str(project / "ob" / "lib"), **(extra or {})}


@pytest.fixture(scope="module", params=VARIANTS[:1], ids=lambda v: v.id)
def variant(request):
    """The backend this module's tests run for: numba-cuda (numba-cuda-mlir's run is
    test_observed_matrix_mlir.py, a file of its own so that the two share the workers)."""
    return request.param.require()


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, variant):
    """(where, build JSON): the project and its vendor package built into where/store, once
    per test run for all workers (support.template). Read-only: cases copy the store."""
    def make(project: Path, store: Path):
        checkout = _ported(variant, _checkout(project.parent))
        return kbuild_result(checkout, store, "build", env_extra=_env(checkout))

    made = template(shared_dir(tmp_path_factory), f"obsproj-{variant.id}", make)
    return made.store.parent, made.json


@pytest.fixture(scope="module")
def journaled(baseline, variant, tmp_path_factory):
    """(work, kept): a checkout of the baseline with its store at work/, built once as it is
    (a no-op, which writes the journal of this checkout: its paths are in PYTHONPATH and
    NUMBA_* here), and a copy of all of it at kept/. A case restores kept/ at work/, the
    same absolute paths (`_edited`), so the journal is this checkout's without a no-op per
    case: the copy changes every file's identity, not its bytes, and the journal trusts a
    file whose identity changed by its digest (kbuild/direct/inputs.py). Checked here: the
    restored checkout is answered from the journal."""
    where, _ = baseline
    work = tmp_path_factory.mktemp("obs-checkout")
    project = _ported(variant, _checkout(work))
    copy_tree(where / "store", work / "store")
    noop = build(project, work / "store", env_extra=_env(project))
    assert with_status(noop, "cached") == variant.supported(TARGETS), noop["mode"]
    kept = tmp_path_factory.mktemp("obs-journaled") / "kept"
    shutil.copytree(work, kept, symlinks=True)
    _restore(work, kept)
    again = build(project, work / "store", env_extra=_env(project))
    assert again["mode"]["used"] == "direct", again["mode"]
    assert with_status(again, "cached") == variant.supported(TARGETS)
    return work, kept


def _restore(work: Path, kept: Path) -> None:
    shutil.rmtree(work)
    shutil.copytree(kept, work, symlinks=True)


def _edited(journaled, variant, the_case) -> Path:
    """The journaled checkout (its store at project.parent / "store"), restored as it was
    after its no-op, then edited: the incremental build must notice the edit through the
    journal."""
    reason = variant.skip_reason(the_case.rebuilt)
    if reason:
        pytest.skip(reason)
    work, kept = journaled
    _restore(work, kept)
    project = work / "proj"
    the_case.apply(project)
    return _ported(variant, project)  # what the edit brought in, ported too


def test_baseline_builds_every_target(baseline, variant):
    _, result = baseline
    assert with_status(result, "built") == variant.supported(TARGETS), \
        [r["error"] for r in result["targets"]]


@pytest.mark.parametrize("the_case", CASES, ids=lambda c: c.id)
def test_incremental_matches_fresh(baseline, journaled, variant, tmp_path, the_case):
    project = _edited(journaled, variant, the_case)
    env = _env(project, the_case.env)
    incremental = build(project, project.parent / "store", env_extra=env)
    # Every target, into an empty store: fresh results are never shared between cases by
    # key, since a store of them looked up by kbuild's own key would answer a key that
    # missed the edit with the bytes from before it, the fault this matrix looks for.
    fresh = reference(project, tmp_path / "fresh-store", env_extra=env, warm=variant.warm)
    assert incremental["summary"]["failed"] == 0 and fresh["summary"]["failed"] == 0
    now, clean = artifacts(incremental), artifacts(fresh)
    stale = {t for t in with_status(incremental, "cached") if now[t] != clean[t]}
    assert not stale, f"stale binaries served for {sorted(stale)}"
    assert with_status(incremental, "built") == variant.supported(the_case.rebuilt)
    check_spurious(f"observed-{variant.id}", the_case.id, baseline[1], incremental)
    # An edit nobody's compile read changes no key, yet the journal saw a file change.
    assert incremental["mode"]["used"] == "full", incremental["mode"]
    again = build(project, project.parent / "store", env_extra=env)
    assert again["mode"]["used"] == "direct", again["mode"]
    assert with_status(again, "cached") == variant.supported(TARGETS) and artifacts(again) == now
    changed = {t for t, arts in artifacts(baseline[1]).items() if arts != clean[t]}
    assert changed <= the_case.rebuilt, "a target's code changed that the case did not expect"


@pytest.mark.parametrize("the_case, target, reason", [
    (CASES[3], "k_method", "observed overload impl ob.ext:ol_gained changed"),
    (CASES[5], "k_attr", "observed env OB_BIAS changed"),
    # A name put into builtins is keyed statically too (keying/references.py): its static reason.
    (CASES[13], "k_builtin", "builtin OB_GAIN 2.0 -> 3.0"),
    # The overload's tree leaves its nested implementations out: the one compiled is observed.
    (next(c for c in CASES if c.id == "selected-overload-implementation"), "k_pick",
     "observed function ob.ext:ol_pick.<locals>.impl_float changed"),
    # Of two registrations, the chosen one's implementation (defined apart) is observed.
    (next(c for c in CASES if c.id == "selected-registration-implementation"), "k_pick",
     "observed function ob.ext:choose_float changed"),
], ids=lambda v: getattr(v, "id", None))
def test_status_names_the_observation_that_changed(journaled, variant, the_case, target, reason):
    project = _edited(journaled, variant, the_case)
    result = run_kbuild(project, project.parent / "store", "status",
                        env_extra=_env(project, the_case.env))
    rows = {short(r["target"]): r for r in result["targets"]}
    assert rows[target]["status"] == "stale"
    assert reason in rows[target]["reasons"]
    assert {t for t, r in rows.items() if r["status"] != "up-to-date"} == \
        variant.supported(the_case.rebuilt)


def test_two_environments_are_both_kept(baseline, journaled, variant):
    """Two observation sets under one static key: switching back is a hit, not a rebuild."""
    reason = variant.skip_reason({"k_attr"})  # the only kernel whose compile reads OB_BIAS
    if reason:
        pytest.skip(reason)
    project = _edited(journaled, variant, CASES[-1])
    store = project.parent / "store"
    assert with_status(build(project, store, env_extra=_env(project, {"OB_BIAS": "2"})),
                        "built") == {"k_attr"}
    back = build(project, store, env_extra=_env(project))
    assert with_status(back, "built") == set()
    assert artifacts(back)["k_attr"] == artifacts(baseline[1])["k_attr"]
    assert os.path.isdir(store)
