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

import shutil
from pathlib import Path

import pytest

from editmatrix_support import build, case, copy_tree, replace, short

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


def _checkout(where: Path) -> Path:
    project = where / "proj"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    return project


def _artifacts(result: dict) -> dict:
    return {short(r["target"]): (r["artifacts"].get("ptx"), r["artifacts"].get("cubin"))
            for r in result["targets"]}


def _with_status(result: dict, status: str) -> set:
    return {short(r["target"]) for r in result["targets"] if r["status"] == status}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    where = tmp_path_factory.mktemp("dyn-baseline")
    project = _checkout(where)
    return where, build(project, where / "store")


def test_baseline_builds_every_target(baseline):
    _, result = baseline
    assert _with_status(result, "built") == TARGETS, [r["error"] for r in result["targets"]]


@pytest.mark.parametrize("the_case", STALE + PRECISE, ids=lambda c: c.id)
def test_incremental_matches_fresh(baseline, tmp_path, the_case):
    where, _ = baseline
    project = _checkout(tmp_path)
    copy_tree(where / "store", tmp_path / "store")
    the_case.apply(project)
    env = the_case.env
    incremental = build(project, tmp_path / "store", env_extra=env)
    fresh = build(project, tmp_path / "fresh-store", env_extra=env)
    assert incremental["summary"]["failed"] == 0 and fresh["summary"]["failed"] == 0, \
        [r["error"] for r in incremental["targets"] + fresh["targets"] if r.get("error")]
    now, clean = _artifacts(incremental), _artifacts(fresh)
    stale = {t for t in _with_status(incremental, "cached") if now[t] != clean[t]}
    assert not stale, f"stale binaries served for {sorted(stale)}"
    assert _with_status(incremental, "built") == the_case.rebuilt
    if the_case.rebuilt:  # the edit changes what the rebuilt targets compile to
        assert {t for t in the_case.rebuilt if now[t] != _artifacts(baseline[1])[t]}


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
    assert _with_status(first, "built") == {"k_two"}, [r["error"] for r in first["targets"]]
    assert _with_status(build(project, tmp_path / "store"), "cached") == {"k_two"}
    text = TWO_OVERLOADS
    a, b = text.index("@overload"), text.index("@overload", text.index("@overload") + 1)
    end = text.index("@cuda.jit")
    (project / "tw" / "kernels.py").write_text(text[:a] + text[b:end] + text[a:b] + text[end:])
    swapped = build(project, tmp_path / "store")
    assert _with_status(swapped, "built") == {"k_two"}


def test_the_namespace_globals_hands_out_records_reads_and_writes_through():
    """`globals()` during a compile is a dict `exec` takes, whose writes reach the module's
    namespace, and which notes each name read (a scan reads every name)."""
    from kbuild.backend.observe import _RecordingGlobals

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
