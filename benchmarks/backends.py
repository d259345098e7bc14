"""The examples built under both backends, side by side: numba-cuda and numba-cuda-mlir.

    python benchmarks/backends.py [--repeats 3]

The examples (kbuild.toml at the repository root, sm_80 and sm_90) are copied to a
temp dir twice: as they are (numba-cuda), and ported to numba-cuda-mlir as a migrating
user ports them (tests/mlir_support.py: the imports changed, `backend` named). Both
copies declare the same 16 targets: the examples numba-cuda-mlir 0.6.0 compiles (the
three it does not, README "Backends", are left out of both). Every measurement is a
fresh `kbuild` process timed from outside (interpreter start-up and imports included),
numba-cuda and numba-cuda-mlir alternating (A B A B ...) so that the machine's load
hits both alike; each number is the median of the repeats:

  cold         `kbuild build -j2` into an empty store
  noop         `kbuild build` on the warm store
  edit_sq      rebuild after editing the device function examples.mathx.sq (numba-cuda
               relinks the kernels that do not inline it from stored objects;
               numba-cuda-mlir compiles them again: device functions are compiled into
               their callers)
  compile_sum  the cold build's compile seconds, summed over its rows (kbuild's own clock
               inside the worker processes: the compiler's share)

The 1-minute load average before each row is printed. Prints one JSON object, then a
markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import mlir_support  # noqa: E402

BACKENDS = ("numba-cuda", "numba-cuda-mlir")
EDIT = ("examples/mathx.py", "    return x * x\n", "    return x * x - x + x\n")


def _project(where: Path, backend: str) -> Path:
    project = where / backend
    shutil.copytree(REPO / "examples", project / "examples",
                    ignore=shutil.ignore_patterns("__pycache__", "package"))
    shutil.copy2(REPO / "kbuild.toml", project / "kbuild.toml")
    dropped = [n for n in mlir_support.UNSUPPORTED if n.startswith("examples.")]
    if backend == mlir_support.MLIR:
        mlir_support.port(project)
    else:  # the same targets: what numba-cuda-mlir cannot build is left out of both
        mlir_support.port_config(project / "kbuild.toml", dropped, name_backend=False)
    return project


def _kbuild(project: Path, store: Path, *args) -> tuple[float, dict]:
    env = dict(os.environ, HOME=str(project.parent / "home"), KBUILD_STORE=str(store),
               NUMBA_CACHE_DIR=str(project.parent / "home" / "numba-cache"),
               PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kbuild", "build", "--json", *args],
                          cwd=project, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"kbuild build in {project} exited {done.returncode}:\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return wall, json.loads(done.stdout)


def _round(where: Path, backend: str, i: int) -> dict:
    project = _project(where / f"{backend}-{i}", backend)
    store = where / f"{backend}-{i}" / "store"
    cold, result = _kbuild(project, store, "-j2")
    rows = result["targets"]
    assert {r["status"] for r in rows} == {"built"} and len(rows) == 16, rows
    noop, again = _kbuild(project, store)
    assert {r["status"] for r in again["targets"]} == {"cached"}
    path, old, new = EDIT
    (project / path).write_text((project / path).read_text().replace(old, new))
    edit, edited = _kbuild(project, store, "-j2")
    shutil.rmtree(where / f"{backend}-{i}")
    return {"cold": cold, "noop": noop, "edit_sq": edit,
            "compile_sum": sum(r["seconds"] for r in rows),
            "edit_built": sum(r["status"] == "built" for r in edited["targets"]),
            "edit_relinked": sum(r["link"] == "relink" for r in edited["targets"])}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if not mlir_support.INSTALLED:
        raise SystemExit(mlir_support.NOT_INSTALLED)
    runs = {b: [] for b in BACKENDS}
    loads = []
    with tempfile.TemporaryDirectory(prefix="kbuild-backends-") as tmp:
        for i in range(args.repeats):
            for backend in BACKENDS:
                loads.append(os.getloadavg()[0])
                runs[backend].append(_round(Path(tmp), backend, i))
    medians = {b: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
               for b, rs in runs.items()}
    print(json.dumps({"runs": runs, "medians": medians, "load_1min": loads,
                      "cpus": os.cpu_count()}, indent=1))
    print("\n| examples, 16 targets (8 kernels x sm_80, sm_90) | numba-cuda | numba-cuda-mlir |")
    print("|---|---:|---:|")
    for key, label in (("cold", "cold `kbuild build -j2`, s"), ("noop", "no-op build, s"),
                       ("edit_sq", "after editing `mathx.sq`, s"),
                       ("compile_sum", "compile seconds summed over the cold rows")):
        print(f"| {label} | {medians['numba-cuda'][key]:.2f} | "
              f"{medians['numba-cuda-mlir'][key]:.2f} |")
    print(f"| targets rebuilt after the edit (relinked) | {medians['numba-cuda']['edit_built']:.0f} "
          f"({medians['numba-cuda']['edit_relinked']:.0f}) | "
          f"{medians['numba-cuda-mlir']['edit_built']:.0f} "
          f"({medians['numba-cuda-mlir']['edit_relinked']:.0f}) |")
    print(f"\nload average (1 min) at the start of each round: "
          f"{', '.join(f'{x:.1f}' for x in loads)}; {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
