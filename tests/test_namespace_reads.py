"""Code numba runs while it types a kernel reads a module's names however it spells it.

Each channel below is an `@overload` whose typing function reads `consts.SCALE` (or a
value made from it) another way than `consts.SCALE`: past the module's class
(`inspect.getattr_static`, under any name), through the module's `__dict__`, through
code that `exec` or `eval` run (in the caller's namespace, in `vars(module)`, as a
function made from compiled code), through a read-only mapping proxy; and a file that
code `eval` runs opens. Editing SCALE (and the file) must rebuild every channel's kernel to a fresh build's bytes; a comment beside it
rebuilds nothing; for each backend. A function's `__globals__` (the module's own dict: no read of it can
be observed) fails its target, saying why, and that target only. numba's settings,
which NUMBA_* set, are read by value like a project module's.
"""

from __future__ import annotations

import pytest

from editmatrix_support import artifacts, build, reference, with_status
from mlir_support import MLIR, needs_mlir, port_config, port_sources
from support import WARM, WARM_MLIR

CONSTS = """\
import types

SCALE = 2.0
MP = types.MappingProxyType({"scale": 2.0})


def helper():
    return 1.0
"""

# channel -> the expression its typing function reads the value with
CHANNELS = {
    "attribute": "consts.SCALE",
    "getattr_static": "inspect.getattr_static(consts, 'SCALE')",
    "getattr_static_imported": "getattr_static(consts, 'SCALE')",
    "module_dict": "consts.__dict__['SCALE']",
    "eval_attribute": "eval('consts.SCALE')",
    "eval_own_global": "eval('EXT_SCALE')",
    "eval_in_vars": "eval('SCALE', vars(consts))",
    "exec_vars_into_locals": "_exec_read(vars(consts))",
    "exec_own_namespace": "_exec_own()",
    "function_of_compiled_code": "types.FunctionType(compile("
                                 "'def h():\\n    return SCALE\\n', 'h', 'exec')"
                                 ".co_consts[0], vars(consts))()",
    "mappingproxy": "consts.MP['scale']",
    # what code `eval` runs asks the system is observed too (not a module body's import)
    "eval_opens_a_file": "eval('float(open(GAIN_FILE).read())')",
}

EXT_HEAD = """\
import inspect
import os
import types
from inspect import getattr_static

from numba.cuda.extending import overload

from . import consts

EXT_SCALE = consts.SCALE
GAIN_FILE = os.path.join(os.path.dirname(__file__), "gain.txt")


def _exec_read(namespace):
    out = {}
    exec("value = SCALE", namespace, out)
    return out["value"]


def _exec_own():
    out = {}
    exec("value = EXT_SCALE", None, out)
    return out["value"]
"""

CHANNEL = """

def g_{name}():
    pass


@overload(g_{name}, target="cuda")
def _g_{name}():
    value = {expr}
    return lambda: value
"""

KERNEL = """

@cuda.jit
def k_{name}(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = x[i] * ext.g_{name}()
"""

RAW = "consts.helper.__globals__['SCALE']"


def _write(root, channels: dict):
    (root / "ns").mkdir(parents=True)
    (root / "ns" / "__init__.py").write_text("")
    (root / "ns" / "consts.py").write_text(CONSTS)
    (root / "ns" / "gain.txt").write_text("2.0\n")
    (root / "ns" / "ext.py").write_text(EXT_HEAD + "".join(
        CHANNEL.format(name=n, expr=e) for n, e in channels.items()))
    (root / "ns" / "kernels.py").write_text("from numba import cuda\n\nfrom . import ext\n" + "".join(
        KERNEL.format(name=n) for n in channels))
    (root / "kbuild.toml").write_text(
        '[project]\nname = "ns"\npaths = ["."]\narch = ["sm_80"]\n' + "".join(
            f'\n[kernels."ns.kernels:k_{n}"]\nsignatures = ["void(float64[::1], float64[::1])"]\n'
            for n in channels))
    return root


@pytest.fixture(scope="module", params=["numba-cuda", pytest.param(MLIR, marks=needs_mlir)])
def built(tmp_path_factory, request):
    """(project, store, first build, the reference builds' warm modules), per backend."""
    root = tmp_path_factory.mktemp("namespace")
    project = _write(root / "proj", CHANNELS)
    if request.param == MLIR:
        port_sources(project)
        port_config(project / "kbuild.toml")
    first = build(project, root / "store")
    assert with_status(first, "built") == {f"k_{n}" for n in CHANNELS}, \
        [r["error"] for r in first["targets"] if r.get("error")]
    return project, root / "store", first, WARM_MLIR if request.param == MLIR else WARM


def _edit(project, old, new, name="consts.py"):
    file = project / "ns" / name
    file.write_text(file.read_text().replace(old, new))


def test_every_channel_is_rebuilt_to_a_fresh_builds_bytes(built, tmp_path):
    project, store, first, warm = built
    _edit(project, "SCALE = 2.0", "SCALE = 3.0")
    _edit(project, '"scale": 2.0', '"scale": 3.0')
    _edit(project, "2.0", "3.0", "gain.txt")
    try:
        incremental = build(project, store)
        fresh = reference(project, tmp_path / "fresh", warm=warm)
    finally:
        _edit(project, "SCALE = 3.0", "SCALE = 2.0")
        _edit(project, '"scale": 3.0', '"scale": 2.0')
        _edit(project, "3.0", "2.0", "gain.txt")
    now, clean, before = artifacts(incremental), artifacts(fresh), artifacts(first)
    assert {t for t in now if now[t] != clean[t]} == set(), "stale binaries served"
    assert with_status(incremental, "built") == {f"k_{n}" for n in CHANNELS}
    assert {t for t in now if now[t] == before[t]} == set(), "a channel read no SCALE"


def test_a_comment_beside_the_value_rebuilds_nothing(built):
    project, store, _, _ = built
    consts = project / "ns" / "consts.py"
    text = consts.read_text()
    consts.write_text(text + "# a note\n")
    try:
        again = build(project, store)
    finally:
        consts.write_text(text)
    assert with_status(again, "built") == set()
    assert with_status(again, "cached") == {f"k_{n}" for n in CHANNELS}


def test_a_functions_globals_fail_that_target_only(tmp_path):
    project = _write(tmp_path / "proj", {"raw": RAW, "attribute": "consts.SCALE"})
    result = build(project, tmp_path / "store", "-k", expect_rc=1)
    assert with_status(result, "built") == {"k_attribute"}
    (row,) = [r for r in result["targets"] if r["status"] == "failed"]
    assert row["target"].endswith("k_raw")
    assert "consts.helper.__globals__" in row["error"] and "cannot follow" in row["error"]


SETTINGS_EXT = """\
import numba
from numba.cuda import config
from numba.cuda.extending import overload


def g_opt():
    pass


def g_warnings():
    pass


def g_none():
    pass


@overload(g_opt, target="cuda")
def _g_opt():
    value = 2.0 if numba.core.config.OPT == 3 else 5.0
    return lambda: value


@overload(g_warnings, target="cuda")
def _g_warnings():
    value = 2.0 if getattr(config, "DISABLE_PERFORMANCE_WARNINGS") else 5.0
    return lambda: value


@overload(g_none, target="cuda")
def _g_none():
    return lambda: 2.0
"""

SETTINGS = ("opt", "warnings", "none")

# A kernel that reads a setting itself: numba freezes the value into the code.
DIRECT = """

@cuda.jit
def k_direct(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = x[i] * config.DISABLE_PERFORMANCE_WARNINGS
"""


def test_numba_settings_read_while_typing_are_keyed_by_their_values(tmp_path):
    """numba's config holds what NUMBA_* set, not code pinned by numba's version: an
    overload or a kernel that reads it is rebuilt when the variable changes (OPT 3 -> 2
    changes nothing else numba-cuda compiles), one that reads none is not."""
    project = tmp_path / "proj"
    (project / "st").mkdir(parents=True)
    (project / "st" / "__init__.py").write_text("")
    (project / "st" / "ext.py").write_text(SETTINGS_EXT)
    (project / "st" / "kernels.py").write_text(
        "from numba import cuda\nfrom numba.core import config\n\nfrom . import ext\n" + "".join(
            KERNEL.format(name=n) for n in SETTINGS) + DIRECT)
    (project / "kbuild.toml").write_text(
        '[project]\nname = "st"\npaths = ["."]\narch = ["sm_80"]\n' + "".join(
            f'\n[kernels."st.kernels:k_{n}"]\nsignatures = ["void(float64[::1], float64[::1])"]\n'
            for n in SETTINGS + ("direct",)))
    before = {"NUMBA_OPT": "3", "NUMBA_DISABLE_PERFORMANCE_WARNINGS": "1"}
    after = {"NUMBA_OPT": "2", "NUMBA_DISABLE_PERFORMANCE_WARNINGS": "0"}
    first = build(project, tmp_path / "store", env_extra=before)
    assert with_status(first, "built") == {f"k_{n}" for n in SETTINGS + ("direct",)}
    incremental = build(project, tmp_path / "store", env_extra=after)
    fresh = reference(project, tmp_path / "fresh", env_extra=after)
    now, clean, then = artifacts(incremental), artifacts(fresh), artifacts(first)
    assert {t for t in now if now[t] != clean[t]} == set(), "stale binaries served"
    assert with_status(incremental, "built") == {"k_opt", "k_warnings", "k_direct"}
    assert {t for t in ("k_opt", "k_warnings", "k_direct") if now[t] == then[t]} == set()
