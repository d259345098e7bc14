"""`kbuild build --executor dask://HOST:PORT` on a real Dask LocalCluster on loopback.

The cluster's workers are separate processes that share none of the client's imports: they
get the project as data and must reach the same keys and the same artifacts as a local build.
"""

from __future__ import annotations

import contextlib
import os
import socket

import pytest

from kbuild.builder.cluster import run_job
from kbuild.execute.distributed import from_data, project_bundle, to_data
from kbuild.keying.encode import digest

from conftest import blob_bytes, blob_files, copy_examples, entry_files

ARCH = "sm_90"
SAXPY = "examples.saxpy:saxpy"
POLY = "examples.elementwise:scaled_poly"


@contextlib.contextmanager
def local_cluster(**options):
    """A LocalCluster on loopback (no dashboard; the scheduler's HTTP server, its health
    routes, on loopback too) that leaves this process's environment as it found it: its
    nanny puts dask's variables for the workers it spawns into `os.environ`
    (PYTHONHASHSEED=6640 among them), where every later test of this pytest worker
    would inherit them."""
    import distributed

    saved = dict(os.environ)
    try:
        with distributed.LocalCluster(threads_per_worker=1, processes=True, host="127.0.0.1",
                                      dashboard_address=None,
                                      scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                                      **options) as local:
            _put_back(saved)
            yield local
    finally:
        _put_back(saved)


def _put_back(environ: dict) -> None:
    if dict(os.environ) != environ:
        os.environ.clear()
        os.environ.update(environ)


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(n_workers=2) as local:
        yield local


@pytest.fixture(scope="module")
def executor(cluster) -> str:
    return cluster.scheduler_address.replace("tcp://", "dask://")


@pytest.fixture(scope="module")
def local_build(tmp_path_factory, examples_template):
    """(project, build JSON): the session's cold local build of the examples, copied."""
    base = tmp_path_factory.mktemp("local")
    made = examples_template(ARCH)
    project, _ = made.copy_to(base / "project", base / "store")
    return project, made.json


def test_a_dask_cluster_builds_the_examples_with_the_keys_and_artifacts_of_a_local_build(
        executor, local_build, run_kbuild, tmp_path):
    project = copy_examples(local_build[0], tmp_path / "elsewhere" / "project")
    remote = tmp_path / "remote"
    result = run_kbuild("build", "--json", "--arch", ARCH, "--executor", executor,
                        "--remote", remote.as_uri(), cwd=project, store=tmp_path / "store")
    assert result.returncode == 0, result.stderr
    assert result.json["warnings"] == []
    local = local_build[1]["targets"]
    rows = result.json["targets"]
    assert [(r["target"], r["key"], r["status"]) for r in rows] == \
        [(r["target"], r["key"], "built") for r in local]
    for row, mine in zip(rows, local):
        assert row["artifacts"] == mine["artifacts"], row["target"]
    for name, path in blob_files(tmp_path / "store").items():
        assert digest(blob_bytes(path)) == name
    # Results land in the remote too.
    objects = entry_files(tmp_path / "store", kind="object")
    assert objects  # the workers' separately compiled objects came back and were committed
    assert sorted(p.stem for p in (remote / "v1" / "entries").glob("??/*.json")) == \
        sorted([r["key"] for r in rows] + list(objects))
    print(f"dask build {result.json['summary']['seconds']}s, "
          f"local {local_build[1]['summary']['seconds']}s")


def test_a_client_whose_toolchain_differs_gets_a_clear_failed_row(
        executor, local_build, run_kbuild, tmp_path):
    # NUMBA_OPT changes generated code: the client's setting is not the workers'.
    result = run_kbuild("build", "--json", "--arch", ARCH, SAXPY, "--executor", executor,
                        cwd=local_build[0], store=tmp_path / "store", env={"NUMBA_OPT": "0"})
    assert result.returncode == 1
    (row,) = result.json["targets"]
    assert row["status"] == "failed"
    assert "has another toolchain than this machine: OPT 3 on the worker, 0 on the client" \
        in row["error"]
    assert not blob_files(tmp_path / "store")


def test_a_worker_that_computes_another_key_refuses_to_compile(cluster, local_build):
    from distributed import Client

    from kbuild.config import load_config
    from kbuild.execute.distributed import _plain
    from kbuild.backend.compiletime import process_config
    from kbuild.backend.toolchain import toolchain

    project, built = local_build
    bundle = project_bundle(load_config(project / "kbuild.toml"))
    row = next(r for r in built["targets"] if r["target"] == SAXPY)
    job = {"bundle": bundle["digest"], "config": bundle["config"], "names": [SAXPY],
           "archs": [ARCH], "options": {}, "target": [SAXPY, row["signature"], ARCH],
           "key": "0" * 32,
           "fingerprint": {"toolchain": toolchain(), "codegen": _plain(process_config())}}
    with Client(cluster.scheduler_address, set_as_default=False) as client:
        result = client.submit(run_job, bundle["files"], job, pure=False).result()
        right = client.submit(run_job, bundle["files"], dict(job, key=row["key"]),
                              pure=False).result()
    assert "artifacts" not in result
    assert f"computes key {row['key']} for {SAXPY}" in result["error"]
    assert f"this machine {'0' * 32}" in result["error"]
    artifacts = from_data(right["artifacts"])
    assert {"ptx": digest(artifacts.ptx), "cubin": digest(artifacts.cubin)} == row["artifacts"]


def test_results_travel_as_plain_data_and_only_kbuild_dataclasses_come_back():
    from kbuild.backend.compiler import Artifacts

    artifacts = Artifacts(ptx=b"//ptx", cubin=b"\x7fELF", entry="k", cooperative=False)
    data = to_data(artifacts)
    assert from_data(data) == artifacts

    def plain(value):
        return isinstance(value, (str, bytes, int, float, bool, type(None))) or \
            isinstance(value, list) and all(map(plain, value)) or \
            isinstance(value, dict) and all(isinstance(k, str) and plain(v)
                                            for k, v in value.items())

    assert plain(data)
    with pytest.raises(ValueError, match="refusing to make a os:PathLike"):
        from_data(dict(data, dataclass="os:PathLike"))


def test_an_unreachable_scheduler_warns_and_builds_here(local_build, run_kbuild, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = run_kbuild("build", "--json", "--arch", ARCH, SAXPY, "--executor",
                        f"dask://127.0.0.1:{port}", "--remote-timeout", "1",
                        cwd=local_build[0], store=tmp_path / "store")
    assert result.returncode == 0, result.stderr
    assert result.json["targets"][0]["status"] == "built"
    (warning,) = result.json["warnings"]
    assert warning.startswith(f"dask scheduler tcp://127.0.0.1:{port} unreachable")
    assert warning.endswith("compiling here instead")


def test_a_cluster_serves_both_waves_of_a_rebuild(executor, run_kbuild, tmp_path):
    """A callee edit whose compile fails: with -k the target that makes the callee's object
    fails on the cluster, and the targets waiting on that object are compiled there next."""
    pkg = tmp_path / "project" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    helpers = pkg / "helpers.py"
    helpers.write_text("from numba import cuda\n\n\n@cuda.jit(device=True)\n"
                       "def f(x):\n    return x + 1.0\n")
    kernels = ["from numba import cuda\n\nfrom pkg.helpers import f\n"]
    toml = ['[project]', 'paths = ["."]', f'arch = ["{ARCH}"]', '']
    for name in ("k1", "k2", "k3"):
        kernels.append(f"\n\n@cuda.jit\ndef {name}(x):\n    x[0] = f(x[0])\n")
        toml += [f'[kernels."pkg.kern:{name}"]', 'signatures = ["void(float32[::1])"]', '']
    (pkg / "kern.py").write_text("".join(kernels))
    (tmp_path / "project" / "kbuild.toml").write_text("\n".join(toml))
    store = tmp_path / "store"
    first = run_kbuild("build", "--json", cwd=tmp_path / "project", store=store)
    assert first.returncode == 0, first.stderr

    helpers.write_text(helpers.read_text().replace("x + 1.0", 'x + "one"'))  # fails typing
    result = run_kbuild("build", "--json", "-k", "--executor", executor,
                        cwd=tmp_path / "project", store=store)
    assert result.returncode == 1, result.stderr
    rows = result.json["targets"]
    assert [r["status"] for r in rows] == ["failed"] * 3
    assert all("TypingError" in r["error"] for r in rows), [r["error"] for r in rows]


LIARS = {
    # PTX for another arch than the target's.
    "arch": """
    artifacts, seconds = _real(the_plan, target, *args, **kwargs)
    ptx = artifacts.ptx.replace(b".target sm_90", b".target sm_80")
    return dataclasses.replace(artifacts, ptx=ptx), seconds
""",
    # Another kernel's compile: binaries that agree with each other, for the wrong kernel.
    "kernel": """
    other = next(t for t in the_plan.targets if t.arch == target.arch
                 and t.name != target.name)
    return _real(the_plan, other, *args, **kwargs)
""",
}
PRELOAD = """
# A Dask worker preload: what this worker compiles for saxpy is not saxpy's binary.
import dataclasses

import kbuild.builder.cluster as cluster

_real = cluster.compile_target


def _lying(the_plan, target, *args, **kwargs):
    if target.name != "examples.saxpy:saxpy":
        return _real(the_plan, target, *args, **kwargs)
{body}

def dask_setup(worker):
    cluster.compile_target = _lying
"""


@pytest.mark.parametrize("lie, problem", [
    ("arch", "its PTX targets sm_80, not sm_90"),
    ("kernel", "its entry symbol _ZN"),
])
def test_a_worker_returning_what_its_target_is_not_fails_it_and_nothing_is_stored(
        local_build, run_kbuild, tmp_path, lie, problem):
    preload = tmp_path / "liar.py"
    preload.write_text(PRELOAD.format(body=LIARS[lie]))
    with local_cluster(n_workers=1, preload=[str(preload)]) as liar:
        result = run_kbuild("build", "--json", "-k", "--arch", ARCH, SAXPY, POLY,
                            "--executor", liar.scheduler_address.replace("tcp://", "dask://"),
                            cwd=local_build[0], store=tmp_path / "store")
    assert result.returncode == 1, result.stderr
    rows = {r["target"]: r for r in result.json["targets"]}
    row, poly = rows[SAXPY], rows[POLY]
    assert (row["status"], poly["status"]) == ("failed", "built")
    assert row["error"].startswith(f"dask worker's result for {SAXPY} ")
    assert f"is not its binary ({problem}" in row["error"]
    assert row["error"].endswith("it is not stored: check that worker's toolchain")
    assert sorted(entry_files(tmp_path / "store")) == [poly["key"]]  # saxpy's: none


class _Finished:
    """A finished job as `distributed` hands it back (only `result()` is read)."""

    def __init__(self, result):
        self._result = result

    def result(self):
        return self._result


def test_a_result_whose_bytes_changed_on_the_way_is_refused():
    from kbuild.backend.base import Artifacts
    from kbuild.execute.distributed import _outcome, blob_digests

    data = to_data(Artifacts(ptx=b"//ptx", cubin=b"\x7fELF", entry="k", cooperative=False))
    sent = {"artifacts": data, "digests": blob_digests(data), "seconds": 1.0}
    assert _outcome(_Finished(sent))[0] == from_data(data)
    changed = dict(sent, artifacts=to_data(Artifacts(ptx=b"//ptX", cubin=b"\x7fELF", entry="k",
                                                     cooperative=False)))
    error, _ = _outcome(_Finished(changed))
    assert "do not match the hashes the worker sent; nothing of it is stored" in str(error)
    error, _ = _outcome(_Finished({"artifacts": {"dataclass": 3}, "digests": []}))
    assert "dask worker returned a malformed result" in str(error)
