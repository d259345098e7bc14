"""What Python reads dynamically while numba types and lowers a kernel is keyed.

tests/dynproj: `@overload` implementations, an `@intrinsic`'s code generator and a
helper they call read constants by computed name (`getattr(module, name)`,
`globals()[...]`, `importlib.import_module(...).X`, an import inside the helper);
namedtuples take their fields from another module or from the environment at import;
a `link=` CUDA file includes a header found in the working directory. Each case edits
a copy of the built project, builds it incrementally against a copy of the store and
afresh into an empty store: no target may be served `cached` with other bytes than the
fresh build's, and exactly the targets the case names are built (an edit no compile
read, a comment beside an overload, rebuilds nothing).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from editmatrix_support import (
    artifacts, assert_matches_fresh, build, case, fresh_checkout, matrix_baseline, replace,
    run_case, with_status,
)
from spurious_support import check as check_spurious

HERE = Path(__file__).resolve().parent
PROJECT = HERE / "dynproj"
TARGETS = frozenset({"k_getattr", "k_globals", "k_import_module", "k_helper_import",
                     "k_intrinsic", "k_fields", "k_env_fields", "k_cwd_header", "k_methods",
                     "k_plain"})


def append(path: str, text: str):
    def edit(root: Path) -> None:
        with open(root / path, "a") as fh:
            fh.write(text)

    edit.__name__ = f"append to {path}"
    return edit


STALE = [
    case("getattr-computed-name", replace("dp/dconsts.py", "SCALE = 2.0", "SCALE = 2.5"),
         {"k_getattr"}),
    case("globals-subscript", replace("dp/ext.py", "GAIN = 1.5", "GAIN = 1.75"), {"k_globals"}),
    case("import-module-attribute", replace("dp/dconsts.py", "OFFSET = 1.0", "OFFSET = 1.25"),
         {"k_import_module", "k_intrinsic"}),
    case("import-inside-helper", replace("dp/hconsts.py", "H = 0.25", "H = 0.375"),
         {"k_helper_import"}),
    case("namedtuple-fields-from-module",
         replace("dp/dconsts.py", 'FIELDS = ("a", "b")', 'FIELDS = ("b", "a")'), {"k_fields"}),
    case("namedtuple-fields-from-env", lambda root: None, {"k_env_fields"},
         env={"DP_FIELDS": "b a"}),
    case("header-in-working-directory", replace("cwd_gain.h", "3.0f", "4.0f"), {"k_cwd_header"}),
    case("overload-method-constant", replace("dp/dconsts.py", "TWIST = 0.5", "TWIST = 0.75"),
         {"k_methods"}),
]

PRECISE = [
    case("comment-in-constants-module", append("dp/dconsts.py", "# a comment\n"), set()),
    case("comment-in-extension-module", append("dp/ext.py", "# a comment\n"), set()),
    case("unrelated-global-beside-globals-reader", append("dp/ext.py", "UNUSED = 3\n"), set()),
    case("comment-in-lazily-imported-module", append("dp/hconsts.py", "# note\n"), set()),
]


_checkout = functools.partial(fresh_checkout, PROJECT)  # where -> the copy at where/proj


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    return matrix_baseline(tmp_path_factory, "dynproj", _checkout)


def test_baseline_builds_every_target(baseline):
    _, result = baseline
    assert with_status(result, "built") == TARGETS, [r["error"] for r in result["targets"]]


@pytest.mark.parametrize("the_case", STALE + PRECISE, ids=lambda c: c.id)
def test_incremental_matches_fresh(baseline, tmp_path, the_case):
    where, _ = baseline
    incremental, fresh = run_case(_checkout(tmp_path), where / "store", tmp_path, the_case,
                                  the_case.env)
    now, _ = assert_matches_fresh(incremental, fresh, the_case.rebuilt)
    check_spurious("dynamic", the_case.id, baseline[1], incremental)
    if the_case.rebuilt:  # the edit changes what the rebuilt targets compile to
        assert {t for t in the_case.rebuilt if now[t] != artifacts(baseline[1])[t]}


TWO_OVERLOADS = '''
from numba import cuda, types
from numba.cuda.extending import overload


def f(x):
    pass


@overload(f, target="cuda")
def ol_f(x):
    if isinstance(x, types.Float):
        return lambda x: x * 2.0


@overload(f, target="cuda")
def ol_f(x):  # noqa: F811 - a second registration of the same name, for integers
    if isinstance(x, types.Integer):
        return lambda x: x + 1


@cuda.jit
def k_two(x, n):
    x[0] = f(x[0]) + f(n[0])
'''


def test_two_overloads_of_one_function_are_keyed_in_registration_order(tmp_path):
    """Two `@overload`s of one function (one per type) build and cache, never fall back;
    swapping their order is another key."""
    project = tmp_path / "two"
    (project / "tw").mkdir(parents=True)
    (project / "tw" / "__init__.py").write_text("")
    (project / "tw" / "kernels.py").write_text(TWO_OVERLOADS)
    (project / "kbuild.toml").write_text(
        '[project]\nname = "two"\npaths = ["."]\narch = ["sm_80"]\n\n'
        '[kernels."tw.kernels:k_two"]\nsignatures = ["void(float32[::1], int32[::1])"]\n')
    first = build(project, tmp_path / "store")
    assert with_status(first, "built") == {"k_two"}, [r["error"] for r in first["targets"]]
    assert with_status(build(project, tmp_path / "store"), "cached") == {"k_two"}
    text = TWO_OVERLOADS
    a, b = text.index("@overload"), text.index("@overload", text.index("@overload") + 1)
    end = text.index("@cuda.jit")
    (project / "tw" / "kernels.py").write_text(text[:a] + text[b:end] + text[a:b] + text[end:])
    swapped = build(project, tmp_path / "store")
    assert with_status(swapped, "built") == {"k_two"}


def test_the_namespace_globals_hands_out_records_reads_and_writes_through():
    """`globals()` during a compile is a dict `exec` takes, whose writes reach the module's
    namespace, and which notes each name read (a scan reads every name)."""
    from kbuild.backend.observe.reads import _RecordingGlobals

    class Seen:
        def __init__(self):
            self.names = []

        def read(self, module, name):
            self.names.append((module, name))

    namespace, seen = {"__name__": "m", "A": 1, "B": 2}, Seen()
    view = _RecordingGlobals(namespace, seen)
    exec("C = A + 1", view)
    assert namespace["C"] == 2 and seen.names == [("m", "A")]
    view["D"] = 4
    del view["B"]
    assert namespace == {"__name__": "m", "A": 1, "C": 2, "D": 4}
    seen.names.clear()
    assert set(dict(view.items())) >= set(namespace)
    assert {n for _, n in seen.names} == {"A", "C", "D"}


INSTALLED_CLASS = '''
class Codec:
    WIDTH = 2.0

    def __init__(self):
        # As cffi.FFI does: the first instance sets class attributes.
        if not hasattr(Codec, "READY"):
            Codec.READY = True
'''

READS_INSTALLED_CLASS = '''
import importlib

from numba import cuda
from numba.cuda.extending import intrinsic, overload


def widen(x):
    pass


@overload(widen, target="cuda")
def ol_widen(x):
    w = importlib.import_module("lazycodec").Codec.WIDTH

    def impl(x):
        return x * w

    return impl


@intrinsic
def touch(typingctx, x):
    def codegen(context, builder, sig, args):
        importlib.import_module("lazycodec").Codec()  # only while lowering
        return args[0]

    return x(x), codegen


@cuda.jit
def k_widen(x):
    x[0] = widen(touch(x[0]))
'''


def test_an_installed_class_an_overload_reads_is_keyed_by_its_code(tmp_path):
    """An overload reads a class of an installed package whose first instance (made only
    while the kernel is lowered, as numba's cffi support makes cffi.FFI's) adds class
    attributes: the class is keyed by its package's code, the same at the compile and
    at every later check, so a no-op build is `cached`; an edit of that code rebuilds."""
    project, vendor = tmp_path / "inst", tmp_path / "vendor"
    (project / "ic").mkdir(parents=True)
    vendor.mkdir()
    (vendor / "lazycodec.py").write_text(INSTALLED_CLASS)
    (project / "ic" / "__init__.py").write_text("")
    (project / "ic" / "kernels.py").write_text(READS_INSTALLED_CLASS)
    (project / "kbuild.toml").write_text(
        '[project]\nname = "inst"\npaths = ["."]\narch = ["sm_80"]\n\n'
        '[kernels."ic.kernels:k_widen"]\nsignatures = ["void(float32[::1])"]\n')
    env, store = {"PYTHONPATH": str(vendor)}, tmp_path / "store"
    first = build(project, store, env_extra=env)
    assert with_status(first, "built") == {"k_widen"}, [r["error"] for r in first["targets"]]
    again = build(project, store, env_extra=env)
    assert with_status(again, "cached") == {"k_widen"}, [r.get("reason") for r in again["targets"]]
    (vendor / "lazycodec.py").write_text(INSTALLED_CLASS.replace("2.0", "3.0"))
    edited = build(project, store, env_extra=env)
    assert with_status(edited, "built") == {"k_widen"}
    assert artifacts(edited) != artifacts(first)


def test_an_installed_class_digests_the_same_before_and_after_its_first_instance(
        tmp_path, monkeypatch):
    """The digest of an installed class read while compiling is taken right after the
    compile, and at the next check in a fresh process: a class that adds attributes when
    first instantiated (cffi.FFI) must digest the same both times, and differently once
    its code changes."""
    import sys

    from kbuild.backend.observe import Current
    from kbuild.keying.observed import Kind
    from kbuild.sources import ProjectSources

    (tmp_path / "proj").mkdir()
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    (vendor / "lazycodec.py").write_text(INSTALLED_CLASS)
    monkeypatch.syspath_prepend(str(vendor))
    monkeypatch.delitem(sys.modules, "lazycodec", raising=False)
    sources = ProjectSources([str(tmp_path / "proj")])

    def now():
        return Current(sources, tmp_path / "proj")(Kind.READ, "lazycodec:Codec")

    before = now()
    import lazycodec

    lazycodec.Codec()
    assert lazycodec.Codec.READY and now() == before
    (vendor / "lazycodec.py").write_text(INSTALLED_CLASS.replace("2.0", "3.0"))
    monkeypatch.delitem(sys.modules, "lazycodec")
    assert now() != before


def test_modules_of_every_module_class_have_their_reads_observed(tmp_path, monkeypatch):
    """A module whose class is not plain ModuleType - a module's own subclass (properties
    on the module), a lazily loaded one (importlib.util.LazyLoader) - is observed like any
    other while compiling, and has its own class back after; a lazy module first loaded
    during the compile stays loaded."""
    import importlib.util
    import sys
    import types

    from kbuild.backend.observe import Observer
    from kbuild.backend.observe.reads import _module_reads
    from kbuild.keying.observed import Kind

    class WithProperty(types.ModuleType):
        @property
        def SCALE(self):  # noqa: N802 - a module constant, computed
            return 2.0

    own = types.ModuleType("dyn_own")
    own.__class__ = WithProperty
    monkeypatch.setitem(sys.modules, "dyn_own", own)
    (tmp_path / "dyn_lazy.py").write_text("GAIN = 1.5\n")
    spec = importlib.util.spec_from_file_location("dyn_lazy", tmp_path / "dyn_lazy.py")
    spec.loader = importlib.util.LazyLoader(spec.loader)
    lazy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "dyn_lazy", lazy)
    spec.loader.exec_module(lazy)
    lazy_class = type(lazy)
    assert lazy_class is not types.ModuleType
    (tmp_path / "dyn_idle.py").write_text("GAIN = 2.5\n")
    spec = importlib.util.spec_from_file_location("dyn_idle", tmp_path / "dyn_idle.py")
    spec.loader = importlib.util.LazyLoader(spec.loader)
    idle = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "dyn_idle", idle)
    spec.loader.exec_module(idle)

    observer = Observer()
    with _module_reads(observer):
        assert own.SCALE == 2.0 and lazy.GAIN == 1.5
    assert {(Kind.READ, "dyn_own:SCALE"), (Kind.READ, "dyn_lazy:GAIN")} <= set(observer.names)
    assert type(own) is WithProperty and type(lazy) is types.ModuleType  # loaded meanwhile
    assert type(idle) is lazy_class  # never read: still lazy, with its own class back
    assert lazy.GAIN == 1.5 and idle.GAIN == 2.5


_THREADS = '''
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from numba import cuda
from numba.extending import overload

import kbuild_threads_consts as consts

BEGUN, DONE = threading.Event(), threading.Event()
EARLIER = ThreadPoolExecutor(1)  # a pool whose thread runs before any compile
EARLIER.submit(int).result()


def scale(x):
    pass


@overload(scale)
def ol_scale(x):
    BEGUN.set()  # the program's other thread reads now, while this compiles
    assert DONE.wait(30)
    with ThreadPoolExecutor(1) as pool:  # a thread this compile starts: its reads count
        mine = pool.submit(lambda: consts.MINE + float(os.environ.get("KB_MINE", "0"))).result()
    mine += EARLIER.submit(lambda: consts.HANDED).result()  # work handed to it: counts
    return lambda x: x * mine


@cuda.jit
def k(x):
    x[0] = scale(x[0])


def the_programs_own():
    BEGUN.wait(30)
    try:
        return (consts.OTHER, getattr(consts, "ALSO"), vars(consts)["MINE"],
                os.environ.get("KB_OTHER"), globals()["BEGUN"])
    finally:
        DONE.set()
'''


def test_what_the_programs_other_threads_read_while_a_kernel_compiles_is_no_input_of_it(
        tmp_path, monkeypatch):
    """A compile observes its own thread, those it starts and the work it hands a thread
    pool made earlier; another thread of the program reading modules, globals or the
    environment meanwhile (a server's, a dask worker's heartbeat) neither enters the
    compile's record nor is walked for it."""
    import sys
    import threading

    import numba

    from editmatrix_support import load_module
    from kbuild.backend.backends import DEFAULT, get
    from kbuild.keying.observed import Kind

    (tmp_path / "kbuild_threads_consts.py").write_text("MINE = 2.0\nOTHER = 3.0\nALSO = 4.0\nHANDED = 0.5\n")
    (tmp_path / "kbuild_threads.py").write_text(_THREADS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("KB_MINE", "0.5")
    monkeypatch.setenv("KB_OTHER", "1")
    try:
        load_module(tmp_path / "kbuild_threads_consts.py", "kbuild_threads_consts")
        module = load_module(tmp_path / "kbuild_threads.py", "kbuild_threads")
        backend = get(DEFAULT)
        observer = backend.observer(root=tmp_path)
        other = threading.Thread(target=module.the_programs_own)
        other.start()
        made = backend.compile(module.k, [numba.float32[::1]], (8, 0), observer=observer)
        other.join()
    finally:
        for name in ("kbuild_threads", "kbuild_threads_consts"):
            sys.modules.pop(name, None)
    assert made.ptx.startswith(b"//")
    names = set(observer.names)
    assert {(Kind.READ, "kbuild_threads_consts:MINE"), (Kind.ENV, "KB_MINE"),
            (Kind.READ, "kbuild_threads_consts:HANDED")} <= names
    theirs = {n for n in names if "OTHER" in n[1] or "ALSO" in n[1] or "BEGUN" in n[1]}
    assert not theirs, theirs
