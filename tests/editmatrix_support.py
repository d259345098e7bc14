"""Helpers for the invalidation tests: copy tests/editproj, edit it, run the real CLI.

Every build is a fresh `python -m kbuild` process (support.run) with HOME,
XDG_CACHE_HOME and the store inside a temp directory, bytecode writing off (an
edit that keeps a file's size within the same second must never meet a stale
.pyc), and no inherited KBUILD_* or NUMBA_* settings.

`SOUNDNESS` and `PRECISION` are the edit matrix shared by test_edit_matrix.py
(which targets rebuild) and test_explain.py (what `kbuild explain` says).

`VARIANTS`: the matrices run for each backend. The numba-cuda-mlir variant is the same
project ported as a migrating user ports it (`mlir_support.port`, applied after each
edit), without the kernels numba-cuda-mlir cannot compile; a case only about those is
skipped with the compiler's reason.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import mlir_support
from support import WARM, WARM_MLIR, Result, run, shared_dir, shared_home, template

PROJECT = Path(__file__).resolve().parent / "editproj"

# Short name -> number of signatures, for every target of tests/editproj.
TARGETS = {
    "k_sq": 1, "k_cube": 1, "k_chain": 1, "k_shift": 1, "k_scale": 1, "k_table": 1,
    "k_mode": 1, "k_fast": 1, "k_double": 1, "k_plain": 2, "k_pair": 1, "k_inner": 1,
    "k_points": 1, "k_origin": 1, "k_lines": 1, "k_coop": 1,
}
ALL = frozenset(TARGETS)
RECORD_KERNELS = frozenset({"k_points", "k_origin"})


# -- the backends the matrices run for ------------------------------------------------

@dataclass(frozen=True)
class Variant:
    """A backend the matrices run for: how a project is ported to it, which targets it
    cannot compile (short name -> reason)."""

    backend: str
    unsupported: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.backend

    @property
    def warm(self) -> tuple:
        """What the warm zygote of this backend's reference builds imports."""
        return WARM_MLIR if self.backend == mlir_support.MLIR else WARM

    def port(self, project: Path, vendor: Path | None = None) -> Path:
        """The checkout at `project` (and a package of its beside it) for this backend."""
        if self.backend == mlir_support.MLIR:
            mlir_support.port(project)
            if vendor is not None:
                mlir_support.port_sources(vendor)
        return project

    def supported(self, names) -> frozenset:
        return frozenset(n for n in names if n not in self.unsupported)

    def skip_reason(self, rebuilt) -> str | None:
        """Why a case that rebuilds exactly `rebuilt` says nothing under this backend."""
        if rebuilt and not self.supported(rebuilt):
            reasons = "; ".join(f"{n}: {self.unsupported[n]}" for n in sorted(rebuilt))
            return f"{self.backend} 0.6.0 cannot compile {reasons}"
        return None

    def require(self) -> "Variant":
        """This variant, or the test skipped when its backend is not installed."""
        import pytest

        if self.backend == mlir_support.MLIR and not mlir_support.INSTALLED:
            pytest.skip(mlir_support.NOT_INSTALLED)
        return self


VARIANTS = (Variant("numba-cuda"), Variant(mlir_support.MLIR, mlir_support.UNSUPPORTED_SHORT))


# -- running kbuild -------------------------------------------------------------

def kbuild_result(project: Path, store: Path, *args: str, env_extra=None,
                  launcher=("-m", "kbuild"), warm: bool | tuple = False,
                  cwd: Path | None = None) -> Result:
    """`python -m kbuild ARGS --json --config project/kbuild.toml --store store` in
    `project`, HOME the test run's shared one (else beside the project), bytecode writing
    off: a checkout's run can answer from the journal its template's build wrote.

    `launcher` replaces `-m kbuild`, e.g. `-c CODE` that imports things first. `warm`:
    from the zygote with numba-cuda imported (`support.run`; a tuple: those modules), for
    a reference build only. `cwd`: another working directory than `project`.
    """
    return run(*args, "--json", "--config", project / "kbuild.toml", "--store", store,
               cwd=cwd or project, home=shared_home() or project.parent / "home", env=env_extra,
               launcher=launcher, bytecode=False, warm=warm)


def run_kbuild(project: Path, store: Path, *args: str, env_extra=None,
               launcher=("-m", "kbuild"), expect_rc: int = 0, cwd: Path | None = None) -> dict:
    """`kbuild_result`, which must exit `expect_rc`; its JSON."""
    proc = kbuild_result(project, store, *args, env_extra=env_extra, launcher=launcher,
                         cwd=cwd)
    assert proc.returncode == expect_rc, (
        f"{' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
        f"stderr:\n{proc.stderr[-3000:]}")
    return proc.json


def build(project: Path, store: Path, *args: str, **kw) -> dict:
    return run_kbuild(project, store, "build", *args, **kw)


def reference(project: Path, store: Path, *args: str, env_extra=None,
              expect_rc: int = 0, warm: tuple = WARM) -> dict:
    """A matrix's reference: `kbuild build ARGS` of the edited project into the empty
    store `store`, whose artifacts the incremental build's are compared with; its JSON.

    Nothing of it is a fresh process's own behaviour (no journal, no store to answer
    from), so it runs where it costs least: forked from the warm zygote (numba-cuda and
    kbuild imported already, `support.run(warm=...)`: `Variant.warm` names the modules
    of a numba-cuda-mlir project's), every target compiled in that one
    process (`-j1`: no worker forked, none importing numba's registries again). Neither
    can hide a stale binary: a target's bytes depend on neither the process nor the
    order it compiled in (tests/test_determinism.py), and a reference that did would
    differ from the baseline's bytes for a target the edit did not reach, which the
    incremental build serves `cached` and the matrix compares with the reference: the
    case fails loudly.
    """
    proc = kbuild_result(project, store, "build", "-j1", *args, env_extra=env_extra,
                         warm=warm)
    assert proc.returncode == expect_rc, (
        f"reference build exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
        f"stderr:\n{proc.stderr[-3000:]}")
    return proc.json


def matrix_baseline(tmp_path_factory, name: str, checkout, *args: str, env=None,
                    expect_rc: int = 0):
    """(where, build JSON): `checkout(where)`'s project built by `kbuild build ARGS` into
    where/store (`env(project)`: its extra environment), once per test run for all workers
    (support.template). Read-only: a matrix's cases copy where/store."""
    def make(project: Path, store: Path) -> Result:
        checked_out = checkout(project.parent)
        return kbuild_result(checked_out, store, "build", *args,
                             env_extra=env(checked_out) if env else None)

    made = template(shared_dir(tmp_path_factory), name, make, expect_rc=expect_rc)
    return made.store.parent, made.json


def status_keys(project: Path, store: Path, **kw) -> dict:
    """The key of every target from a dry run (`kbuild status --json`)."""
    return keys_of(run_kbuild(project, store, "status", **kw))


def short(target: str) -> str:
    """'lab.kernels:k_sq' -> 'k_sq'."""
    return target.rpartition(":")[2]


def with_status(result: dict, status: str) -> set[str]:
    """Short names of the targets that have at least one row with `status`."""
    return {short(r["target"]) for r in result["targets"] if r["status"] == status}


def artifacts(result: dict) -> dict:
    """Short name -> (PTX digest, cubin digest) of each target (its last row) in a
    `build --json` result; (None, None) for a target with none (a failed build)."""
    return {short(r["target"]): ((r["artifacts"] or {}).get("ptx"),
                                 (r["artifacts"] or {}).get("cubin"))
            for r in result["targets"]}


def assert_matches_fresh(incremental: dict, fresh: dict, rebuilt) -> tuple[dict, dict]:
    """An incremental build against a fresh one of the same checkout: both build every
    target, none is `cached` with bytes the fresh build does not make, and exactly
    `rebuilt` (short names) were built. Their artifacts, (incremental, fresh)."""
    assert incremental["summary"]["failed"] == 0 and fresh["summary"]["failed"] == 0, \
        [r["error"] for r in incremental["targets"] + fresh["targets"] if r.get("error")]
    now, clean = artifacts(incremental), artifacts(fresh)
    stale = {t for t in with_status(incremental, "cached") if now[t] != clean[t]}
    assert not stale, f"stale binaries served for {sorted(stale)}"
    assert with_status(incremental, "built") == set(rebuilt)
    return now, clean


def run_case(project: Path, baseline_store: Path, work: Path, case, env=None) -> tuple[dict, dict]:
    """A matrix case against its baseline: `case` applied to the checkout `project`, built
    incrementally on a copy of `baseline_store` (at work/store) and fresh into the empty
    work/fresh-store, both with `env`. Their JSON, (incremental, fresh)."""
    copy_tree(baseline_store, work / "store")
    case.apply(project)
    incremental = build(project, work / "store", env_extra=env)
    fresh = reference(project, work / "fresh-store", env_extra=env)
    return incremental, fresh


def fresh_checkout(source: Path, where: Path, name: str = "proj") -> Path:
    """A copy of the project folder `source` at `where/name` (its path), without bytecode
    caches: a case's edit must be read from source, never met by a stale .pyc."""
    project = where / name
    shutil.copytree(source, project, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return project


def keys_of(result: dict) -> dict:
    """(target, signature, arch) -> key, from `build --json` or `status --json`."""
    return {(r["target"], r["signature"], r["arch"]): r["key"] for r in result["targets"]}


def copy_project(dst: Path) -> Path:
    """A fresh checkout of tests/editproj at `dst` (no bytecode caches)."""
    return fresh_checkout(PROJECT, dst.parent, dst.name)


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def make_baseline(base: Path, editproj_template):
    """(project, store, build JSON): the session's cold build of tests/editproj
    (conftest's `editproj_template`), copied under `base` for one module."""
    project, store = editproj_template.copy_to(base / "editproj", base / "store")
    return project, store, editproj_template.json


def checkout(baseline, where: Path):
    """A fresh copy of the baseline's project and store under `where` (another path)."""
    _, store, _ = baseline
    return (copy_project(where / "checkout" / "editproj"),
            copy_tree(store, where / "store"))


def manifest(store: Path, key: str) -> dict:
    """The manifest of entry `key` in `store`, read straight from disk."""
    return json.loads((store / "v1" / "entries" / key[:2] / f"{key}.json").read_text())


# -- edits ----------------------------------------------------------------------

def replace(path: str, old: str, new: str):
    """An edit: replace the one occurrence of `old` in PROJECT/path with `new`."""

    def edit(root: Path) -> None:
        file = root / path
        text = file.read_text()
        assert text.count(old) == 1, f"{path}: expected one {old!r}, found {text.count(old)}"
        file.write_text(text.replace(old, new))

    edit.__name__ = f"replace in {path}"
    return edit


def edits(*steps):
    """Several edits applied in order."""

    def edit(root: Path) -> None:
        for step in steps:
            step(root)

    return edit


def move_block(path: str, block: str, before: str):
    """An edit: cut `block` out of `path` and paste it just before `before`."""

    def edit(root: Path) -> None:
        file = root / path
        text = file.read_text()
        assert text.count(block) == 1, f"{path}: block not found once"
        text = text.replace(block, "")
        assert text.count(before) == 1, f"{path}: anchor {before!r} not found once"
        file.write_text(text.replace(before, block + before))

    return edit


def touch_all(root: Path) -> None:
    """Set every file's mtime an hour ahead (content unchanged)."""
    for file in root.rglob("*"):
        if file.is_file():
            st = file.stat()
            os.utime(file, (st.st_atime + 3600, st.st_mtime + 3600))


def no_edit(root: Path) -> None:
    pass


@dataclass(frozen=True)
class Case:
    """One row of the edit matrix."""

    id: str
    edit: object
    rebuilt: frozenset  # short names of the targets that must rebuild, and no others
    args: tuple = ()  # extra `kbuild build` arguments
    env: dict = field(default_factory=dict)
    explains: dict = field(default_factory=dict)  # short name -> substring(s) of its reasons
    # Direct mode: whether the build can answer from the baseline's journal (nothing it
    # names changed), else it must notice the change and key in full.
    direct: bool = False

    def apply(self, root: Path) -> None:
        self.edit(root)


def case(id, edit, rebuilt=(), *, args=(), env=None, explains=None, direct=False) -> Case:
    return Case(id, edit, frozenset(rebuilt), tuple(args), dict(env or {}),
                dict(explains or {}), direct)


_SQ = "def sq(x):\n    return x * x\n"
_CUBE = "def cube(x):\n    return x * x * x\n"
_POINT = 'POINT_DTYPE = np.dtype([("x", np.float32), ("y", np.float32), ("tag", np.uint8)], align=True)'
_PLAIN_SIG = 'signatures = ["void(float32[::1], float32[::1])"]\n\n[kernels."lab.kernels:k_double"]'
_K_SQ = "@cuda.jit\ndef k_sq(x, out):"
_K_CUBE_BLOCK = ("@cuda.jit\ndef k_cube(x, out):\n    i = cuda.grid(1)\n    if i < out.size:\n"
                 "        out[i] = mathx.cube(x[i])\n\n\n")


def _point(fields: str, align: str = "True") -> str:
    return f"POINT_DTYPE = np.dtype([{fields}], align={align})"


# Edits that must rebuild exactly the targets that reach the change.
SOUNDNESS = [
    case("callee-in-other-file-body", replace("lab/mathx.py", _SQ, "def sq(x):\n    return x * x + 1\n"),
         {"k_sq", "k_points", "k_pair"}, explains={"k_sq": "callee lab.mathx:sq changed (body)",
                                                   "k_points": "callee lab.mathx:sq changed (body)"}),
    case("callee-chain-leaf", replace("lab/mathx.py", "return x + x", "return 2 * x"),
         {"k_chain"}, explains={"k_chain": "callee lab.vec:axpy2 > callee lab.mathx:twice changed (body)"}),
    case("callee-chain-middle", replace("lab/vec.py", "return twice(a) + b", "return twice(a) - b"),
         {"k_chain"}, explains={"k_chain": "callee lab.vec:axpy2 changed (body)"}),
    case("callee-as-module-attribute", replace("lab/mathx.py", _CUBE, "def cube(x):\n    return x * x * x * x\n"),
         {"k_cube", "k_pair"}, explains={"k_cube": "callee lab.mathx:cube changed (body)"}),
    case("callee-rebound-name", replace("lab/mathx.py", "def unused(x):", "def sq_(x):\n    return x\n\n\nsq = cube\n\n\n@cuda.jit(device=True)\ndef unused(x):"),
         {"k_sq", "k_points", "k_pair"},
         explains={"k_sq": "global sq lab.mathx:sq -> lab.mathx:cube",
                   "k_points": "global mathx.sq lab.mathx:sq -> lab.mathx:cube"}),
    case("callees-swapped-between-names", replace("lab/kernels.py", "import cube as second, sq as first",
                                                  "import cube as first, sq as second"),
         {"k_pair"}, explains={"k_pair": "global first lab.mathx:sq -> lab.mathx:cube"}),
    case("callee-option", replace("lab/mathx.py", "@cuda.jit(device=True)\n" + _SQ,
                                  "@cuda.jit(device=True, fastmath=True)\n" + _SQ),
         {"k_sq", "k_points", "k_pair"},
         explains={"k_sq": "callee lab.mathx:sq: option fastmath False -> True"}),
    case("closure-factory-argument", replace("lab/closures.py", "make_scaler(2.0)", "make_scaler(3.0)"),
         {"k_double"}, explains={"k_double": "callee lab.closures:make_scaler.<locals>.scale: closure factor 2.0 -> 3.0"}),
    case("closure-factory-body", replace("lab/closures.py", "return x * factor", "return factor * x"),
         {"k_double"}, explains={"k_double": "callee lab.closures:make_scaler.<locals>.scale changed (body)"}),
    case("default-argument-value", replace("lab/mathx.py", "delta=1.0", "delta=2.0"),
         {"k_shift"}, explains={"k_shift": "callee lab.mathx:shift: default #1 1.0 -> 2.0"}),
    case("module-constant", replace("lab/consts.py", "SCALE = 2.5", "SCALE = 3.0"),
         {"k_scale", "k_inner"}, explains={"k_scale": "global consts.SCALE 2.5 -> 3.0",
                                           "k_inner": "global SCALE 2.5 -> 3.0"}),
    case("array-values", replace("lab/consts.py", "[0.5, -1.0, 2.0, 0.25]", "[0.5, -1.0, 2.0, 0.5]"),
         {"k_table"}, explains={"k_table": "global TABLE array float32[4] [0.5, -1.0, 2.0, 0.25] -> array float32[4] [0.5, -1.0, 2.0, 0.5]"}),
    case("array-dtype", replace("lab/consts.py", "dtype=np.float32)", "dtype=np.float64)"),
         {"k_table"}, explains={"k_table": "global TABLE array float32[4] [0.5, -1.0, 2.0, 0.25] -> array float64[4] [0.5, -1.0, 2.0, 0.25]"}),
    case("array-shape", replace("lab/consts.py", "[0.5, -1.0, 2.0, 0.25]", "[0.5, -1.0, 2.0, 0.25, 1.0]"),
         {"k_table"}, explains={"k_table": "-> array float32[5] [0.5, -1.0, 2.0, 0.25, 1.0]"}),
    case("enum-member-value", replace("lab/consts.py", "FAST = 1", "FAST = 3"),
         {"k_mode"}, explains={"k_mode": "global Mode.FAST Mode.FAST=1 -> Mode.FAST=3"}),
    case("record-field-added", replace("lab/records.py", _POINT, _point(
        '("x", np.float32), ("y", np.float32), ("z", np.float32), ("tag", np.uint8)')),
         RECORD_KERNELS, explains={"k_points": "signature > argument 1 record: field 'z' added (float32 @8)",
                                   "k_origin": "global Point record: field 'z' added (float32 @8)"}),
    case("record-fields-reordered", replace("lab/records.py", _POINT, _point(
        '("y", np.float32), ("x", np.float32), ("tag", np.uint8)')),
         RECORD_KERNELS, explains={"k_points": "signature > argument 1 record: field 'x' float32 @0 -> float32 @4",
                                   "k_origin": "global Point record: field 'y' float32 @4 -> float32 @0"}),
    case("record-field-retyped", replace("lab/records.py", _POINT, _point(
        '("x", np.float32), ("y", np.float64), ("tag", np.uint8)')),
         RECORD_KERNELS, explains={"k_points": "signature > argument 1 record: field 'y' float32 @4 -> float64 @8",
                                   "k_origin": "global Point record: field 'y' float32 @4 -> float64 @8"}),
    case("record-packed", replace("lab/records.py", _POINT, _point(
        '("x", np.float32), ("y", np.float32), ("tag", np.uint8)', "False")),
         RECORD_KERNELS, explains={"k_points": "signature > argument 1 record: layout size 12, aligned True, fields x, y, tag -> size 9, aligned False, fields x, y, tag",
                                   "k_origin": "global Point record: layout size 12, aligned True, fields x, y, tag -> size 9, aligned False, fields x, y, tag"}),
    case("option-fastmath-added", replace("lab/kernels.py", _K_SQ, "@cuda.jit(fastmath=True)\ndef k_sq(x, out):"),
         {"k_sq"}, explains={"k_sq": "option fastmath False -> True"}),
    case("option-fastmath-removed", replace("lab/kernels.py", "@cuda.jit(fastmath=True)", "@cuda.jit"),
         {"k_fast"}, explains={"k_fast": "option fastmath True -> False"}),
    case("option-lineinfo", replace("lab/kernels.py", _K_SQ, "@cuda.jit(lineinfo=True)\ndef k_sq(x, out):"),
         {"k_sq"}, explains={"k_sq": ("option lineinfo False -> True",
                                      "kernel changed (body: source -> source with line numbers)",
                                      "file added (lab/kernels.py)")}),
    case("option-max-registers", replace("lab/kernels.py", "@cuda.jit\ndef k_plain", "@cuda.jit(max_registers=32)\ndef k_plain"),
         {"k_plain"}, explains={"k_plain": "option max_registers added (32)"}),
    case("kernel-body", replace("lab/kernels.py", "total = total * 0.5", "total = total * 0.25"),
         {"k_plain"}, explains={"k_plain": "kernel changed (body)"}),
    case("signature-in-config", replace("kbuild.toml", _PLAIN_SIG,
                                        _PLAIN_SIG.replace("float32", "float64")),
         {"k_fast"}, explains={"k_fast": "signature: argument 1 array(float32, 1d, C) -> "
                                         "array(float64, 1d, C)"}),
    case("arch", no_edit, ALL, args=("--arch", "sm_90"), explains={"k_sq": "never built into this store"}),
    # NUMBA_OPT is read at decoration, into each function's `opt` option (compiletime.py):
    # 2 and 3 are both `opt=True`, so 0 is the setting that changes what numba compiles.
    case("numba-config", no_edit, ALL, env={"NUMBA_OPT": "0"},
         explains={"k_sq": "option opt True -> False"}),
    case("line-shift-with-lineinfo", replace("lab/lines.py", "from numba import cuda\n",
                                             "from numba import cuda\n\nOFFSET = 1\n"),
         {"k_lines"}, explains={"k_lines": "kernel changed (body)"}),
    case("grid-sync-kernel-body", replace("lab/coop.py", "data[i] *= 2", "data[i] *= 3"),
         {"k_coop"}, explains={"k_coop": "kernel changed (body)"}),
]

_K_PLAIN_BODY = "        total = x[i]\n        total = total * 0.5\n        out[i] = total\n"

# Edits that must rebuild nothing (or only the one target whose code changed).
PRECISION = [
    case("comment", edits(
        replace("lab/mathx.py", _SQ, "def sq(x):\n    # the square\n    return x * x  # of x\n"),
        replace("lab/kernels.py", "    i = cuda.grid(1)\n    if i < out.size:\n        out[i] = sq(x[i])",
                "    # one thread per element\n    i = cuda.grid(1)\n    if i < out.size:\n        out[i] = sq(x[i])"))),
    case("docstring", edits(
        replace("lab/mathx.py", _SQ, 'def sq(x):\n    """x squared."""\n    return x * x\n'),
        replace("lab/kernels.py", "def k_plain(x, out):\n", 'def k_plain(x, out):\n    """Halve."""\n'))),
    case("whitespace-and-line-breaks", edits(
        replace("lab/kernels.py", "acc = acc * x[i] + TABLE[k]", "acc = (acc  *  x[i]\n                   + TABLE[k])"),
        replace("lab/mathx.py", _CUBE, "def cube(x):\n\n    return (x * x\n            * x)\n"),
        replace("lab/consts.py", "SCALE = 2.5", "SCALE = (\n    2.5\n)\n\n\n"))),
    case("move-function-in-file", move_block("lab/mathx.py",
                                             "@cuda.jit(device=True)\n" + _CUBE + "\n\n",
                                             "@cuda.jit(device=True)\ndef unused")),
    case("unrelated-function-above", edits(
        replace("lab/kernels.py", "from lab.vec import axpy2\n",
                "from lab.vec import axpy2\n\n\ndef helper(a, b):\n    return a + b\n\n\n"
                "@cuda.jit(device=True)\ndef dev_helper(a):\n    return a\n"),
        replace("lab/mathx.py", "from numba import cuda\n",
                "from numba import cuda\n\n\n@cuda.jit(device=True)\ndef first(x):\n    return x\n"))),
    case("reorder-definitions", move_block("lab/kernels.py", _K_CUBE_BLOCK, "@cuda.jit\ndef k_sq")),
    case("reorder-imports", replace("lab/kernels.py", "from lab.mathx import shift, sq",
                                    "from lab.mathx import sq, shift")),
    case("unreached-constant", replace("lab/consts.py", "OFFSET = 7", "OFFSET = 8")),
    case("unreached-enum-member", replace("lab/consts.py", "PRECISE = 2", "PRECISE = 5")),
    case("unreached-device-function", replace("lab/mathx.py", "return x - 1.0", "return x - 2.0")),
    case("unrelated-global", edits(
        replace("lab/kernels.py", "from lab.vec import axpy2\n", "from lab.vec import axpy2\n\nLIMIT = 10\n"),
        replace("lab/consts.py", "OFFSET = 7", "OFFSET = 7\nEXTRA = np.zeros(3)"))),
    case("other-kernel-only", replace("lab/kernels.py", "out[i] = x[i] * consts.SCALE",
                                      "out[i] = consts.SCALE * x[i]"), {"k_scale"}),
    case("spacing-within-lines-with-lineinfo", replace("lab/lines.py", "out[i] = x[i] + 1.0",
                                                       "out[i] = x[i]+1.0  # same line")),
    case("rename-locals-with-lineinfo", replace(
        "lab/lines.py", "def k_lines(x, out):\n    i = cuda.grid(1)\n    if i < out.size:\n"
        "        out[i] = x[i] + 1.0", "def k_lines(src, dst):\n    j = cuda.grid(1)\n"
        "    if j < dst.size:\n        dst[j] = src[j] + 1.0")),
    case("touch-files", touch_all, direct=True),
    case("other-checkout-path", no_edit, direct=True),
    case("other-hash-seed", no_edit, env={"PYTHONHASHSEED": "12345"}, direct=True),
    case("rename-local-variable", edits(
        replace("lab/kernels.py", _K_PLAIN_BODY, _K_PLAIN_BODY.replace("total", "half")),
        replace("lab/kernels.py", "        acc = 0.0\n        for k in range(TABLE.size):\n"
                "            acc = acc * x[i] + TABLE[k]\n        out[i] = acc",
                "        s = 0.0\n        for j in range(TABLE.size):\n"
                "            s = s * x[i] + TABLE[j]\n        out[i] = s"))),
]


# -- keying in this process ---------------------------------------------------------

def load_module(path: Path, name: str):
    """Import the file `path` as module `name` (registered in sys.modules, as keying needs)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # From the file's bytes now, never from a bytecode cache: a file rewritten within the
    # same second at the same size would otherwise run its old code (a .pyc is checked by
    # mtime and size only), and tests that rewrite a module would test the old one.
    exec(compile(Path(path).read_bytes(), str(path), "exec"), module.__dict__)
    return module


def target_key(kernel, name: str, argtypes, roots, signature: str = "sig"):
    """The key tree of `kernel` as target `name` for sm_80, computed here (pure keying)."""
    from kbuild.backend.objectmodel import NUMBA_CUDA
    from kbuild.keying.keyer import Keyer
    from kbuild.sources import ProjectSources
    from kbuild.backend.toolchain import codegen_config, toolchain

    keyer = Keyer(ProjectSources([str(r) for r in roots]), NUMBA_CUDA)
    return keyer.target_node(kernel, name, tuple(argtypes), signature, "sm_80",
                             toolchain(), codegen_config())
