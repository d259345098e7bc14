"""Zero-config builds what numba-cuda's JIT builds for the device, target included.

numba-cuda's JIT compiles for a device's arch-specific target from compute capability 9.0
on (`CUDACodeLibrary._ensure_cc`: (9, 0) -> (9, 0, 'a'), so NVVM gets compute_90a and the
cubin is linked for sm_90a); NUMBA_FORCE_CUDA_CC names the arch instead. For each fake
device the toolchain supports, a zero-config kernel's stored PTX `.target` and the arch its
cubin was assembled for (ptxas's `-arch`, kept in the cubin's `.note.nv.tkinfo`) are
compared with what numba-cuda's own code library makes for that device, asked of numba
itself (its `_ensure_cc` for a device of that cc, then `compile_ptx` and `_Linker` as
`get_cubin` does). A second process serves the entry's cubin with no compile and no link.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

from conftest import blob_bytes
from zeroconf_support import run, write_program

SIG = "void(float32[::1], float32[::1])"
_PTX_TARGET = re.compile(rb"^\.target\s+(sm_\w+)", re.MULTILINE)
_PTXAS_ARCH = re.compile(rb"-arch (sm_\w+)")


def _numba_jit(cc: tuple, forced=None) -> tuple:
    """(PTX target, cubin arch) numba-cuda's JIT makes on a device of `cc`, asked of numba:
    its code library's arch for the current device, NVVM's arch option for it, and the
    linker `get_cubin` makes for it."""
    from numba import cuda, float32
    from numba.cuda import codegen, compile_ptx, config
    from numba.cuda.cudadrv import devices, driver

    def shift(x, out):  # app_kernels.shift of zeroconf_support, compiled by numba alone
        i = cuda.grid(1)
        if i < x.size:
            out[i] = x[i] + 1.0

    device = SimpleNamespace(device=SimpleNamespace(compute_capability=cc))
    with mock.patch.object(devices, "get_context", lambda *a, **k: device), \
            mock.patch.object(config, "FORCE_CUDA_CC", forced):
        jit_cc = codegen.CUDACodeLibrary._ensure_cc(None, None)
        ptx, _ = compile_ptx(shift, (float32[::1], float32[::1]), cc=jit_cc)
    linker = driver._Linker(max_registers=None, cc=jit_cc)
    linker.add_ptx(ptx.encode())
    cubin = linker.complete()
    return _ptx_target(ptx.encode()), _cubin_arch(bytes(getattr(cubin, "code", cubin)))


def _ptx_target(ptx: bytes) -> str:
    targets = set(_PTX_TARGET.findall(ptx))
    assert len(targets) == 1, targets
    return targets.pop().decode()


def _cubin_arch(cubin: bytes) -> str:
    """The arch ptxas assembled the cubin for (its command line, in the cubin's notes):
    the ELF header says sm_90 for an sm_90a cubin too."""
    archs = set(_PTXAS_ARCH.findall(cubin))
    assert len(archs) == 1, archs
    return archs.pop().decode()


def _stored(store: Path, key: str) -> dict:
    manifest = json.loads((store / "v1" / "entries" / key[:2] / f"{key}.json").read_text())
    blob = {kind: next((store / "v1" / "blobs").rglob(digest))
            for kind, digest in manifest["artifacts"].items() if kind in ("ptx", "cubin")}
    return {"arch": manifest["arch"], "ptx": _ptx_target(blob_bytes(blob["ptx"])),
            "cubin": _cubin_arch(blob_bytes(blob["cubin"]))}


def _supported(cc) -> bool:
    from kbuild.backend import supported_ccs

    return tuple(cc) in (supported_ccs() or ())


# (device cc, NUMBA_FORCE_CUDA_CC or None, the arch zero-config builds for)
CASES = [
    ((8, 6), None, "sm_86"),
    ((9, 0), None, "sm_90a"),
    ((10, 0), None, "sm_100a"),
    ((12, 0), None, "sm_120a"),
    ((9, 0), "9.0", "sm_90"),  # the forced cc, as numba reads it: no suffix
]


@pytest.mark.parametrize("cc, forced, arch", CASES,
                         ids=[f"sm_{a}{b}" + (f"-forced-{f}" if f else "")
                              for (a, b), f, _ in CASES])
def test_zero_config_builds_the_target_numbas_jit_builds(tmp_path, cc, forced, arch):
    if not _supported(cc):
        pytest.skip(f"the toolchain does not compile for sm_{cc[0]}{cc[1]}")
    root, store = write_program(tmp_path / "prog"), tmp_path / "store"
    env = {"HARNESS_CC": json.dumps(cc)}
    if forced:
        env["NUMBA_FORCE_CUDA_CC"] = forced
    first = run(root, "kbuild", ("shift",), enable={"store": str(store)}, env=env)
    assert first["counts"] == {"built": 1, "served": 1}, first["warnings"]
    (name, signature, served_arch, key), = first["served"]
    assert (name, signature, served_arch) == ("app_kernels:shift", SIG, arch)

    stored = _stored(store, key)
    numba_ptx, numba_cubin = _numba_jit(
        cc, tuple(int(v) for v in forced.split(".")) if forced else None)
    assert stored["ptx"] == numba_ptx == arch
    # Under NUMBA_FORCE_CUDA_CC numba assembles the forced PTX for the device's own
    # target; kbuild keeps the forced arch's cubin (same PTX: see README).
    assert stored["cubin"] == (arch if forced else numba_cubin)
    assert first["loads"][0][1] == "cubin"

    # A warm start: the journal answers, the stored cubin is loaded as it is.
    warm = run(root, "kbuild", ("shift",), enable={"store": str(store)}, env=env)
    assert warm["counts"] == {"hits": 1, "served": 1}
    assert warm["journal"]["answered"] == 1
    assert (warm["nvvm"], warm["links"]) == (0, 0)
    assert warm["served"] == first["served"]
    assert [load[1:] for load in warm["loads"]] == [load[1:] for load in first["loads"]]


def test_the_numba_cuda_backend_builds_numbas_jit_target():
    from kbuild.backend.backends import get

    backend = get("numba-cuda")
    assert backend.compile_arch("sm_86") == "sm_86"
    assert backend.compile_arch("sm_90") == "sm_90a"
    with mock.patch("numba.cuda.config.FORCE_CUDA_CC", (8, 0)):
        assert backend.compile_arch("sm_90") == "sm_80"
    with mock.patch("numba.cuda.config.FORCE_CUDA_CC", (9, 0)):
        assert backend.compile_arch("sm_90") == "sm_90"
    # A device newer than the toolchain: numba cannot compile its arch-specific target
    # (`get_arch_option` refuses to lower an 'a' arch); kbuild keeps the device's plain
    # arch, whose compile fails to link and is handed to numba, which says why.
    assert backend.compile_arch("sm_190") == "sm_190"


def test_the_mlir_backend_keeps_the_devices_plain_arch():
    """numba-cuda-mlir's JIT compiles for the device's plain arch (sm_90 on an sm_90)."""
    from kbuild.backend.backends import get, installed

    if not installed("numba-cuda-mlir"):
        pytest.skip("numba-cuda-mlir is not installed")
    assert get("numba-cuda-mlir").compile_arch("sm_90") == "sm_90"
    assert get("numba-cuda-mlir").compile_arch("sm_100") == "sm_100"


NEWER = """\
import json, sys
import numpy as np
import kbuild
from kbuild import testing

with testing.fake_device("sm_190", record=False) as fake:
    session = kbuild.enable(store=sys.argv[1])
    said = []
    session.warn = said.append
    import app_kernels as K
    try:
        K.shift[2, 32](fake.array(np.zeros(64, np.float32)), fake.array(np.zeros(64, np.float32)))
        raised = None
    except Exception as exc:
        raised = f"{type(exc).__name__}: {exc}"
print("REPORT " + json.dumps({"counts": dict(session.counts), "said": said, "raised": raised}))
"""


def test_a_device_newer_than_the_toolchain_is_left_to_numba(tmp_path):
    """numba-cuda cannot compile a newer device's arch-specific target; kbuild tries the
    device's plain arch, which the toolchain cannot link either, says so and hands the
    kernel to numba, which raises its own error."""
    from zeroconf_support import env_for

    import zygote

    if _supported((19, 0)):
        pytest.skip("the toolchain compiles for sm_190")
    root = write_program(tmp_path / "prog", newer=NEWER)
    done = zygote.run([sys.executable, "newer.py", str(tmp_path / "store")], cwd=root,
                      env=env_for(root), text=True, timeout=600)
    report = json.loads(done.stdout.splitlines()[-1][len("REPORT "):])
    assert report["counts"] == {"built": 0, "fallback": 1}
    said, = report["said"]
    assert said.startswith("kbuild: app_kernels:shift void(float32[::1], float32[::1]) "
                           "sm_190: ") and said.endswith("numba compiles it")
    assert report["raised"].startswith("ValueError: Can't use arch-specific compute_190a")


def test_on_miss_error_names_the_arch_looked_up_and_how_to_build_it(tmp_path):
    """A store prebuilt for a declared sm_90 holds no sm_90a entry: a zero-config launch
    on an sm_90 device with on_miss='error' says it looked up sm_90a (numba-cuda's JIT
    target there), not sm_90, which the store does hold, and how to build what it needs."""
    from zeroconf_support import declare, kbuild

    root, store = write_program(tmp_path / "prog"), tmp_path / "store"
    declare(root, {"app_kernels:shift": [SIG]}, arch="sm_90")
    built = kbuild(root, "build", "--json", "--store", str(store))
    assert [(row["arch"], row["status"]) for row in json.loads(built.stdout)["targets"]] == \
        [("sm_90", "built")]
    (root / "kbuild.toml").unlink()
    failed = run(root, "kbuild", ("shift",), enable={"store": str(store), "on_miss": "error"},
                 env={"HARNESS_CC": "[9, 0]"}, check=False)
    assert failed["returncode"] != 0
    said = failed["stderr"].strip().splitlines()[-1]
    assert f"is not in store {store} for sm_90a, the arch numba-cuda compiles for on " \
           "this sm_90 device (on_miss='error')" in said, said
    assert "kbuild build --arch sm_90a" in said, said
