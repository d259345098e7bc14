"""A device function's parameter names are code only where a call names them.

numba binds `lin(a=x, b=y)` against `lin`'s names; a call by place never reads them. So a
device function's parameters are keyed by place (as a kernel's are), and a call that
names one is observed where numba binds it (`Kind.PARAMETERS`), wherever that call is: a
kernel, another device function, an @overload implementation, of a function its module
finds by name or of a closure factory's product. Renaming parameters
rebuilds exactly the targets whose calls name them; tests/paramproj holds one of each.
Each case edits a copy, builds it against a copy of the baseline store and freshly into
an empty one: no target is `cached` with bytes the fresh build does not make, and the
targets rebuilt are the ones the case names.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest

from editmatrix_support import (
    artifacts, assert_matches_fresh, build, case, copy_tree, fresh_checkout, matrix_baseline,
    replace, run_case, with_status,
)

HERE = Path(__file__).resolve().parent
PROJECT = HERE / "paramproj"
TARGETS = frozenset({"k_pos", "k_kw", "k_def", "k_mid", "k_ol", "k_fac_pos", "k_fac_kw",
                     "k_inline"})
_DEV = "pp/dev.py"

CASES = [
    # Called by place only: no target reads the names.
    case("parameters-renamed-callers-by-place",
         replace(_DEV, "def pos(u, v):\n    return u - v * 0.5",
                 "def pos(p, q):\n    return p - q * 0.5"), set()),
    case("defaulted-parameter-renamed-default-omitted",
         replace(_DEV, "def off(a, d=1.0):\n    return a + d",
                 "def off(y, dd=1.0):\n    return y + dd"), set()),
    # Names swapped: a call by place computes the same, one by name the other way round,
    # from a kernel, a device function and an @overload implementation alike.
    case("parameters-swapped-callers-by-name",
         replace(_DEV, "def lin(a, b):\n    return a * 2.0 + b",
                 "def lin(b, a):\n    return b * 2.0 + a"), {"k_kw", "k_mid", "k_ol"}),
    # A closure factory's products, whose names are their code's, found in the factory's.
    case("factory-product-parameters-renamed-callers-by-place",
         replace(_DEV, "def offset(u):\n        return u + delta",
                 "def offset(t):\n        return t + delta"), set()),
    case("factory-product-parameters-swapped-callers-by-name",
         replace(_DEV, "def scaled(v, w):\n        return v * factor + w",
                 "def scaled(w, v):\n        return w * factor + v"), {"k_fac_kw"}),
    # Inlined into its caller's IR (inline="always"): numba binds the keywords there, and
    # no call template sees them, so such a function keeps its names in its key.
    case("inlined-device-function-parameters-swapped",
         replace(_DEV, "def lin_inline(a, b):\n    return a * 2.0 + b",
                 "def lin_inline(b, a):\n    return b * 2.0 + a"), {"k_inline"}),
    case("keyword-call-in-an-overload-implementation",
         replace("pp/ol.py", "return lin(a=a, b=b)", "return lin(b=a, a=b)"), {"k_ol"}),
]

_checkout = functools.partial(fresh_checkout, PROJECT)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    return matrix_baseline(tmp_path_factory, "paramproj", _checkout)


def test_baseline_builds_every_target_and_then_nothing(baseline, tmp_path):
    where, result = baseline
    assert with_status(result, "built") == TARGETS, [r["error"] for r in result["targets"]]
    again = build(_checkout(tmp_path), copy_tree(where / "store", tmp_path / "store"))
    assert with_status(again, "cached") == TARGETS


@pytest.mark.parametrize("the_case", CASES, ids=lambda c: c.id)
def test_incremental_matches_fresh(baseline, tmp_path, the_case):
    where, first = baseline
    incremental, fresh = run_case(_checkout(tmp_path), where / "store", tmp_path, the_case)
    _, clean = assert_matches_fresh(incremental, fresh, the_case.rebuilt)
    changed = {t for t, arts in artifacts(first).items() if arts != clean[t]}
    assert changed == the_case.rebuilt, "the case's edit is not the change it names"
    shutil.rmtree(tmp_path / "fresh-store", ignore_errors=True)


_NAMED_KERNELS = '''\
from numba import cuda

import dev2


@cuda.jit
def scale(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = dev2.lin(a=x[i], b=1.0)


@cuda.jit
def shift(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = dev2.lin(x[i], 1.0)
'''
_LIN = "from numba import cuda\n\n\n@cuda.jit(device=True)\ndef lin(a, b):\n    return a * 2.0 + b\n"


def test_zero_config_rebuilds_only_the_kernel_whose_call_names_swapped_parameters(tmp_path):
    """Under `kbuild.enable()` alike: with `lin`'s names swapped, the kernel that calls it
    by name is built again, to a cold store's binary; the one calling it by place is
    served the binary it had."""
    from zeroconf_support import run, write_program

    root = write_program(tmp_path / "prog", kernels=_NAMED_KERNELS, dev2=_LIN)
    store = {"store": str(tmp_path / "store")}
    first = run(root, "kbuild", enable=store)
    (root / "dev2.py").write_text(_LIN.replace("def lin(a, b):\n    return a * 2.0 + b",
                                               "def lin(b, a):\n    return b * 2.0 + a"))
    again = run(root, "kbuild", enable=store)
    cold = run(root, "kbuild", enable={"store": str(tmp_path / "cold")})
    assert again["loads"] == cold["loads"], "a binary served that a cold store does not make"
    before, after = ({entry: binary for entry, _, binary in r["loads"]} for r in (first, again))
    moved = {entry for entry in after if after[entry] != before.get(entry)}
    assert len(moved) == 1 and "scale" in moved.pop(), (first["loads"], again["loads"])
    # The kernel calling by name is built again; the one calling by place is served.
    assert again["counts"]["built"] == 1 and again["nvvm"] < first["nvvm"], again
