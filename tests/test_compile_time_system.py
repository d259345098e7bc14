"""What compile-time Python asks the system is keyed, however it asks, and whenever numba
first ran it.

tests/sysproj: `@overload`s decide what numba compiles from a stat (`os.path.exists`),
a file read through `pathlib`, numpy or a package's loader (`pkgutil.get_data`), a
folder listing, a scan of the environment, a variable read by name (through a name bound
to `os.environ` at import, through `os.environb`, in an answer numba keeps and reuses for
a second kernel), a module constant read by computed name from an
overload that an eager kernel's import already ran (directly, through a device function
numba already compiled, and through an eager device function, which numba never compiles
again), a file read in a thread the overload starts, a subprocess, a process started as
multiprocessing starts one, and a socket. Each case changes one input of a copy of the built
project, builds incrementally against a copy of the store and afresh into an empty store:
no target is served `cached` with other bytes than the fresh build's, exactly the targets
the case names rebuild, and a process started while compiling fails its target, saying
why.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from pathlib import Path

import pytest

from editmatrix_support import (
    build, case, copy_tree, fresh_checkout, matrix_baseline, reference, replace, short,
)

HERE = Path(__file__).resolve().parent
PROJECT = HERE / "sysproj"
BUILT = frozenset({"k_flag", "k_table", "k_weights", "k_packaged", "k_plugins", "k_scan",
                   "k_alias", "k_gain_a", "k_gain_b", "k_eager", "k_eager_dev", "k_dev_eager",
                   "k_threaded"})
FAILED = frozenset({"k_shell", "k_spawned", "k_socket"})  # processes, a socket


def touch(path: str):
    def edit(root: Path) -> None:
        (root / path).write_text("")

    edit.__name__ = f"create {path}"
    return edit


def remove(path: str):
    def edit(root: Path) -> None:
        (root / path).unlink()

    edit.__name__ = f"remove {path}"
    return edit


STALE = [
    case("stat-of-a-new-file", touch("fast.flag"), {"k_flag"}),
    case("file-read-through-pathlib", replace("table.txt", "0.5", "0.75"), {"k_table"}),
    case("file-read-through-numpy", replace("weights.txt", "1.5", "2.5"), {"k_weights"}),
    case("file-read-in-a-thread-the-overload-starts", replace("threaded.txt", "1.25", "1.5"),
         {"k_threaded"}),
    case("file-read-through-a-package-loader", replace("sp/data.txt", "0.25", "0.5"),
         {"k_packaged"}),
    case("file-added-to-a-listed-folder", touch("plugins/b.txt"), {"k_plugins"}),
    case("file-removed-from-a-listed-folder", remove("plugins/a.txt"), {"k_plugins"}),
    case("variable-in-a-scanned-environment", lambda root: None, {"k_scan"},
         env={"SP_OPT_FAST": "1"}),
    case("variable-read-through-a-name-bound-at-import", lambda root: None,
         {"k_alias", "k_scan"}, env={"SP_ALIAS": "3.0"}),
    case("variable-read-by-bytes-name", lambda root: None, {"k_alias", "k_scan"},
         env={"SP_BYTES": "0.5"}),
    case("variable-read-by-a-kept-answer", lambda root: None,
         {"k_gain_a", "k_gain_b", "k_scan"}, env={"SP_GAIN": "3.0"}),
    case("constant-read-by-an-overload-an-eager-import-ran",
         replace("sp/consts.py", "SCALE = 2.0", "SCALE = 2.5"),
         {"k_eager", "k_eager_dev", "k_dev_eager"}),
]

PRECISE = [
    case("unrelated-file-in-the-project", touch("notes.txt"), set()),
    case("unrelated-variable-beside-a-named-read", lambda root: None, {"k_scan"},
         env={"SP_OTHER": "1"}),
]

# k_scan's compile read every variable (a scan): any variable set rebuilds it, to the
# same bytes when no SP_OPT_* variable changed. The named readers rebuild only for theirs.
SAME_BYTES = {"variable-read-by-a-kept-answer": {"k_scan"},
              "variable-read-through-a-name-bound-at-import": {"k_scan"},
              "variable-read-by-bytes-name": {"k_scan"},
              "unrelated-variable-beside-a-named-read": {"k_scan"}}


_checkout = functools.partial(fresh_checkout, PROJECT)  # where -> the copy at where/proj


def _rows(result: dict) -> dict:
    return {short(r["target"]): r for r in result["targets"]}


def _artifacts(result: dict) -> dict:
    return {t: (r["artifacts"] or {}).get("ptx") for t, r in _rows(result).items()}


def _with_status(result: dict, status: str) -> set:
    return {t for t, r in _rows(result).items() if r["status"] == status}


def _clean_env() -> dict:
    # The cases set SP_*; the runner's own environment must not. k_scan's compile reads the
    # whole environment, so pytest's per-test variable would change it in every case, and
    # the worker's name (PYTEST_XDIST_WORKER) in every case run by another worker than the
    # one that built the baseline (a template, built once per run).
    return {k: None for k in os.environ if k.startswith(("SP_", "PYTEST_"))}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, shared_home):
    # -j1: every kernel compiles in one process, so k_gain_b is typed from the answer
    # numba kept for k_gain_a. k_shell, k_spawned and k_socket fail (exit 1): they start
    # processes or ask a service.
    return matrix_baseline(tmp_path_factory, "sysproj", _checkout, "-k", "-j1",
                           env=lambda project: _clean_env(), expect_rc=1)


def test_baseline_builds_every_target_and_refuses_a_process(baseline):
    _, result = baseline
    assert _with_status(result, "built") == BUILT, \
        [r["error"] for r in result["targets"] if r["error"]]
    assert _with_status(result, "failed") == FAILED
    shell, spawned = _rows(result)["k_shell"], _rows(result)["k_spawned"]
    assert "ran a subprocess (cat)" in shell["error"]
    assert "module constant" in shell["error"]  # what to do instead
    assert "started a process (multiprocessing)" in spawned["error"]
    assert "connected to a socket (127.0.0.1:9)" in _rows(result)["k_socket"]["error"]


@pytest.mark.parametrize("the_case", STALE + PRECISE, ids=lambda c: c.id)
def test_incremental_matches_fresh(baseline, tmp_path, the_case):
    where, _ = baseline
    project = _checkout(tmp_path)
    copy_tree(where / "store", tmp_path / "store")
    the_case.apply(project)
    env = {**_clean_env(), **the_case.env}
    incremental = build(project, tmp_path / "store", "-k", "-j1", env_extra=env,
                        expect_rc=1)
    fresh = reference(project, tmp_path / "fresh-store", "-k", env_extra=env, expect_rc=1)
    assert _with_status(incremental, "failed") == FAILED == _with_status(fresh, "failed")
    now, clean = _artifacts(incremental), _artifacts(fresh)
    stale = {t for t in _with_status(incremental, "cached") if now[t] != clean[t]}
    assert not stale, f"stale binaries served for {sorted(stale)}"
    assert _with_status(incremental, "built") == the_case.rebuilt
    before = _artifacts(baseline[1])
    changed = the_case.rebuilt - SAME_BYTES.get(the_case.id, set())
    # the change changes what the rebuilt targets compile to
    assert {t for t in the_case.rebuilt if now[t] != before[t]} == changed


def test_a_build_run_in_a_subfolder_reads_relative_paths_from_there(baseline, tmp_path):
    """`kbuild build` in a folder below the project's compiles there: an overload's
    `Path("table.txt")` and `np.loadtxt("weights.txt")` read that folder's files, as
    numba run there would. The working directory is observed with such reads: the
    targets that read them rebuild to a fresh build's bytes there, and back in the
    project's folder the first build's binaries are served again."""
    where, first = baseline
    project = _checkout(tmp_path)
    copy_tree(where / "store", tmp_path / "store")
    (project / "sp" / "table.txt").write_text("5.0\n")
    (project / "sp" / "weights.txt").write_text("7.0\n")
    env = _clean_env()
    there = build(project, tmp_path / "store", "-k", "-j1", env_extra=env, expect_rc=1,
                  cwd=project / "sp")
    fresh = build(project, tmp_path / "fresh-store", "-k", "-j1", env_extra=env,
                  expect_rc=1, cwd=project / "sp")
    now, clean = _artifacts(there), _artifacts(fresh)
    assert not {t for t in _with_status(there, "cached") if now[t] != clean[t]}
    assert {"k_table", "k_weights"} <= _with_status(there, "built")
    assert now["k_table"] != _artifacts(first)["k_table"]
    back = build(project, tmp_path / "store", "-k", "-j1", env_extra=env, expect_rc=1)
    assert _with_status(back, "cached") == BUILT
    assert _artifacts(back) == _artifacts(first)


def _write_project(root: Path, name: str, module: str, kernels, files: dict) -> None:
    """A project of its own at `root`: kbuild.toml declaring `kernels` of `module` (each
    taking one float32 array), and `files` (path -> text)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "kbuild.toml").write_text(
        f'[project]\nname = "{name}"\npaths = ["."]\narch = ["sm_80"]\n' + "".join(
            f'[kernels."{module}:{k}"]\nsignatures = ["void(float32[::1])"]\n'
            for k in kernels))
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


SCRATCH_KERNELS = ("k_side", "k_runpy", "k_scratch", "k_db")
SCRATCH_PROJECT = {
    "values.json": '{"k": 2.0}',
    "cfg.py": 'import json\n\nK = json.load(open("values.json"))["k"]\n',
    "ov.py": '''\
import contextlib
import json
import os
import pathlib
import runpy
import tempfile

from numba import cuda
from numba.core.extending import overload


def side(x):
    pass


@overload(side)
def ol_side(x):
    k = float(pathlib.Path(os.environ["SCRATCH_SIDE"]).read_text())  # outside the project
    return lambda x: x * k


def configured(x):
    pass


@overload(configured)
def ol_configured(x):
    k = runpy.run_path("cfg.py")["K"]  # what cfg.py's code reads is this overload's
    return lambda x: x + k


def scratch(x):
    pass


@overload(scratch)
def ol_scratch(x):
    # Temporaries written and read back: the compile's own output, no input.
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "gen.json")
        with open(path + ".part", "w") as f:
            json.dump({"k": 3.0}, f)
        os.replace(path + ".part", path)
        k = json.loads(pathlib.Path(path).read_text())["k"] + len(os.listdir(folder))
    return lambda x: x * k


def stored(x):
    pass


@overload(stored)
def ol_stored(x):
    import sqlite3

    with contextlib.closing(sqlite3.connect("values.db")) as db:  # read by sqlite, in C
        (k,) = db.execute("select k from t").fetchone()
    return lambda x: x - k


@cuda.jit
def k_side(a):
    a[0] = side(a[0])


@cuda.jit
def k_runpy(a):
    a[0] = configured(a[0])


@cuda.jit
def k_scratch(a):
    a[0] = scratch(a[0])


@cuda.jit
def k_db(a):
    a[0] = stored(a[0])
''',
}


def _store_value(path: Path, k: float) -> None:
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("create table if not exists t (k real)")
        db.execute("delete from t")
        db.execute("insert into t values (?)", (k,))


def test_files_outside_the_project_and_runpy_are_inputs_and_scratch_files_are_not(tmp_path):
    """A file in the temporary folder outside the project is an input like any other (a
    side file named by a variable); what a file `runpy` runs reads is the overload's;
    temporaries the compile writes and reads back (a folder made, a file written,
    renamed into place, listed) are its own output: a no-op build serves every target; a
    database sqlite reads (in C, no `open` seen) is a file read."""
    project = tmp_path / "proj"
    _write_project(project, "scratch", "ov", SCRATCH_KERNELS, SCRATCH_PROJECT)
    _store_value(project / "values.db", 0.5)
    side_file = tmp_path / "side.txt"  # beside the project: under the temporary folder
    side_file.write_text("1.5")
    env, store = {**_clean_env(), "SCRATCH_SIDE": str(side_file)}, tmp_path / "store"
    first = build(project, store, env_extra=env)
    everything = set(SCRATCH_KERNELS)
    assert _with_status(first, "built") == everything
    assert _with_status(build(project, store, env_extra=env), "cached") == everything, \
        "a compile's own temporaries rebuilt it, or sqlite's file did"
    for edit, rebuilt in ((lambda: side_file.write_text("2.5"), "k_side"),
                          (lambda: (project / "values.json").write_text('{"k": 4.0}'),
                           "k_runpy"),
                          (lambda: _store_value(project / "values.db", 0.75), "k_db")):
        before = _artifacts(build(project, store, env_extra=env))
        edit()
        after = build(project, store, env_extra=env)
        assert _with_status(after, "built") == {rebuilt}, after["targets"]
        assert _artifacts(after)[rebuilt] != before[rebuilt]


ROOT_LISTING_KERNELS = '''\
import os

from numba import cuda
from numba.core.extending import overload


def plugged(x):
    pass


@overload(plugged)
def ol_plugged(x):
    k = 1.0 + sum(name.endswith(".plug") for name in os.listdir("."))
    return lambda x: x * k


@cuda.jit
def k_root(a):
    a[0] = plugged(a[0])
'''


def test_the_project_root_listed_is_named_from_the_root_in_a_moved_checkout(tmp_path):
    """An overload that lists the project's own folder (the working directory) names it
    from the root, as every other path under it: a checkout elsewhere is served from the
    same store, and a file added to its root rebuilds the target there to a fresh build's
    bytes (named by the first checkout's absolute path, the listing that was checked was
    the first checkout's, and a stale binary was served)."""
    first, store = tmp_path / "a" / "proj", tmp_path / "store"
    _write_project(first, "rootlist", "rl", ["k_root"], {"rl.py": ROOT_LISTING_KERNELS})
    built = build(first, store, env_extra=_clean_env())
    assert _with_status(built, "built") == {"k_root"}
    moved = fresh_checkout(first, tmp_path / "b")
    served = build(moved, store, env_extra=_clean_env())
    assert _with_status(served, "cached") == {"k_root"}
    assert _artifacts(served) == _artifacts(built)
    (moved / "extra.plug").write_text("")
    after = build(moved, store, env_extra=_clean_env())
    fresh = build(moved, tmp_path / "fresh-store", env_extra=_clean_env())
    assert _with_status(after, "built") == {"k_root"}, "a stale binary was served"
    assert _artifacts(after) == _artifacts(fresh) != _artifacts(built)


CACHED_KERNELS = '''\
import functools
import json
import os

from numba import cuda
from numba.core.extending import overload

HERE = os.path.dirname(__file__)


@functools.cache
def settings():
    with open(os.path.join(HERE, "settings.json")) as f:
        return json.load(f)


WIDTH = settings()["width"]  # answered at import: what it read no compile saw


class Table:
    @staticmethod
    @functools.cache
    def rows():
        with open(os.path.join(HERE, "table.json")) as f:
            return json.load(f)["rows"]


ROWS = Table.rows()  # a class's cached method, answered at import too


@functools.lru_cache(maxsize=4)
def limits(kind):
    with open(os.path.join(HERE, "limits.json")) as f:
        return json.load(f)[kind]


def scaled(x):
    pass


def first(x):
    pass


def second(x):
    pass


@overload(scaled)
def ol_scaled(x):
    k = settings()["k"] * WIDTH + Table.rows()
    return lambda x: x * k


@overload(first)
def ol_first(x):
    k = limits("hi")
    return lambda x: x + k


@overload(second)
def ol_second(x):
    k = limits("hi") * 2.0  # answered from what the first compile kept
    return lambda x: x - k


@cuda.jit
def k_warm(a):
    a[0] = scaled(a[0])


@cuda.jit
def k_first(a):
    a[0] = first(a[0])


@cuda.jit
def k_second(a):
    a[0] = second(a[0])
'''


def test_answers_a_functools_cache_kept_are_keyed_by_what_made_them(tmp_path):
    """A `functools.cache`/`lru_cache` helper (a module's, a class's static method) answers
    a call it has seen from what it kept, reading nothing again. Kept from the module's
    import, the answer is keyed by its value (what made it no compile saw); kept from an
    earlier compile in the same process (-j1), it hands on what that compile read. Either
    way an edit of the file behind it rebuilds exactly its kernels, to a fresh build's
    bytes (each was served stale: the helper was keyed by its code alone), and a no-op
    build rebuilds nothing."""
    project, store = tmp_path / "proj", tmp_path / "store"
    _write_project(project, "cached", "ck.kernels", ("k_warm", "k_first", "k_second"), {
        "ck/__init__.py": "", "ck/kernels.py": CACHED_KERNELS,
        "ck/settings.json": '{"k": 2.0, "width": 3}', "ck/limits.json": '{"hi": 4.0}',
        "ck/table.json": '{"rows": 1.0}'})
    env = _clean_env()
    everything = {"k_warm", "k_first", "k_second"}
    first = build(project, store, "-j1", env_extra=env)
    assert _with_status(first, "built") == everything
    for full in ((), ("--full",)):  # answered by the journal, and keyed in full
        assert _with_status(build(project, store, "-j1", *full, env_extra=env),
                            "cached") == everything
    for rel, text, rebuilt in (("settings.json", '{"k": 2.5, "width": 3}', {"k_warm"}),
                               ("table.json", '{"rows": 1.5}', {"k_warm"}),
                               ("limits.json", '{"hi": 5.0}', {"k_first", "k_second"})):
        before = _artifacts(build(project, store, "-j1", env_extra=env))
        (project / "ck" / rel).write_text(text)
        after = build(project, store, "-j1", env_extra=env)
        fresh = build(project, tmp_path / f"fresh-{rel}", "-j1", env_extra=env)
        assert _with_status(after, "built") == rebuilt, f"{rel}: a stale binary was served"
        assert _artifacts(after) == _artifacts(fresh)
        assert {t for t in rebuilt if _artifacts(after)[t] != before[t]} == rebuilt


FILLED_KERNELS = '''\
import dataclasses
import json
import os
import types

from numba import cuda
from numba.core.extending import overload

HERE = os.path.dirname(__file__)


def load(name):
    with open(os.path.join(HERE, name)) as f:
        return json.load(f)


_TABLE = None  # a global the first compile that asks sets


def table():
    global _TABLE
    if _TABLE is None:
        _TABLE = load("table.json")
    return _TABLE


_LOADED = {}  # a module's dict each compile that asks fills


def loaded(name):
    if name not in _LOADED:
        _LOADED[name] = load(name)
    return _LOADED[name]


class Limits:  # a class attribute made on first use
    @classmethod
    def get(cls):
        if "memo" not in vars(cls):
            cls.memo = load("limits.json")
        return cls.memo


class Settings:  # an object's attribute filled on first use
    def __init__(self):
        self.values = None

    def get(self):
        if self.values is None:
            self.values = load("settings.json")
        return self.values


SETTINGS = Settings()
FLAGS = types.SimpleNamespace(on=None)


def _scales():
    memo = None

    def scales():  # a closure's memo
        nonlocal memo
        if memo is None:
            memo = load("limits.json")
        return memo
    return scales


scales = _scales()


@dataclasses.dataclass
class Part:
    k: float


_PARTS = []  # a list appended to, of an object with no content form of its own


def part():
    if not _PARTS:
        _PARTS.append(Part(**load("parts.json")))
    return _PARTS[0]


def ratio():  # a function's attribute
    if not hasattr(ratio, "memo"):
        ratio.memo = load("limits.json")["hi"] / 8.0
    return ratio.memo
_SEEN = {}  # filled by one overload, only read by another


def with_table(x):
    pass


def with_table_too(x):
    pass


def with_loaded(x):
    pass


def with_limits(x):
    pass


def with_settings(x):
    pass


def with_seen(x):
    pass


def with_scales(x):
    pass


def with_ratio(x):
    pass


def with_part(x):
    pass


def with_part_too(x):
    pass


@overload(with_table)
def ol_with_table(x):
    k = table()["k"]
    return lambda x: x * k


@overload(with_table_too)
def ol_with_table_too(x):
    k = table()["k"] + 1.0  # answered from what the first compile filled (-j1)
    return lambda x: x * k


@overload(with_loaded)
def ol_with_loaded(x):
    k = loaded("table.json")["k"] + 2.0
    _SEEN["k"] = k
    return lambda x: x * k


@overload(with_limits)
def ol_with_limits(x):
    hi = Limits.get()["hi"]
    return lambda x: min(x, hi)


@overload(with_settings)
def ol_with_settings(x):
    if FLAGS.on is None:
        FLAGS.on = SETTINGS.get()["on"]
    k = 2.0 if FLAGS.on else 1.0
    return lambda x: x * k


@overload(with_seen)
def ol_with_seen(x):
    k = _SEEN.get("k", 0.0)
    return lambda x: x + k


@overload(with_scales)
def ol_with_scales(x):
    k = scales()["hi"] * ratio()
    return lambda x: x * k


@overload(with_ratio)
def ol_with_ratio(x):
    k = ratio() + 1.0
    return lambda x: x * k


@overload(with_part)
def ol_with_part(x):
    k = part().k
    return lambda x: x * k


@overload(with_part_too)
def ol_with_part_too(x):
    k = part().k + 1.0
    return lambda x: x * k
''' + "".join(f'''

@cuda.jit
def k_{name}(a):
    a[0] = with_{name}(a[0])
''' for name in ("table", "table_too", "loaded", "limits", "settings", "seen", "scales",
                   "ratio", "part", "part_too"))


def _filled_project(root: Path, name: str, kernels) -> None:
    """A project of `kernels` of FILLED_KERNELS, with the files its memos load."""
    _write_project(root, name, "fl.kernels", kernels, {
        "fl/__init__.py": "", "fl/kernels.py": FILLED_KERNELS,
        "fl/table.json": '{"k": 2.0}', "fl/limits.json": '{"hi": 4.0}',
        "fl/settings.json": '{"on": true}', "fl/parts.json": '{"k": 1.5}'})


def test_state_a_compile_fills_is_keyed_as_the_program_made_it(tmp_path):
    """Compile-time code that keeps what it loaded (a global set from None, a module's
    dict entry, a list appended to, a class's, an object's and a function's attribute, a
    closure's cell, filled on first use) leaves state a new process does not have until
    its own compile fills it: keyed as the program made it (empty), with what the filling
    compile read handed to every compile read from it. A no-op build, keyed in full,
    rebuilds none of them (each rebuilt on every build); an edit of the file behind one
    rebuilds its kernels to a fresh build's bytes, those answered from what an earlier
    compile filled (-j1) too (served stale): the second user of a memo, and an overload
    reading what another one filled."""
    project, store = tmp_path / "proj", tmp_path / "store"
    kernels = ["k_limits", "k_loaded", "k_part", "k_part_too", "k_ratio", "k_scales",
               "k_seen", "k_settings", "k_table", "k_table_too"]
    _filled_project(project, "filled", kernels)
    env = _clean_env()
    assert _with_status(build(project, store, "-j1", env_extra=env), "built") == set(kernels)
    for full in ((), ("--full",)):  # answered by the journal, and keyed in full
        served = _with_status(build(project, store, "-j1", *full, env_extra=env), "cached")
        assert served == set(kernels), f"rebuilt, nothing changed: {set(kernels) - served}"
    for rel, text, rebuilt in (
            ("table.json", '{"k": 2.5}', {"k_table", "k_table_too", "k_loaded", "k_seen"}),
            ("limits.json", '{"hi": 5.0}', {"k_limits", "k_ratio", "k_scales"}),
            ("settings.json", '{"on": false}', {"k_settings"}),
            ("parts.json", '{"k": 2.5}', {"k_part", "k_part_too"})):
        before = _artifacts(build(project, store, "-j1", env_extra=env))
        (project / "fl" / rel).write_text(text)
        after = build(project, store, "-j1", env_extra=env)
        fresh = build(project, tmp_path / f"fresh-{rel}", "-j1", env_extra=env)
        assert _with_status(after, "built") == rebuilt, f"{rel}: a stale binary was served"
        assert _artifacts(after) == _artifacts(fresh)
        assert {t for t in kernels if _artifacts(after)[t] != before[t]} == rebuilt


def test_a_compile_that_reads_what_a_served_compile_wrote_sees_it_written(tmp_path):
    """An overload that fills state (`_SEEN["k"] = k`) and another that only reads it: a
    build compiling both in order gives the reader the filled state. When the filler is
    served from the store and the reader must be compiled (its options edited), the
    filler's compile runs again first, in that process, so the reader sees what a fresh
    build's does (it saw the state empty, and that binary was then served as current)."""
    project = tmp_path / "proj"
    kernels = ["k_loaded", "k_seen", "k_table"]
    _filled_project(project, "served", kernels)
    env, source = _clean_env(), project / "fl" / "kernels.py"
    for option, jobs in (("fastmath=True", "-j1"), ("lineinfo=True", "-j2")):
        source.write_text(FILLED_KERNELS)
        store = tmp_path / f"store-{jobs}"
        assert _with_status(build(project, store, "-j1", env_extra=env), "built") == \
            set(kernels)
        source.write_text(FILLED_KERNELS.replace("@cuda.jit\ndef k_seen(",
                                                 f"@cuda.jit({option})\ndef k_seen("))
        after = build(project, store, jobs, env_extra=env)
        fresh = build(project, tmp_path / f"fresh-{jobs}", "-j1", env_extra=env)
        assert _with_status(after, "built") == {"k_seen"}
        assert _artifacts(after) == _artifacts(fresh), f"{option} {jobs}: a stale binary"
    # The filler's helper broken (its compile fails, the reader is compiled seeing nothing
    # filled), then mended: the reader's earlier build, which read more, is taken again.
    broken = source.read_text()
    assert broken.count("os.path.join(HERE, name)") == 1
    source.write_text(broken.replace("os.path.join(HERE, name)", "os.path.join(name, HERE)"))
    failing = build(project, store, "-j1", "-k", env_extra=env, expect_rc=1)
    assert "k_seen" in _with_status(failing, "built")
    source.write_text(broken)
    assert _artifacts(build(project, store, "-j1", env_extra=env)) == _artifacts(fresh), \
        "the reader built while its filler failed was served after the filler was mended"
    # A filler that would be linked from stored objects (a device function it calls was
    # edited) is compiled instead, ahead of the reader, as in a fresh build.
    bumped = FILLED_KERNELS + BUMP_KERNELS
    _write_project(project, "served", "fl.kernels", ["k_a_bump", "k_b_loaded", "k_seen"],
                   {"fl/kernels.py": bumped})
    build(project, tmp_path / "store-bump", "-j1", env_extra=env)
    source.write_text(bumped.replace("x + 1.0", "x + 2.0").replace(
        "@cuda.jit\ndef k_seen(", "@cuda.jit(fastmath=True)\ndef k_seen("))
    after = build(project, tmp_path / "store-bump", "-j1", env_extra=env)
    fresh = build(project, tmp_path / "fresh-bump", "-j1", env_extra=env)
    assert _with_status(after, "built") == {"k_a_bump", "k_b_loaded", "k_seen"}
    assert _artifacts(after) == _artifacts(fresh), "a filler linked: a stale binary"


def test_a_reader_built_without_its_fillers_state_is_built_again_in_order(tmp_path):
    """A reader of state another compile fills (`_SEEN`) compiled where that compile did
    not run before it (another worker of a `-j2` build, fresh or not), or served from a
    build where the filler failed once its filler compiles again (an edit of the file it
    loads), is compiled again after the build, in order, with the filler's compile run
    first: the build gives a fresh `-j1` build's bytes, and the next build compiles
    nothing."""
    project = tmp_path / "proj"
    kernels = ["k_loaded", "k_seen", "k_table"]
    _filled_project(project, "order", kernels)
    env, source, store = _clean_env(), project / "fl" / "kernels.py", tmp_path / "store"
    table = project / "fl" / "table.json"

    def settled(jobs, why):
        after = build(project, store, jobs, env_extra=env)
        fresh = build(project, tmp_path / f"fresh-{table.read_text()}", "-j1", env_extra=env)
        assert _artifacts(after) == _artifacts(fresh), f"{why}: a stale binary"
        assert _with_status(build(project, store, jobs, env_extra=env), "cached") == \
            set(kernels), f"{why}: rebuilt, nothing changed"

    settled("-j1", "in order")
    # A fresh -j2 build: the reader compiled in another worker than its filler.
    in_order = build(project, store, "-j1", env_extra=env)
    assert _artifacts(build(project, tmp_path / "fresh-j2", "-j2", env_extra=env)) == \
        _artifacts(in_order), "a fresh -j2 build is not the -j1 build"
    key = _rows(in_order)["k_loaded"]["key"]
    entry = store / "v1" / "entries" / key[:2] / f"{key}.json"
    assert json.loads(entry.read_text())["fills"] == ["fl.kernels:_LOADED", "fl.kernels:_SEEN"]
    # The filler's helper broken (the reader is built seeing nothing filled), mended, and
    # the file the filler loads edited.
    broken = FILLED_KERNELS.replace("os.path.join(HERE, name)", "os.path.join(name, HERE)")
    source.write_text(broken)
    failing = build(project, store, "-j1", "-k", env_extra=env, expect_rc=1)
    assert "k_seen" in _with_status(failing, "built")
    source.write_text(FILLED_KERNELS)
    settled("-j1", "mended")
    table.write_text('{"k": 2.5}')
    settled("-j1", "the reader built while its filler failed, served once it compiled")
    # Edited again: filler and reader compile in two workers.
    table.write_text('{"k": 3.0}')
    settled("-j2", "the reader compiled in another worker than its filler")




@pytest.mark.parametrize("jobs", ["-j1", "-j2"])
def test_a_reader_built_alone_is_built_again_once_its_filler_runs_ahead(tmp_path, jobs):
    """The reader's options changed and only it built (`kbuild build TARGET`): it reads
    `_SEEN` empty, as a fresh build of it alone does, and its new key's record holds only
    that. A full build then runs its filler ahead of it (served): the reader's names,
    digested again with the filler's holders probed, say it reads one, so it is compiled
    again, in order, to a fresh build's bytes; the next build compiles nothing."""
    project, store, env = tmp_path / "proj", tmp_path / "store", _clean_env()
    kernels = ["k_loaded", "k_seen", "k_table"]
    _filled_project(project, "alone", kernels)
    build(project, store, "-j1", env_extra=env)
    edited = FILLED_KERNELS.replace("@cuda.jit\ndef k_seen(", "@cuda.jit(fastmath=True)\ndef k_seen(")
    assert edited != FILLED_KERNELS
    (project / "fl" / "kernels.py").write_text(edited)
    alone = build(project, store, "-j1", "fl.kernels:k_seen", env_extra=env)
    assert _with_status(alone, "built") == {"k_seen"}
    after = build(project, store, jobs, env_extra=env)
    fresh = build(project, tmp_path / "fresh", "-j1", env_extra=env)
    assert _artifacts(after) == _artifacts(fresh), "the reader built alone served: stale"
    assert _with_status(build(project, store, jobs, env_extra=env), "cached") == set(kernels)

CLOSURE_KERNELS = '''
import json
import os

from numba import cuda
from numba.core.extending import overload


def _box():  # a cell two closures share, set from None by one
    seen = None

    def put(v):
        nonlocal seen
        seen = v

    def get():
        return seen
    return put, get


def _bag():  # a dict in a cell, filled in place by one closure
    bag = {}

    def put(k, v):
        bag[k] = v

    def get(k):
        return bag.get(k)
    return put, get


put_seen, get_seen = _box()
put_bag, get_bag = _bag()


def fill(x):
    pass


def read_cell(x):
    pass


def read_bag(x):
    pass


@overload(fill)
def ol_fill(x):
    with open(os.path.join(os.path.dirname(__file__), "table.json")) as f:
        k = json.load(f)["k"]
    put_seen(k)
    put_bag("k", k)
    return lambda x: x * k


@overload(read_cell)
def ol_read_cell(x):
    k = get_seen() or 0.0
    return lambda x: x + k


@overload(read_bag)
def ol_read_bag(x):
    k = get_bag("k") or 0.0
    return lambda x: x + k


@cuda.jit
def k_a_fill(a):
    a[0] = fill(a[0])


@cuda.jit
def k_cell(a):
    a[0] = read_cell(a[0])


@cuda.jit
def k_bag(a):
    a[0] = read_bag(a[0])
'''


def test_state_a_compile_fills_in_a_closure_is_read_in_order(tmp_path):
    """Readers of what one compile fills through closures (a cell set from None, a dict a
    cell holds, each reached by two functions): a fresh `-j2` build is the `-j1` build
    (the readers compiled in another worker are probed through the cells), the filler's
    entry names every holder it fills by every name that reaches it, and an edit of the
    file the filler loads rebuilds all three to a fresh build's bytes, with `-j1` and
    `-j2`; a no-op compiles nothing."""
    project, store, env = tmp_path / "proj", tmp_path / "store", _clean_env()
    kernels = ["k_a_fill", "k_cell", "k_bag"]
    _write_project(project, "closures", "cl.kernels", kernels, {
        "cl/__init__.py": "", "cl/kernels.py": CLOSURE_KERNELS, "cl/table.json": '{"k": 2.0}'})
    table = project / "cl" / "table.json"
    one = build(project, store, "-j1", env_extra=env)
    assert _artifacts(build(project, tmp_path / "fresh-j2", "-j2", env_extra=env)) == \
        _artifacts(one), "a fresh -j2 build is not the -j1 build"
    key = _rows(one)["k_a_fill"]["key"]
    entry = store / "v1" / "entries" / key[:2] / f"{key}.json"
    assert json.loads(entry.read_text())["fills"] == [
        "cl.kernels:get_bag", "cl.kernels:get_seen", "cl.kernels:put_bag", "cl.kernels:put_seen"]
    for jobs, k in (("-j1", "3.0"), ("-j2", "4.0")):
        table.write_text(f'{{"k": {k}}}')
        after = build(project, store, jobs, env_extra=env)
        assert _with_status(after, "built") == set(kernels), jobs
        fresh = build(project, tmp_path / f"fresh-{k}", "-j1", env_extra=env)
        assert _artifacts(after) == _artifacts(fresh), f"{jobs}: a stale binary"
        assert _with_status(build(project, store, jobs, env_extra=env), "cached") == \
            set(kernels), f"{jobs}: rebuilt, nothing changed"

BUMP_KERNELS = '''

from numba import types as nbtypes  # noqa: E402
from numba.core.extending import intrinsic  # noqa: E402


@intrinsic
def times_loaded(typingctx, x):
    k = loaded("table.json")["k"] + 3.0
    _SEEN["k"] = k

    def codegen(context, builder, signature, args):
        return builder.fmul(args[0], context.get_constant(nbtypes.float32, k))
    return x(x), codegen


@cuda.jit(device=True)
def bump(x):
    return x + 1.0


@cuda.jit
def k_a_bump(a):
    a[0] = bump(a[0])


@cuda.jit
def k_b_loaded(a):
    a[0] = bump(times_loaded(a[0]))
'''

MODULE_KERNELS = '''\
import importlib.util

from numba import cuda
from numba.core.extending import overload


def tried(x):
    pass


def tried_too(x):
    pass


def specced(x):
    pass


def lazy(x):
    pass


@overload(tried)
def ol_tried(x):
    try:
        import mo_extra  # noqa: F401 - an optional dependency: absent at first
        k = 2.0
    except ImportError:
        k = 3.0
    return lambda x: x * k


@overload(tried_too)
def ol_tried_too(x):
    try:
        import mo_extra  # noqa: F401 - loaded by the first compile once it exists (-j1)
        k = 4.0
    except ImportError:
        k = 5.0
    return lambda x: x * k


@overload(specced)
def ol_specced(x):
    k = 6.0 if importlib.util.find_spec("mo.extra") is not None else 7.0
    return lambda x: x * k


@overload(lazy)
def ol_lazy(x):
    from . import later  # noqa: F401 - a submodule no one imported before, imported for
    return lambda x: x * 1.5  # what it registers (nothing here)
''' + "".join(f'''

@cuda.jit
def k_{name}(a):
    a[0] = {name}(a[0])
''' for name in ("tried", "tried_too", "specced", "lazy"))


def test_which_modules_the_import_system_finds_is_keyed(tmp_path):
    """Whether compile-time code finds a module (an optional dependency tried in `try:
    import`, `importlib.util.find_spec`) decides what numba compiles: a module added
    where an import failed, or removed where one was found, rebuilds exactly the kernels
    that asked, to a fresh build's bytes (both were served stale), those answered from a
    module an earlier compile loaded (-j1) too. A submodule an overload imports lazily
    (`from . import later`) rebuilds nothing when nothing changed (keyed in full, it was
    rebuilt on every build)."""
    project, store = tmp_path / "proj", tmp_path / "store"
    kernels = {"k_tried", "k_tried_too", "k_specced", "k_lazy"}
    _write_project(project, "modules", "mo.kernels", sorted(kernels), {
        "mo/__init__.py": "", "mo/kernels.py": MODULE_KERNELS, "mo/extra.py": "",
        "mo/later.py": ""})
    env = _clean_env()
    assert _with_status(build(project, store, env_extra=env), "built") == kernels
    for options in (("--full",), ("-j1", "--full")):
        served = _with_status(build(project, store, *options, env_extra=env), "cached")
        assert served == kernels, f"rebuilt, nothing changed: {kernels - served}"
    for what, edit, rebuilt in (
            ("added", lambda: (project / "mo_extra.py").write_text(""),
             {"k_tried", "k_tried_too"}),
            ("removed", lambda: (project / "mo" / "extra.py").unlink(), {"k_specced"})):
        before = _artifacts(build(project, store, "-j1", env_extra=env))
        edit()
        after = build(project, store, "-j1", env_extra=env)
        fresh = build(project, tmp_path / f"fresh-{what}", "-j1", env_extra=env)
        assert _with_status(after, "built") == rebuilt, f"module {what}: a stale binary"
        assert _artifacts(after) == _artifacts(fresh)
        assert {t for t in kernels if _artifacts(after)[t] != before[t]} == rebuilt


GROUPED_KERNELS = '''\
import json
import os

from numba import cuda
from numba.core.extending import overload

HERE = os.path.dirname(__file__)
_GROUPS = {}  # a memo two levels deep: the first compile makes a group, the next adds


def grouped(name):
    group = _GROUPS.setdefault("json", {})
    if name not in group:
        with open(os.path.join(HERE, name)) as f:
            group[name] = json.load(f)
    return group[name]


def first(x):
    pass


def second(x):
    pass


@overload(first)
def ol_first(x):
    k = grouped("a.json")["k"]
    return lambda x: x * k


@overload(second)
def ol_second(x):
    k = grouped("b.json")["k"]
    return lambda x: x * k


_DEVICES = {}  # device functions a compile makes and keeps


def device(name):
    if name not in _DEVICES:
        k = grouped(name)["k"]
        _DEVICES[name] = cuda.jit(device=True)(lambda x: x * k)
    return _DEVICES[name]


def third(x):
    pass


@overload(third)
def ol_third(x):
    scaled = device("c.json")
    return lambda x: scaled(x)


@cuda.jit
def k_first(a):
    a[0] = first(a[0])


@cuda.jit
def k_third(a):
    a[0] = third(a[0])


@cuda.jit
def k_second(a):
    a[0] = second(a[0])
'''


def test_a_deeper_memo_and_a_kept_device_function_are_keyed_as_the_program_made_them(tmp_path):
    """A memo two levels deep (`_GROUPS.setdefault(g, {})[name] = load()`): the first
    compile makes the group, the next fill it further in place; and a device function a
    compile makes and keeps (`_DEVICES[n] = cuda.jit(device=True)(...)`). All stay state
    the compiles made (-j1: no-op builds serve every kernel; the later users of the group
    and the device function's kernel were rebuilt on every build), and an edit of the
    file behind one rebuilds its kernel to a fresh build's bytes."""
    project, store = tmp_path / "proj", tmp_path / "store"
    kernels = {"k_first", "k_second", "k_third"}
    _write_project(project, "grouped", "gr.kernels", sorted(kernels), {
        "gr/__init__.py": "", "gr/kernels.py": GROUPED_KERNELS, "gr/a.json": '{"k": 2.0}',
        "gr/b.json": '{"k": 3.0}', "gr/c.json": '{"k": 4.0}'})
    env = _clean_env()
    assert _with_status(build(project, store, "-j1", env_extra=env), "built") == kernels
    for full in ((), ("--full",)):
        served = _with_status(build(project, store, "-j1", *full, env_extra=env), "cached")
        assert served == kernels, f"rebuilt, nothing changed: {kernels - served}"
    for rel, text, changed in (("b.json", '{"k": 3.5}', "k_second"),
                               ("c.json", '{"k": 4.5}', "k_third")):
        before = build(project, store, "-j1", env_extra=env)
        (project / "gr" / rel).write_text(text)
        after = build(project, store, "-j1", env_extra=env)
        fresh = build(project, tmp_path / f"fresh-{rel}", "-j1", env_extra=env)
        assert changed in _with_status(after, "built"), f"{rel}: a stale binary"
        assert _artifacts(after) == _artifacts(fresh)
        assert _artifacts(after)[changed] != _artifacts(before)[changed]


# -- under zero configuration --------------------------------------------------------------

FLAG_KERNELS = '''\
import os

from numba import cuda
from numba.core.extending import overload


def flagged(x):
    pass


@overload(flagged)
def ol_flagged(x):
    if os.path.exists("fast.flag"):
        return lambda x: x * 3.0
    return lambda x: x * 2.0


@cuda.jit
def scale(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = flagged(x[i])
'''


def test_zero_config_rebuilds_when_a_path_an_overload_tested_appears(tmp_path):
    """A lazily launched kernel whose overload tests a path: served warm while the path is
    absent (journal on), rebuilt when it appears, to a fresh store's binary."""
    from zeroconf_support import run, write_program

    root = write_program(tmp_path / "prog", kernels=FLAG_KERNELS)
    store = tmp_path / "store"
    first = run(root, "kbuild", ("scale",), enable={"store": str(store)})
    assert first["counts"] == {"built": 1, "served": 1}, first
    warm = run(root, "kbuild", ("scale",), enable={"store": str(store)})
    assert warm["nvvm"] == 0 and warm["loads"] == first["loads"]
    (root / "fast.flag").write_text("")
    flagged = run(root, "kbuild", ("scale",), enable={"store": str(store)})
    fresh = run(root, "kbuild", ("scale",), enable={"store": str(tmp_path / "fresh")})
    assert flagged["counts"]["built"] == 1 and flagged["loads"] == fresh["loads"]
    assert flagged["loads"] != first["loads"]


MEMO_KERNELS = '''\
import json
import os

from numba import cuda
from numba.core.extending import overload

_TABLE = None


def table():
    global _TABLE
    if _TABLE is None:
        with open(os.path.join(os.path.dirname(__file__), "table.json")) as f:
            _TABLE = json.load(f)
    return _TABLE


def gain(x):
    pass


def bias(x):
    pass


@overload(gain)
def ol_gain(x):
    k = table()["k"]
    return lambda x: x * k


@overload(bias)
def ol_bias(x):
    b = table()["k"] + 1.0  # answered from what the first compile filled
    return lambda x: x + b


@cuda.jit
def scale(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = gain(x[i])


@cuda.jit
def shift(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = bias(x[i])
'''


def test_zero_config_keys_a_memo_the_first_launch_filled_as_the_program_made_it(tmp_path):
    """Two kernels launched in one process whose overloads share a memo the first one's
    compile fills: the next run serves both (each was rebuilt on every run); an edit of
    the file behind it rebuilds both, the one answered from the memo too (served stale),
    to a fresh store's binaries."""
    from zeroconf_support import run, write_program

    root = write_program(tmp_path / "prog", kernels=MEMO_KERNELS)
    (root / "table.json").write_text('{"k": 2.0}')
    store = tmp_path / "store"
    first = run(root, "kbuild", enable={"store": str(store)})
    assert first["counts"] == {"built": 2, "served": 2}, first
    for journal in (True, False):
        warm = run(root, "kbuild", enable={"store": str(store), "journal": journal})
        assert warm["nvvm"] == 0 and warm["loads"] == first["loads"], warm["counts"]
    (root / "table.json").write_text('{"k": 3.0}')
    edited = run(root, "kbuild", enable={"store": str(store)})
    fresh = run(root, "kbuild", enable={"store": str(tmp_path / "fresh")})
    assert edited["counts"]["built"] == 2, edited["counts"]
    assert edited["loads"] == fresh["loads"]


SEEN_KERNELS = '''\
import json
import os

from numba import cuda
from numba.core.extending import overload

_SEEN = {}  # filled by one overload, only read by another


def fill(x):
    pass


def seen(x):
    pass


@overload(fill)
def ol_fill(x):
    with open(os.path.join(os.path.dirname(__file__), "table.json")) as f:
        k = json.load(f)["k"]
    _SEEN["k"] = k
    return lambda x: x * k


@overload(seen)
def ol_seen(x):
    k = _SEEN.get("k", 0.0)
    return lambda x: x + k


@cuda.jit
def filler(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = fill(x[i])


@cuda.jit
def reader(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = seen(x[i])
'''


def test_zero_config_runs_a_served_writers_compile_before_one_that_reads_its_state(tmp_path):
    """The program launches `filler`, whose overload fills a dict, then `reader`, whose
    overload only reads it. With `reader`'s options edited (or `reader` new to the
    program), `filler` is served and `reader` compiled: `filler`'s compile runs first
    again (its output unused), so `reader` sees the dict as numba's JIT and a fresh store
    do (it saw it empty, and that binary was then served as current), journal on or off."""
    from zeroconf_support import run, write_program

    root = write_program(tmp_path / "prog", kernels=SEEN_KERNELS)
    (root / "table.json").write_text('{"k": 2.0}')
    edited = SEEN_KERNELS.replace("@cuda.jit\ndef reader(", "@cuda.jit(fastmath=True)\ndef reader(")
    both = ("filler", "reader")
    for journal, first in ((True, both), (False, both), (True, ("filler",))):
        store, settings = tmp_path / f"store-{journal}{len(first)}", {"journal": journal}
        (root / "app_kernels.py").write_text(SEEN_KERNELS)
        run(root, "kbuild", first, enable=dict(settings, store=str(store)))
        if len(first) == 2:
            (root / "app_kernels.py").write_text(edited)
        now = run(root, "kbuild", both, enable=dict(settings, store=str(store)))
        fresh = run(root, "kbuild", both,
                    enable=dict(settings, store=str(tmp_path / f"fresh-{journal}{len(first)}")))
        assert now["counts"]["built"] == 1, now["counts"]
        assert now["loads"] == fresh["loads"], f"journal {journal}, {first}: a stale binary"

def test_zero_config_serves_a_reader_as_the_program_filled_its_state(tmp_path):
    """A program that launches `reader` before `filler` in one run and after it in the
    next: `reader` sees the dict empty in one and filled in the other, as numba's JIT and
    a fresh store do. Its entry built in one order is not served in the other (it was,
    both ways, from the first run's binary), journal on or off; run again in either
    order, it is served."""
    from zeroconf_support import run, write_program

    root = write_program(tmp_path / "prog", kernels=SEEN_KERNELS)
    (root / "table.json").write_text('{"k": 2.0}')
    forward, backward = ("filler", "reader"), ("reader", "filler")
    for journal in (True, False):
        store, settings = tmp_path / f"store-{journal}", {"journal": journal}
        for step, order in enumerate((forward, backward, forward, backward, forward)):
            now = run(root, "kbuild", order, enable=dict(settings, store=str(store)))
            fresh = run(root, "kbuild", order, enable=dict(
                settings, store=str(tmp_path / f"fresh-{journal}-{step}")))
            assert now["loads"] == fresh["loads"], f"journal {journal}, {order}: stale"
            assert now["counts"].get("built", 0) == (2 if step == 0 else 1 if step == 1 else 0), \
                (journal, order, now["counts"])



def test_zero_config_does_not_serve_a_reader_built_alone_once_the_program_fills_its_state(
        tmp_path):
    """The reader's options changed and a run launched it alone: built reading the dict
    empty, its new key's record says nothing of the dict. The next run launches the
    filler first: the reader's names, digested again as the program holds them, say it
    reads the dict filled, so that entry is not served; it is built, and served after."""
    from zeroconf_support import run, write_program

    root = write_program(tmp_path / "prog", kernels=SEEN_KERNELS)
    (root / "table.json").write_text('{"k": 2.0}')
    edited = SEEN_KERNELS.replace("@cuda.jit\ndef reader(", "@cuda.jit(fastmath=True)\ndef reader(")
    assert edited != SEEN_KERNELS
    both = ("filler", "reader")
    for journal in (True, False):
        store, settings = tmp_path / f"store-{journal}", {"journal": journal}
        (root / "app_kernels.py").write_text(SEEN_KERNELS)
        run(root, "kbuild", both, enable=dict(settings, store=str(store)))
        (root / "app_kernels.py").write_text(edited)
        run(root, "kbuild", ("reader",), enable=dict(settings, store=str(store)))
        for step, built in enumerate((1, 0)):
            now = run(root, "kbuild", both, enable=dict(settings, store=str(store)))
            fresh = run(root, "kbuild", both, enable=dict(
                settings, store=str(tmp_path / f"fresh-{journal}-{step}")))
            assert now["loads"] == fresh["loads"], f"journal {journal}: stale"
            assert now["counts"].get("built", 0) == built, (journal, now["counts"])

# -- direct mode's journal ------------------------------------------------------------------

def _declaring(project: Path, keep) -> None:
    """The checkout's kbuild.toml, declaring only the kernels in `keep`."""
    lines, out, skip = (PROJECT / "kbuild.toml").read_text().splitlines(), [], False
    for line in lines:
        if line.startswith("[kernels."):
            skip = short(line.split('"')[1]) not in keep
        if not skip:
            out.append(line)
    (project / "kbuild.toml").write_text("\n".join(out) + "\n")


def test_the_journal_checks_what_compiles_asked_the_system(tmp_path):
    """A no-op answered from the journal (direct mode) notices a path a compile stat'ed
    appearing, a folder it listed changing, a variable it read; a compile that scanned the
    whole environment keeps the journal from being written, saying why."""
    project = _checkout(tmp_path)
    _declaring(project, {"k_flag", "k_plugins", "k_gain_a"})
    store, env = tmp_path / "store", _clean_env()
    build(project, store, env_extra=env)
    assert build(project, store, env_extra=env)["mode"]["used"] == "direct"
    steps = [(touch("fast.flag"), {}, {"k_flag"}), (touch("plugins/b.txt"), {}, {"k_plugins"}),
             (lambda root: None, {"SP_GAIN": "3.0"}, {"k_gain_a"})]
    for edit, more, rebuilt in steps:
        edit(project)
        env = {**env, **more}
        after = build(project, store, env_extra=env)
        assert after["mode"]["used"] == "full" and _with_status(after, "built") == rebuilt
        assert build(project, store, env_extra=env)["mode"]["used"] == "direct"

    _declaring(project, {"k_flag", "k_scan"})
    scanned = build(project, store, env_extra=env)
    assert _with_status(scanned, "built") == {"k_scan"}, (scanned["targets"], scanned["mode"])
    assert scanned["mode"]["journal"] == \
        "not written: a compile scanned the whole environment, which the journal cannot check"


MODULE_HOOK_KERNELS = '''\
from numba import cuda

import lazy


@cuda.jit
def k_lazy(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] *= lazy.FACTOR
'''

MODULE_HOOKS = {
    # PEP 562: the module's own function, run for a name it does not hold.
    "module-getattr": '''\
_LAZY = {"GAIN": 2.0}
FACTOR = 1.5


def __getattr__(name):
    if name in _LAZY:
        return _LAZY[name]
    raise AttributeError(name)
''',
    # The module's class swapped for a project's, as deprecation shims do.
    "module-class": '''\
import sys
import types

FACTOR = 1.5


class _Lazy(types.ModuleType):
    def __getattr__(self, name):
        raise AttributeError(name)


sys.modules[__name__].__class__ = _Lazy
''',
}


@pytest.mark.parametrize("hook", sorted(MODULE_HOOKS))
def test_code_python_runs_on_a_module_numba_types_is_keyed(tmp_path, hook):
    """numba's first question of a global it types is `getattr(value, "_numba_type_",
    None)`; on a module with a `__getattr__` of its own (or a class of the project's), that
    runs the project's code, and what it raises decides the compile. An edit that makes it
    raise another error fails the kernel as a fresh build does (it was served); the
    failure recorded then holds only while that code is unchanged; an edit of the module
    that changes no code numba ran rebuilds nothing."""
    project = tmp_path / "proj"
    _write_project(project, "hooks", "kern", ["k_lazy"],
                   {"kern.py": MODULE_HOOK_KERNELS, "lazy.py": MODULE_HOOKS[hook]})
    lazy, store = project / "lazy.py", tmp_path / "store"
    text = lazy.read_text()
    first = build(project, store)
    assert _with_status(first, "built") == {"k_lazy"}
    lazy.write_text(text.replace("raise AttributeError(name)", "raise LookupError(name)"))
    broken = build(project, store, expect_rc=1)
    fresh = reference(project, tmp_path / "fresh", expect_rc=1)
    assert _with_status(fresh, "failed") == {"k_lazy"}
    assert _with_status(broken, "failed") == {"k_lazy"}, "a binary served that numba refuses"
    assert "LookupError" in _rows(broken)["k_lazy"]["error"]
    lazy.write_text(text)  # the fresh store recorded the failure; it no longer holds
    mended = build(project, tmp_path / "fresh")
    assert _with_status(mended, "built") == {"k_lazy"}, _rows(mended)["k_lazy"]["error"]
    assert _artifacts(mended) == _artifacts(first)
    lazy.write_text(text + "# a comment, and a name nobody reads\nUNREAD = 3\n")
    assert _with_status(build(project, store), "cached") == {"k_lazy"}


LAZY_SCALE_KERNELS = '''\
from numba import cuda

import lazy


@cuda.jit
def scale(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] * lazy.FACTOR
'''


def test_zero_config_keys_the_code_python_runs_on_a_module_numba_types(tmp_path):
    """Under `kbuild.enable()`, a kernel that reads a module with its own `__getattr__`:
    served warm while that code is unchanged; once it raises another error, not served
    (numba refuses, and so does the launch); mended, served again, the same binary."""
    from zeroconf_support import run, write_program

    hook = MODULE_HOOKS["module-getattr"]
    root = write_program(tmp_path / "prog", kernels=LAZY_SCALE_KERNELS, lazy=hook)
    store = {"store": str(tmp_path / "store")}
    first = run(root, "kbuild", ("scale",), enable=store)
    assert first["counts"] == {"built": 1, "served": 1}, first
    warm = run(root, "kbuild", ("scale",), enable=store)
    assert warm["nvvm"] == 0 and warm["loads"] == first["loads"]
    (root / "lazy.py").write_text(hook.replace("raise AttributeError(name)",
                                               "raise LookupError(name)"))
    refused = run(root, "kbuild", ("scale",), enable=store, check=False)
    assert refused["returncode"] != 0 and "LookupError: _numba_type_" in refused["stderr"], \
        refused
    (root / "lazy.py").write_text(hook)
    mended = run(root, "kbuild", ("scale",), enable=store)
    assert mended["nvvm"] == 0 and mended["loads"] == first["loads"]
