"""Zero-config caching and its store: many processes at once, a store that cannot be
written, kernels kbuild cannot key, and `on_miss`. Fresh processes, fake driver; work
is counted, never timed."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from zeroconf_support import env_for, run, write_program

FALLBACK_KERNELS = """\
import numpy as np
from numba import cuda

from kbuild import testing

TABLE = testing.device_array(np.ones(64, np.float32))  # a device pointer: no content


@cuda.jit
def lookup(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = TABLE[i] + x[i]


_ns = {"cuda": cuda, "__name__": __name__}
exec("def dynamic(x, out):\\n    i = cuda.grid(1)\\n    if i < x.size:\\n        out[i] = x[i]\\n",
     _ns)
dynamic = cuda.jit(_ns["dynamic"])


@cuda.jit
def scale(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] * 2.0
"""

FALLBACK_APP = """\
import numpy as np

import app_kernels as K


def main(device_array, which):
    for dtype in (np.float32, np.float64):  # two signatures each: still one warning each
        x = device_array(np.arange(64, dtype=dtype))
        out = device_array(np.zeros(64, dtype))
        for name in which:
            getattr(K, name)[2, 32](x, out)
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return write_program(tmp_path_factory.mktemp("zcs") / "prog")


def _copy(program, tmp_path):
    root = tmp_path / "prog"
    shutil.copytree(program, root)
    return root


def test_unkeyable_kernels_compile_through_numba_with_one_warning_each(tmp_path):
    root = write_program(tmp_path / "prog", FALLBACK_KERNELS, FALLBACK_APP)
    store = tmp_path / "store"
    report = run(root, "kbuild", ("lookup", "dynamic", "scale"), enable={"store": str(store)})
    assert report["launches"] == 6
    assert report["counts"] == {"built": 2, "served": 2, "fallback": 4}  # scale: 2 signatures
    warned = report["warnings"]
    assert len(warned) == 2, warned
    lookup, = [w for w in warned if "lookup" in w]
    assert "app_kernels:lookup is compiled by numba, not cached" in lookup
    assert "global 'TABLE' is a numba.cuda.cudadrv.devicearray.DeviceNDArray" in lookup
    dynamic, = [w for w in warned if "dynamic" in w]
    assert "no source file (<string>: made with exec" in dynamic
    # Nothing keyed by identity: the store holds scale's two entries (and their objects).
    manifests = [json.loads(p.read_text()) for p in (store / "v1" / "entries").rglob("*.json")]
    assert sorted(m["target"] for m in manifests if "target" in m) == ["app_kernels:scale"] * 2


def test_eight_processes_on_a_cold_store_compile_each_kernel_once(program, tmp_path):
    """Issue 25, item 4: 8 processes started at once (xdist workers, MPI ranks) share one
    store: each kernel is compiled by one of them (a per-key lock), the others wait and
    load its binary; every process launches the same binaries."""
    roots = []
    for i in range(8):
        root = tmp_path / f"rank{i}"
        shutil.copytree(program, root)
        roots.append(root)
    store = tmp_path / "store"
    enable = json.dumps({"store": str(store)})
    procs = [subprocess.Popen([sys.executable, "_harness.py", "kbuild", "scale,shift"], cwd=root,
                              env=dict(env_for(root), HARNESS_ENABLE=enable),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for root in roots]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err
        reports.append(json.loads(out.splitlines()[-1][len("REPORT "):]))
    assert sum(r["counts"].get("built", 0) for r in reports) == 2
    assert all(r["counts"]["served"] == 2 and r["launches"] == 2 for r in reports)
    assert len({json.dumps(sorted(r["loads"])) for r in reports}) == 1
    assert len({json.dumps(r["served"]) for r in reports}) == 1


def test_a_store_that_cannot_be_written_degrades_to_numba(program, tmp_path):
    root = _copy(program, tmp_path)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store should be")
    report = run(root, "kbuild", enable={"store": str(blocker / "store")})
    assert report["launches"] == 2 and report["counts"] == {"fallback": 2}
    assert len(report["warnings"]) == 1
    assert "not writable" in report["warnings"][0]
    assert "compiled by numba and not cached" in report["warnings"][0]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="chmod does not stop root from writing")
def test_a_read_only_store_still_serves_what_it_holds(program, tmp_path):
    root = _copy(program, tmp_path)
    store = tmp_path / "store"
    run(root, "kbuild", ("scale",), enable={"store": str(store)})
    for path in [store, *store.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        report = run(root, "kbuild", ("scale", "shift"), enable={"store": str(store)})
    finally:
        for path in [store, *store.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert report["counts"] == {"hits": 1, "served": 1, "fallback": 1}
    assert len(report["warnings"]) == 1


def test_on_miss_error_and_jit(program, tmp_path):
    root = _copy(program, tmp_path)
    store = tmp_path / "store"
    failed = run(root, "kbuild", ("scale",), enable={"store": str(store), "on_miss": "error"},
                 check=False)
    assert failed["returncode"] != 0
    assert "kernel 'app_kernels:scale' void(float32[::1], float32[::1]) is not in store" \
        in failed["stderr"]
    jit = run(root, "kbuild", ("scale",), enable={"store": str(store), "on_miss": "jit"})
    assert jit["counts"] == {"fallback": 1} and jit["launches"] == 1
    assert not (store / "v1" / "entries").exists()


def test_a_remote_serves_a_machine_with_an_empty_store(program, tmp_path):
    """Two machines (two stores) share a remote cache: what one compiled, the other loads
    without compiling, keeping a verified copy in its own store."""
    root = _copy(program, tmp_path)
    remote = f"file://{tmp_path / 'remote'}"
    first = run(root, "kbuild", enable={"store": str(tmp_path / "a"), "remote": remote})
    assert first["counts"] == {"built": 2, "served": 2}
    second = run(root, "kbuild", enable={"store": str(tmp_path / "b"), "remote": remote})
    assert (second["nvvm"], second["links"]) == (0, 0)
    assert second["counts"] == {"hits": 2, "served": 2}
    assert second["served"] == first["served"]
    assert len(list((tmp_path / "b" / "v1" / "entries").rglob("*.json"))) >= 2
