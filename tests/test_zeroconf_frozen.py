"""Zero-config keys what numba compiles with, not live state numba had frozen.

numba-cuda freezes some state when a function is decorated (its options: `opt` from
`config.OPT`; its signature with its default values) and reads other state when it
compiles (`config.BOUNDSCHECK`, after reloading `NUMBA_*` variables the program set).
Each case runs the program in a fresh process against a store, changes one thing,
runs it again against that store and once more against an empty one: the binary the
second run loads must be the one a fresh run makes, and it compiles only where what
numba compiles changed.
"""

from __future__ import annotations

import pytest

from zeroconf_support import run, write_program

MATHLIB = """\
from numba import cuda


@cuda.jit(device=True)
def twice(v, k=2.0):
    return v * k
"""

KERNELS = """\
from numba import cuda

import mathlib


@cuda.jit
def scale(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = mathlib.twice(x[i])


@cuda.jit(lineinfo=True)
def shift(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] + 1.0
"""


def _program(root, after_import: str = "", mathlib: str = MATHLIB):
    """The program; `after_import` runs in app_kernels after its kernels are made."""
    return write_program(root, kernels=KERNELS + after_import, mathlib=mathlib)


def _loaded(report, name):
    return [d for entry, kind, d in report["loads"] if name in entry]


def _runs(tmp_path, before: dict, after: dict):
    """(incremental, fresh) reports of the program as `after` makes it, the incremental
    one against the store a run of the program as `before` made."""
    store, root = tmp_path / "store", tmp_path / "prog"  # one folder: line info names it
    first = run(_program(root, **before), "kbuild", enable={"store": str(store)})
    assert first["counts"]["built"] == 2, first["stderr"]
    changed = _program(root, **after)
    incremental = run(changed, "kbuild", enable={"store": str(store)})
    fresh = run(changed, "kbuild", enable={"store": str(tmp_path / "fresh")})
    return first, incremental, fresh


def _same_as_fresh(incremental, fresh):
    for name in ("scale", "shift"):
        assert _loaded(incremental, name) == _loaded(fresh, name), f"{name}: stale binary"


REPLACED = "\nmathlib.twice.py_func.__defaults__ = (3.0,)\n"


def test_defaults_replaced_after_decoration_change_nothing(tmp_path):
    """numba folds the omitted `k` with the default it recorded at decoration (2.0):
    replacing `__defaults__` afterwards compiles nothing new."""
    first, incremental, fresh = _runs(tmp_path, {}, {"after_import": REPLACED})
    _same_as_fresh(incremental, fresh)
    assert incremental["nvvm"] == 0 and "built" not in incremental["counts"]
    assert _loaded(incremental, "scale") == _loaded(first, "scale")


def test_default_edited_in_source_under_replaced_defaults_is_rebuilt(tmp_path):
    """The source's default changes (2.0 -> 5.0) while the program replaces
    `__defaults__` with the same value both times: numba compiles with 5.0."""
    edited = MATHLIB.replace("k=2.0", "k=5.0")
    first, incremental, fresh = _runs(tmp_path, {"after_import": REPLACED},
                                      {"after_import": REPLACED, "mathlib": edited})
    _same_as_fresh(incremental, fresh)
    assert incremental["counts"].get("built") == 1
    assert _loaded(incremental, "scale") != _loaded(first, "scale")


OPT_OFF = "\nfrom numba.cuda import config\nconfig.OPT = 0\n"


def test_config_opt_set_after_decoration_changes_nothing_without_debug_info(tmp_path):
    """`opt` is frozen into each dispatcher when it is made; config.OPT set later only
    reaches the debug information of functions compiled with lineinfo/debug (`shift`)."""
    first, incremental, fresh = _runs(tmp_path, {}, {"after_import": OPT_OFF})
    _same_as_fresh(incremental, fresh)
    # shift is rebuilt: its line information says isOptimized (its PTX changes; early
    # cutoff may still find the same cubin).
    assert incremental["counts"].get("built") == 1
    assert _loaded(incremental, "scale") == _loaded(first, "scale")


BOUNDSCHECK = "\nimport os\nos.environ['NUMBA_BOUNDSCHECK'] = '1'\n"


def test_numba_variable_set_by_the_program_is_read_as_the_compile_reads_it(tmp_path):
    """numba reloads NUMBA_* variables when a compile starts: a program that sets
    NUMBA_BOUNDSCHECK after importing numba compiles bounds-checked kernels: the key
    says so (both kernels keyed anew)."""
    first, incremental, fresh = _runs(tmp_path, {}, {"after_import": BOUNDSCHECK})
    _same_as_fresh(incremental, fresh)
    assert incremental["counts"].get("built") == 2


@pytest.fixture(autouse=True)
def _no_inherited_numba_variables(monkeypatch):
    for name in ("NUMBA_BOUNDSCHECK", "NUMBA_OPT"):
        monkeypatch.delenv(name, raising=False)
