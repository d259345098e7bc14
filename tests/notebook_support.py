"""Notebooks run in a real ipykernel (driven by nbclient), under kbuild's fake driver.

A first cell (SETUP) does in the kernel what `zeroconf_support.HARNESS` does in a fresh
process: it counts NVVM compiles (`nvvm.compile_ir`), installs the fake driver (an sm_80
"device"; the launch path runs for real down to the `cuda.core` call), records the digest
of every binary loaded and collects kbuild's warnings. In mode `kbuild` the next cell is
`%load_ext kbuild`, as a user writes it; mode `env` leaves it to KBUILD_ENABLE (`kbuild
run`), mode `numba` to numba alone. A cell
`snap("label")` prints what happened since the previous snap as one `SNAP` line.

The notebook's own cells are the program: a device function, kernels that call it or
not, a record dtype, a closure factory, a kernel from a module beside the notebook and a
script run with `%run`.
"""

from __future__ import annotations

import json
from pathlib import Path

from zeroconf_support import env_for

SETUP = """\
import json, os, warnings
_report = {"nvvm": 0, "warnings": []}
import numba.cuda.cudadrv.nvvm as _nvvm
_compile_ir = _nvvm.compile_ir
def _counted_ir(*a, **k):
    _report["nvvm"] += 1
    return _compile_ir(*a, **k)
_nvvm.compile_ir = _counted_ir
from kbuild import testing
from kbuild.keying.encode import digest
# kept: a context left behind is closed when collected
_fake = testing.fake_device("sm_80", record=False)
_device = _fake.__enter__()
_shown = warnings.showwarning
def _showing(message, *a, **k):
    if "kbuild" in str(message):
        _report["warnings"].append(str(message))
    return _shown(message, *a, **k)
warnings.showwarning = _showing
warnings.simplefilter("always")
from kbuild import zeroconf as _zeroconf
device_array = testing.device_array
_seen = {"served": 0, "loads": 0, "warnings": 0, "nvvm": 0, "counts": {}}
def snap(label):
    _session = _zeroconf.current()
    counts = dict(_session.counts) if _session is not None else {}
    served = [s[:1] + s[3:] for s in _session.served] if _session is not None else []
    row = {"label": label, "nvvm": _report["nvvm"] - _seen["nvvm"],
           "counts": {k: v - _seen["counts"].get(k, 0) for k, v in counts.items()
                      if v != _seen["counts"].get(k, 0)},
           "served": served[_seen["served"]:],
           "loads": [[l.entry, digest(l.binary)] for l in _device.loads[_seen["loads"]:]],
           "warnings": _report["warnings"][_seen["warnings"]:]}
    _seen.update(served=len(served), loads=len(_device.loads), nvvm=_report["nvvm"],
                 warnings=len(_report["warnings"]), counts=counts)
    print("SNAP " + json.dumps(row))
import time
_t0 = time.perf_counter()  # the notebook's own cells start here (benchmarks time them)
"""

DEVICE = """\
from numba import cuda
import numpy as np


@cuda.jit(device=True)
def twice(v):
    return v * 2.0
"""

DEVICE_EDITED = DEVICE.replace("v * 2.0", "v * 2.0 + 1.0")

KERNELS = """\
@cuda.jit
def scale(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = twice(x[i])


@cuda.jit
def shift(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] + 1.0
"""

RECORDS = """\
point = np.dtype([("x", np.float32), ("y", np.float32)], align=True)


@cuda.jit
def norm1(pts, out):
    i = cuda.grid(1)
    if i < pts.size:
        out[i] = abs(pts[i].x) + abs(pts[i].y)
"""

CLOSURES = """\
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

MODULE = """\
from numba import cuda


@cuda.jit
def add1(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] + 1.0
"""

SCRIPT = """\
import numpy as np
from numba import cuda
from kbuild.testing import device_array


@cuda.jit
def from_script(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] - 1.0


from_script[2, 32](device_array(np.arange(64, dtype=np.float32)),
                   device_array(np.zeros(64, np.float32)))
"""

LAUNCH = """\
import modkernels
x = device_array(np.arange(64, dtype=np.float32))
out = device_array(np.zeros(64, np.float32))
scale[2, 32](x, out)
shift[2, 32](x, out)
scale3[2, 32](x, out)
scale5[2, 32](x, out)
modkernels.add1[2, 32](x, out)
norm1[2, 32](device_array(np.zeros(64, point)), out)
from_script[2, 32](device_array(np.arange(64.0)), device_array(np.zeros(64)))
snap("run all")
"""

# The notebook, as a user runs it top to bottom (SETUP first, with its mode).
RUN_ALL = [DEVICE, KERNELS, RECORDS, CLOSURES, "%run script.py", LAUNCH]
KERNEL_NAMES = ["__main__:from_script", "__main__:norm1", "__main__:scale", "__main__:scale3",
                "__main__:scale5", "__main__:shift", "modkernels:add1"]


def write_files(root: Path) -> Path:
    """The module and the script beside the notebook."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "modkernels.py").write_text(MODULE)
    (root / "script.py").write_text(SCRIPT)
    return root


def notebook(cells, mode: str = "kbuild"):
    """An nbformat notebook: SETUP, `%load_ext kbuild` (mode `kbuild`), then `cells`."""
    import nbformat

    first = [SETUP] + (["%load_ext kbuild"] if mode == "kbuild" else [])
    return nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(c) for c in [*first, *cells]],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}})


def execute(root: Path, cells, mode: str = "kbuild", env=None) -> list[dict]:
    """Run the notebook in a fresh kernel (cwd `root`); the SNAP rows its cells printed.
    A cell that raises fails the test with the kernel's traceback."""
    from nbclient import NotebookClient

    nb = notebook(cells, mode)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(root)}})
    client.execute(env=env_for(root, **(env or {})))
    return snaps(nb)


def snaps(nb) -> list[dict]:
    rows = []
    for cell in nb.cells:
        for output in cell.get("outputs", ()):
            for line in output.get("text", "").splitlines():
                if line.startswith("SNAP "):
                    rows.append(json.loads(line[len("SNAP "):]))
    return rows
