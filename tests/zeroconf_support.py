"""A small program with lazy kernels, and a harness that runs it in a fresh process.

The program (`app.py` + `app_kernels.py` + `mathlib.py`, the device function in a file
of its own) launches its kernels under `kbuild.testing.fake_device` (the launch path runs for real
down to the `cuda.core` call) on an sm_80 "device". The
harness counts what a run compiled: NVVM compiles (`nvvm.compile_ir`) and links (numba's
`_Linker.complete`, cuda.core's `Linker.link` and nvJitLink's own `complete`), and records the
digest of every binary the driver was handed. Modes: `kbuild` (`kbuild.enable()` first),
`numba` (numba alone; the kernels say `cache=True`, so this is numba's own cache) and
`env` (nothing in the program: KBUILD_ENABLE and the startup hook do it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import zygote

REPO = Path(__file__).resolve().parents[1]

MATHLIB = """\
from numba import cuda


@cuda.jit(device=True)
def twice(v):
    return v * 2.0
"""

KERNELS = """\
from numba import cuda

import mathlib


@cuda.jit(cache=True)
def scale(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = mathlib.twice(x[i])


@cuda.jit(cache=True)
def shift(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] + 1.0


class Filters:
    @staticmethod
    @cuda.jit
    def smooth(x, out):
        i = cuda.grid(1)
        if 0 < i < x.size - 1:
            out[i] = (x[i - 1] + x[i] + x[i + 1]) / 3.0


def make_scaler(factor):
    @cuda.jit
    def scaler(x, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = x[i] * factor
    return scaler


scale3 = make_scaler(3.0)
scale5 = make_scaler(5.0)
"""

APP = """\
import numpy as np

import app_kernels as K


def main(device_array, which=("scale", "shift")):
    x = device_array(np.arange(64, dtype=np.float32))
    out = device_array(np.zeros(64, np.float32))
    for name in which:
        if name == "closures":  # two closures of one factory, kept on nothing
            for factor in (7.0, 9.0):
                K.make_scaler(factor)[2, 32](x, out)
            continue
        kernel = K.Filters.smooth if name == "smooth" else getattr(K, name)
        kernel[2, 32](x, out)
"""

HARNESS = """\
import json, os, sys, warnings
sys.path.insert(0, os.getcwd())
mode, which = sys.argv[1], sys.argv[2].split(",")
report = {"nvvm": 0, "links": 0, "launches": 0}

import numba.cuda.cudadrv.nvvm as _nvvm
_compile_ir = _nvvm.compile_ir
def _counted_ir(*a, **k):
    report["nvvm"] += 1
    return _compile_ir(*a, **k)
_nvvm.compile_ir = _counted_ir
from numba.cuda.cudadrv import driver as _driver
_complete = _driver._Linker.complete
def _counted_complete(self, *a, **k):
    report["links"] += 1
    return _complete(self, *a, **k)
_driver._Linker.complete = _counted_complete
import cuda.core as _core
class _CountingLinker(_core.Linker):
    def link(self, *a, **k):
        report["links"] += 1
        return super().link(*a, **k)
_core.Linker = _CountingLinker
from cuda.bindings import nvjitlink as _nvjitlink
_nvjitlink_complete = _nvjitlink.complete
def _counted_nvjitlink(*a, **k):
    report["links"] += 1
    return _nvjitlink_complete(*a, **k)
_nvjitlink.complete = _counted_nvjitlink

from kbuild import testing
from kbuild.keying.encode import digest

_arch = "sm_%d%d" % tuple(json.loads(os.environ.get("HARNESS_CC", "[8, 0]")))  # the device's
with testing.fake_device(_arch, record=False) as fake:
    session = None
    if mode == "kbuild":
        import kbuild
        session = kbuild.enable(**json.loads(os.environ.get("HARNESS_ENABLE", "{}")))
    elif mode == "env":
        from kbuild import zeroconf
        session = zeroconf.current()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import app
        app.main(fake.array, which)
    report["launches"] = fake.launch_count
    report["loads"] = [[l.entry, l.kind, digest(l.binary)] for l in fake.loads]
    report["warnings"] = [str(w.message) for w in caught
                          if "kbuild" in str(w.message)]
    if session is not None:
        report["counts"] = dict(session.counts)
        report["served"] = [list(s) for s in session.served]
        if session.journal is not None:
            report["journal"] = dict(session.journal.counts)
        if hasattr(session, "background"):  # the helper rebuilding kernels (background.py)
            helper = session.background
            report["background"] = helper.wait(300) if helper is not None else None
    import app_kernels
    report["numba_cache_hits"] = sum(sum(v.stats.cache_hits.values())
                                     for v in vars(app_kernels).values()
                                     if hasattr(v, "stats") and hasattr(v, "py_func"))
print("REPORT " + json.dumps(report))
"""


def write_program(root: Path, kernels: str = KERNELS, app: str = APP, **more) -> Path:
    """The program in `root` (`more`: other modules, name -> source)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "mathlib.py").write_text(MATHLIB)
    (root / "app_kernels.py").write_text(kernels)
    (root / "app.py").write_text(app)
    (root / "_harness.py").write_text(HARNESS)
    for name, source in more.items():
        (root / f"{name}.py").write_text(source)
    return root


def env_for(root: Path, **extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), HOME=str(root), XDG_CACHE_HOME=str(root),
               PYTHONDONTWRITEBYTECODE="1")
    for name in ("NUMBA_ENABLE_CUDASIM", "KBUILD_ENABLE", "KBUILD_STORE", "KBUILD_REMOTE",
                 "NUMBA_CACHE_DIR"):
        env.pop(name, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(root: Path, mode: str, which=("scale", "shift"), *, enable=None, env=None,
        check=True) -> dict:
    """Run the program once in a fresh process; its report (see HARNESS)."""
    environment = env_for(root, **(env or {}))
    if enable is not None:
        environment["HARNESS_ENABLE"] = json.dumps(enable)
    done = zygote.run([sys.executable, "_harness.py", mode, ",".join(which)], cwd=root,
                      env=environment, text=True, timeout=600)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    report = json.loads(lines[-1][len("REPORT "):]) if lines else {}
    report["stderr"] = done.stderr
    report["returncode"] = done.returncode
    return report


def kbuild(root: Path, *args, env=None) -> subprocess.CompletedProcess:
    return zygote.run([sys.executable, "-m", "kbuild", *args], cwd=root,
                      env=env_for(root, **(env or {})), text=True, timeout=600)


def declare(root: Path, kernels: dict, arch: str = "sm_80", extra: str = "") -> None:
    """A kbuild.toml declaring `kernels` (name -> [signature, ...])."""
    lines = ["[project]", 'name = "zc"', 'paths = ["."]', f'arch = ["{arch}"]', extra, ""]
    for name, signatures in kernels.items():
        lines += [f'[kernels."{name}"]',
                  "signatures = [" + ", ".join(json.dumps(s) for s in signatures) + "]", ""]
    (root / "kbuild.toml").write_text("\n".join(lines))


def cubin_of(store: Path, key: str) -> str:
    manifest = json.loads((store / "v1" / "entries" / key[:2] / f"{key}.json").read_text())
    return manifest["artifacts"]["cubin"]


def dedent(text: str) -> str:
    return textwrap.dedent(text)
