"""Configuration objects that compile-time Python reads are keyed by content.

tests/cfgproj: `@overload`s read a frozen dataclass instance, a dataclass nested in
another, a settings object through a property, a `SimpleNamespace` and a
`functools.partial` while numba types the kernels; one logs through a module's logger,
takes a lock and calls an `lru_cache`d helper (keyed as the function it wraps); one
reads a file beside a `pathlib.Path` (keyed by where it is in the project: every case
builds a checkout at another path, so a key holding the checkout's path would rebuild
it); one reads numpy's `finfo` (numpy's class by name, its public state by value); one
fills a module's memo dict while it runs (its reads are digested as numba's compile first
met them, not as the compile left them: a fresh process starts with the dict empty). Each such object is keyed by what it
holds (its attributes, in name order; a partial's function, arguments and keywords) and
by its class's code (its methods and property getters by their trees, what a
dataclass generates by its code; not its module's other bytes), never refused as "cannot key by content" nor keyed by identity.
Each case edits a copy of the built project, builds incrementally against a copy of the
store and afresh into an empty store: no target is served `cached` with other bytes
than the fresh build's, and exactly the targets the case names are built.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from editmatrix_support import (
    artifacts, assert_matches_fresh, build, case, fresh_checkout, replace, run_case, with_status,
)

PROJECT = Path(__file__).resolve().parent / "cfgproj"
TARGETS = frozenset({"k_dataclass", "k_nested", "k_property", "k_namespace", "k_partial",
                     "k_logged", "k_path", "k_finfo", "k_memo", "k_plain"})
SETTINGS = "cp/settings.py"

CASES = [
    case("dataclass-field-default", replace(SETTINGS, "scale: float = 2.0", "scale: float = 2.5"),
         {"k_dataclass"}),
    case("dataclass-instance-argument", replace(SETTINGS, "SCALING = Scaling()",
                                                "SCALING = Scaling(scale=3.0)"),
         {"k_dataclass"}),
    case("nested-dataclass-value", replace(SETTINGS, "OUTER = Outer(Inner())",
                                           "OUTER = Outer(Inner(gain=0.75))"), {"k_nested"}),
    case("property-code", replace(SETTINGS, "return self._factor", "return self._factor * 2"),
         {"k_property"}),
    case("property-state", replace(SETTINGS, "self._factor = 3.0", "self._factor = 3.5"),
         {"k_property"}),
    case("namespace-value", replace(SETTINGS, "bias=1.5", "bias=2.5"), {"k_namespace"}),
    case("partial-argument", replace(SETTINGS, "partial(_times, 4.0)", "partial(_times, 5.0)"),
         {"k_partial"}),
    case("partial-function-body", replace(SETTINGS, "return a * b", "return a * b + 1.0"),
         {"k_partial"}),
    case("cached-helper-body", replace(SETTINGS, "return 0.25 * n", "return 0.5 * n"),
         {"k_logged"}),
    case("file-beside-a-path", replace("cp/weight.txt", "1.25", "1.5"), {"k_path"}),
    case("comment-in-settings-module", replace(SETTINGS, "def _times(a, b):",
                                               "# used by TIMES_FOUR\ndef _times(a, b):"), set()),
    case("comment-in-overloads-module", replace("cp/ext.py", "def scaled(x):",
                                                "# reads settings.SCALING\ndef scaled(x):"),
         set()),
]


_checkout = functools.partial(fresh_checkout, PROJECT)  # where -> the copy at where/proj


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    where = tmp_path_factory.mktemp("cfg-baseline")
    return where, build(_checkout(where), where / "store")


def test_every_kernel_reading_a_configuration_object_builds(baseline):
    _, result = baseline
    assert with_status(result, "built") == TARGETS, [r["error"] for r in result["targets"]]


@pytest.mark.parametrize("the_case", CASES, ids=lambda c: c.id)
def test_incremental_matches_fresh(baseline, tmp_path, the_case):
    where, first = baseline
    incremental, fresh = run_case(_checkout(tmp_path), where / "store", tmp_path, the_case)
    now, _ = assert_matches_fresh(incremental, fresh, the_case.rebuilt)
    # The edit changes what the rebuilt targets compile to (the case tests something).
    assert all(now[t] != artifacts(first)[t] for t in the_case.rebuilt)
