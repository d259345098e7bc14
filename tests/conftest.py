"""Shared fixtures: temp stores, copies of the examples project, and `kbuild` in a subprocess.

Every command runs as `python -m kbuild` with KBUILD_STORE, HOME and XDG_CACHE_HOME
inside pytest's temp directory, so no test ever reads or writes the user's cache
(support.py). The examples and tests/editproj are cold-built once per test run
(`examples_template`, `editproj_template`); modules and tests copy those stores.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path

import pytest

from support import REPO_ROOT, SHARED_HOME, Result, Template, shared_dir, template
from support import run as run_process
from support import run_in_process

# Zero-config's background build (kbuild/zeroconf/background.py) runs beside a program's
# own compiles: tests that count a program's compiles see them all in the program unless
# they turn it on themselves (tests/test_zeroconf_background.py does).
os.environ.setdefault("KBUILD_BACKGROUND", "0")


# -- the gpu marker ---------------------------------------------------------------

def pytest_addoption(parser):
    parser.addoption("--gpu", action="store_true", default=False,
                     help="also run tests marked gpu (needs a CUDA GPU and driver)")


def _gpu_requested(config) -> bool:
    return config.getoption("--gpu") or os.environ.get("KBUILD_GPU_TESTS") == "1"


def pytest_configure(config):
    # pyproject's addopts deselects gpu tests; --gpu / KBUILD_GPU_TESTS=1 takes them back.
    if _gpu_requested(config) and "not gpu" in (config.option.markexpr or ""):
        expr = config.option.markexpr.replace("not gpu and ", "").replace(" and not gpu", "")
        config.option.markexpr = "" if expr.strip() == "not gpu" else expr


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = _no_gpu_reason()
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))


def _no_gpu_reason() -> str | None:
    """None when a CUDA GPU and driver can be used, else why not."""
    try:
        from numba import cuda

        if cuda.is_available() and len(cuda.gpus) > 0:
            return None
    except Exception as exc:  # noqa: BLE001 - any failure means "no usable GPU"
        return f"no CUDA GPU: {type(exc).__name__}: {exc}"
    return "no CUDA GPU or driver on this machine"


# -- running kbuild ---------------------------------------------------------------

@pytest.fixture(scope="session", autouse=True)
def shared_home(tmp_path_factory):
    """One HOME for the edit-matrix runs of the whole test run (support.shared_home)."""
    home = shared_dir(tmp_path_factory) / "home"
    home.mkdir(parents=True, exist_ok=True)
    os.environ[SHARED_HOME] = str(home)
    return home


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def kbuild_home(tmp_path_factory) -> Path:
    """The HOME of the session's `kbuild` commands, in a subprocess or in process."""
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="session")
def kbuild_process(kbuild_home):
    """`kbuild_process(*args, cwd=..., env=None, store=None, timeout=300)` -> Result: one
    `kbuild` subprocess.

    `store` sets KBUILD_STORE (None: unset, so the default store lands in the temp
    HOME/XDG_CACHE_HOME). `env` adds or overrides variables; a value of None removes one.
    `launcher` replaces `-m kbuild` (support.counting). One HOME for the session; see
    `support.run` for the rest of the environment.
    """
    def run(*args, cwd, env=None, store=None, timeout=300, launcher=("-m", "kbuild")) -> Result:
        return run_process(*args, cwd=cwd, home=kbuild_home, env=env, store=store, timeout=timeout,
                           launcher=launcher)

    return run


@pytest.fixture(scope="session")
def run_kbuild(kbuild_process):
    """How a test runs `kbuild`: a subprocess (`kbuild_process`), unless its module runs
    its commands in this process (`support.run_kbuild_in_process`, `kbuild_here`); a test
    there that needs a fresh process asks for `kbuild_process` itself."""
    return kbuild_process


@pytest.fixture(scope="session")
def kbuild_here(kbuild_home, kbuild_process):
    """`kbuild_process`, in this process (`support.run_in_process`): for the tests where a
    subprocess proves nothing more. A module moves its tests here by importing
    `support.run_kbuild_in_process`. A `launcher` (support.counting) runs a subprocess."""
    def run(*args, cwd, env=None, store=None, timeout=300, launcher=None) -> Result:
        if launcher is not None:
            return kbuild_process(*args, cwd=cwd, env=env, store=store, timeout=timeout,
                                  launcher=launcher)
        return run_in_process(*args, cwd=cwd, home=kbuild_home, env=env, store=store)

    return run


# -- projects and stores --------------------------------------------------------------

def copy_examples(repo: Path, dest: Path) -> Path:
    """A copy of examples/ and kbuild.toml under `dest`; returns `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(repo / "examples", dest / "examples",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(repo / "kbuild.toml", dest / "kbuild.toml")
    return dest


@pytest.fixture(scope="session")
def examples_template(tmp_path_factory):
    """`examples_template(arch=None)` -> Template: a copy of the examples and the store of
    one cold `kbuild build --json [--arch ARCH]` (None: the archs kbuild.toml declares),
    made once per test run for all workers. Read-only: take copies (`Template.copy_to`)."""
    shared = shared_dir(tmp_path_factory)

    @functools.lru_cache(maxsize=None)
    def get(arch: str | None = None) -> Template:
        def make(project: Path, store: Path) -> Result:
            copy_examples(REPO_ROOT, project)
            return run_process("build", "--json", *(("--arch", arch) if arch else ()),
                               cwd=project, home=project.parent / "home", store=store)

        made = template(shared, f"examples-{arch or 'declared'}", make)
        assert {r["status"] for r in made.json["targets"]} == {"built"}
        return made

    return get


@pytest.fixture(scope="session")
def editproj_template(tmp_path_factory) -> Template:
    """tests/editproj and the store of its one cold build (`editmatrix_support.build`),
    made once per test run for all workers. Read-only: take copies."""
    from editmatrix_support import copy_project, kbuild_result

    return template(shared_dir(tmp_path_factory), "editproj",
                    lambda project, store: kbuild_result(copy_project(project), store, "build"))


@pytest.fixture(scope="session")
def editproj_mlir_template(tmp_path_factory) -> Template:
    """tests/editproj ported to numba-cuda-mlir (`mlir_support.port`) and the store of its
    one cold build, made once per test run. Read-only: take copies."""
    import mlir_support
    from editmatrix_support import copy_project, kbuild_result

    if not mlir_support.INSTALLED:
        pytest.skip(mlir_support.NOT_INSTALLED)
    return template(shared_dir(tmp_path_factory), "editproj-mlir",
                    lambda project, store: kbuild_result(
                        mlir_support.port(copy_project(project)), store, "build"))


class BuiltExamples:
    """A copy of the examples, its store and the rows of the cold build that filled it
    (the session's template: `built_project` and `built_store` are where that build ran),
    for a module of tests that each start from that store."""

    def __init__(self, project: Path, store: Path, result: dict, built_project: Path,
                 built_store: Path):
        self.project, self.store = project, store
        self.built_project, self.built_store = built_project, built_store
        self.rows, self.summary = result["targets"], result["summary"]
        self.keys = [r["key"] for r in self.rows]

    def row(self, target: str, index: int = 0) -> dict:
        """The `index`-th row of `target` (its signatures in declaration order)."""
        return [r for r in self.rows if r["target"] == target][index]


def built_examples(base: Path, examples_template, arch: str) -> BuiltExamples:
    """The examples built for `arch`: a copy of the session's template under `base`."""
    made = examples_template(arch)
    project, store = made.copy_to(base / "project", base / "store")
    return BuiltExamples(project, store, made.json, made.project, made.store)


@pytest.fixture
def examples_project(tmp_path, repo_root) -> Path:
    """A private copy of the examples project that a test may edit freely."""
    return copy_examples(repo_root, tmp_path / "project")


@pytest.fixture
def store(tmp_path) -> Path:
    """A fresh store directory (not created yet: kbuild creates it)."""
    return tmp_path / "store"


def store_files(root: Path) -> dict:
    """relative path -> (size, mtime_ns) for every file and folder under `root`."""
    if not root.exists():
        return {}
    listing = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        listing[str(path.relative_to(root))] = (st.st_size if path.is_file() else None,
                                                st.st_mtime_ns)
    return listing


def blob_files(root: Path) -> dict:
    """blob name -> path for every blob in a store."""
    return {p.name: p for p in (root / "v1" / "blobs").glob("??/??/*") if p.is_file()}


def blob_bytes(path: Path) -> bytes:
    """A local store's blob file's own bytes (unpacked: see kbuild/store/blobformat.py)."""
    from kbuild.store import blobformat

    return blobformat.decode(Path(path).read_bytes(), 1 << 30)


def entry_files(root: Path, kind: str = "target") -> dict:
    """key -> path for every target entry file in a store (kind="object": the
    separately compiled objects' entries instead; "output": the early-cutoff records;
    None: all)."""
    found = {}
    for path in (root / "v1" / "entries").glob("??/*.json"):
        try:
            found_kind = json.loads(path.read_text()).get("kind", "target")
        except ValueError:  # a damaged entry is a target's as far as tests go
            found_kind = "target"
        if kind is None or found_kind == kind:
            found[path.stem] = path
    return found
