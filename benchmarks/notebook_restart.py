"""Restart and run all: a notebook of N kernels, kbuild (warm store) against numba's JIT.

    python benchmarks/notebook_restart.py [--kernels 12] [--repeats 3] [--out FILE]

The notebook (the cells of tests/notebook_support.py's SETUP, then one cell of device
functions and N/2 cells of two kernels each, half of them calling a device function, then
a cell launching all of them) is executed in a fresh ipykernel by nbclient, under kbuild's
fake driver (no GPU: the times are the host side down to the driver call). Two ways,
alternating, each after a first run that fills kbuild's store:

- `kbuild`: `%load_ext kbuild` in the notebook, the store warm (a restart);
- `numba`: numba alone, as every restart is without a cache that works in a notebook.

For each: the time the notebook's own cells took in the kernel (from the end of SETUP,
which imports numba in both, to the last launch: `%load_ext kbuild` included) and the
wall time of the whole execution (kernel start included), medians of --repeats;
NVVM compiles counted. Prints a table and one JSON object.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from notebook_support import execute, write_files  # noqa: E402

DEVICE = """\
from numba import cuda
import numpy as np


@cuda.jit(device=True)
def twice(v):
    return v * 2.0


@cuda.jit(device=True)
def clamp(v, lo, hi):
    return min(max(v, lo), hi)
"""

PAIR = """\
@cuda.jit
def k{a}(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = twice(x[i]) + {a}.0


@cuda.jit
def k{b}(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = clamp(x[i] * {b}.0, 0.0, 100.0)
"""

LAUNCH = """\
x = device_array(np.arange(1024, dtype=np.float32))
out = device_array(np.zeros(1024, np.float32))
for kernel in ({names},):
    kernel[8, 128](x, out)
print("ELAPSED", time.perf_counter() - _t0)
snap("run all")
"""


def cells(n: int) -> list[str]:
    pairs = [PAIR.format(a=i, b=i + 1) for i in range(0, n, 2)]
    names = ", ".join(f"k{i}" for i in range(n))
    return [DEVICE, *pairs, LAUNCH.format(names=names)]


def run_once(root: Path, notebook_cells, mode: str, store: Path) -> dict:
    from nbclient import NotebookClient

    from notebook_support import notebook, snaps
    from zeroconf_support import env_for

    nb = notebook(notebook_cells, mode)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(root)}})
    start = time.perf_counter()
    client.execute(env=env_for(root, KBUILD_STORE=store))
    wall = time.perf_counter() - start
    (row,) = snaps(nb)
    elapsed = [float(line.split()[1]) for cell in nb.cells for o in cell.get("outputs", ())
               for line in o.get("text", "").splitlines() if line.startswith("ELAPSED ")]
    return {"cells_s": elapsed[0], "wall_s": wall, "nvvm": row["nvvm"],
            "counts": row["counts"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = write_files(Path(tmp) / "nb")
        store = Path(tmp) / "store"
        notebook_cells = cells(args.kernels)
        first = run_once(root, notebook_cells, "kbuild", store)  # fills the store
        runs: dict = {"kbuild": [], "numba": []}
        for _ in range(args.repeats):
            for mode in runs:
                runs[mode].append(run_once(root, notebook_cells, mode, store))
    result = {"kernels": args.kernels, "repeats": args.repeats, "python": sys.version.split()[0],
              "machine": platform.machine(), "cold kbuild": first}
    for mode, rows in runs.items():
        result[mode] = {"cells_s": statistics.median(r["cells_s"] for r in rows),
                        "wall_s": statistics.median(r["wall_s"] for r in rows),
                        "nvvm": [r["nvvm"] for r in rows], "counts": rows[-1]["counts"]}
    result["ratio_cells"] = result["numba"]["cells_s"] / result["kbuild"]["cells_s"]
    result["ratio_wall"] = result["numba"]["wall_s"] / result["kbuild"]["wall_s"]
    print(f"{'':8} {'cells s':>8} {'wall s':>8} {'NVVM compiles':>14}")
    for mode in ("kbuild", "numba"):
        r = result[mode]
        print(f"{mode:8} {r['cells_s']:8.2f} {r['wall_s']:8.2f} {str(r['nvvm']):>14}")
    print(f"numba / kbuild: {result['ratio_cells']:.1f}x (cells), "
          f"{result['ratio_wall']:.1f}x (wall)")
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
