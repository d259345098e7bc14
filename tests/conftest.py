"""Shared fixtures: temp stores, a copy of the examples project, and `kbuild` in a subprocess.

Every command runs as `python -m kbuild` with KBUILD_STORE, HOME and XDG_CACHE_HOME
inside pytest's temp directory, so no test ever reads or writes the user's cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


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

class Result(NamedTuple):
    """What one `kbuild` run gave back."""

    returncode: int
    stdout: str
    stderr: str
    json: object  # parsed stdout when --json was given, else None
    stdout_bytes: bytes


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def run_kbuild(tmp_path_factory):
    """`run_kbuild(*args, cwd=..., env=None, store=None)` -> Result.

    `store` sets KBUILD_STORE (None: unset, so the default store lands in the temp
    HOME/XDG_CACHE_HOME). `env` adds or overrides variables; a value of None removes one.
    """
    home = tmp_path_factory.mktemp("home")

    def run(*args, cwd, env=None, store=None, timeout=300) -> Result:
        full_env = dict(os.environ)
        for name in ("KBUILD_STORE", "PYTHONDONTWRITEBYTECODE", "NUMBA_ENABLE_CUDASIM",
                     "KBUILD_REMOTE", "KBUILD_REMOTE_TIMEOUT", "KBUILD_REMOTE_READ_ONLY"):
            full_env.pop(name, None)  # bytecode caches on: a user's normal setting
        full_env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
                        NUMBA_CACHE_DIR=str(home / "numba-cache"))
        if store is not None:
            full_env["KBUILD_STORE"] = str(store)
        for name, value in (env or {}).items():
            if value is None:
                full_env.pop(name, None)
            else:
                full_env[name] = str(value)
        proc = subprocess.run([sys.executable, "-m", "kbuild", *map(str, args)], cwd=str(cwd),
                              env=full_env, capture_output=True, timeout=timeout)
        stdout = proc.stdout.decode("utf-8", "replace")
        parsed = None
        if "--json" in args and proc.stdout.strip():
            parsed = json.loads(stdout)
        return Result(proc.returncode, stdout, proc.stderr.decode("utf-8", "replace"),
                      parsed, proc.stdout)

    return run


# -- projects and stores --------------------------------------------------------------

def copy_examples(repo: Path, dest: Path) -> Path:
    """A copy of examples/ and kbuild.toml under `dest`; returns `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(repo / "examples", dest / "examples",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(repo / "kbuild.toml", dest / "kbuild.toml")
    return dest


class BuiltExamples:
    """One cold `kbuild build --json` of a copy of the examples: the project, its store
    and the rows, for a module of tests that each start from that store."""

    def __init__(self, project: Path, store: Path, result: dict):
        self.project, self.store = project, store
        self.rows, self.summary = result["targets"], result["summary"]
        self.keys = [r["key"] for r in self.rows]

    def row(self, target: str, index: int = 0) -> dict:
        """The `index`-th row of `target` (its signatures in declaration order)."""
        return [r for r in self.rows if r["target"] == target][index]


def build_examples(base: Path, repo_root: Path, run_kbuild, arch: str) -> BuiltExamples:
    """Copy the examples under `base` and build them for `arch` into `base`/store."""
    project = copy_examples(repo_root, base / "project")
    result = run_kbuild("build", "--json", "--arch", arch, cwd=project, store=base / "store")
    assert result.returncode == 0, result.stderr
    assert {r["status"] for r in result.json["targets"]} == {"built"}
    return BuiltExamples(project, base / "store", result.json)


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


def entry_files(root: Path, kind: str = "target") -> dict:
    """key -> path for every target entry file in a store (kind="object": the
    separately compiled objects' entries instead; None: all)."""
    found = {}
    for path in (root / "v1" / "entries").glob("??/*.json"):
        try:
            is_object = json.loads(path.read_text()).get("kind") == "object"
        except ValueError:  # a damaged entry is a target's as far as tests go
            is_object = False
        if kind is None or is_object == (kind == "object"):
            found[path.stem] = path
    return found
