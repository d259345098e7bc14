"""Launch overhead and time to first launch: numba's dispatcher and kbuild, side by side.

    python benchmarks/launch.py [--launches 20000] [--out FILE]      # on a GPU
    python benchmarks/launch.py --fake-driver                        # no GPU: host side only

Per launch (one process, the same kernels and device arrays, `[256, 256]`): N launches
then one synchronize, for 0 arguments, saxpy's 4, 16 float32 scalars and 16 arrays,
through (a) a numba `@cuda.jit` dispatcher (compiled on its first launch), (b)
`proj.kernel(...)` and (c) the project's own dispatcher after `proj.install()`.
Time to first launch (fresh processes, whole-process wall time and in-process time to
the finished launch): kbuild from a warm store, numba `cache=True` with a warm cache, and
numba's JIT. Prints a table and one JSON object (also written to --out).

With --fake-driver every driver call is kbuild's fake (`kbuild.testing.fake_device`, as the
tests use): nothing runs on a device, a launch costs the host-side work down to the
driver call (argument packing, including cuda.core's own ParamHolder), and the first
launch is timed to the moment the driver would be called. The kernels are tests/launchproj's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = {"0 args": "noargs", "4 args": "saxpy", "16 scalars": "scalars16", "16 arrays": "arrays16"}
GRID, BLOCK, ELEMENTS = 256, 256, 256 * 256


def main(argv=None) -> int:
    opts = _options(argv)
    with tempfile.TemporaryDirectory(prefix="kbuild-launch-bench-") as tmp:
        root = Path(tmp)
        env = _environment(root)
        _build(root, env, opts.arch)
        sys.path.insert(0, str(root))
        result = {"environment": _versions(opts.fake_driver),
                  "launches": opts.launches,
                  "per_launch_us": _per_launch(root, opts),
                  "first_launch_s": _first_launches(root, env, opts)}
    print(_table(result))
    text = json.dumps(result, indent=1)
    print(text)
    if opts.out:
        Path(opts.out).write_text(text + "\n")
    return 0


def _options(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake-driver", action="store_true",
                        help="no GPU: kbuild's fake driver; measures the host side only")
    parser.add_argument("--launches", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arch", default=None, help="build for this arch (default: the "
                        "device's; sm_80 with --fake-driver)")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    opts = parser.parse_args(argv)
    if opts.arch is None:
        opts.arch = "sm_80" if opts.fake_driver else _device_arch()
    return opts


def _device_arch() -> str:
    from numba import cuda

    major, minor = cuda.get_current_device().compute_capability
    return f"sm_{major}{minor}"


def _environment(root: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(root)]),
               HOME=str(root), XDG_CACHE_HOME=str(root / "cache"),
               NUMBA_CACHE_DIR=str(root / "numba-cache"))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    return env


def _build(root: Path, env: dict, arch: str) -> None:
    shutil.copytree(REPO / "tests" / "launchproj", root, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (root / "nb_kernels.py").write_text(NUMBA_MODULE)
    if arch not in ("sm_80", "sm_90"):  # declare the device's arch, or its entry is not looked up
        toml = root / "kbuild.toml"
        toml.write_text(toml.read_text().replace('arch = ["sm_80", "sm_90"]',
                                                 f'arch = ["sm_80", "sm_90", "{arch}"]'))
    targets = [f"lk.bench:{name}" for name in CASES.values()]
    done = subprocess.run([sys.executable, "-m", "kbuild", "build", *targets, "--arch", arch,
                           "--store", str(root / "store")], cwd=root, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"kbuild build failed:\n{done.stdout}{done.stderr}")


NUMBA_MODULE = '''
from numba import cuda


@cuda.jit(cache=True)
def saxpy_cached(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


@cuda.jit
def saxpy_jit(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]
'''


# -- per launch, in this process ---------------------------------------------------------

def _per_launch(root: Path, opts) -> dict:
    from kbuild import Project

    proj = Project.load(root / "kbuild.toml", store=root / "store", on_miss="error")
    with _driver(opts, proj):
        from numba import cuda

        from lk import bench

        arguments = _arguments(opts.fake_driver)
        rows = {case: {} for case in CASES}
        for case, name in CASES.items():
            ways = {"numba": cuda.jit(getattr(bench, name).py_func)[GRID, BLOCK],
                    "kbuild": proj.kernel(f"lk.bench:{name}")[GRID, BLOCK]}
            for way, launch in ways.items():
                rows[case][way] = _time(launch, arguments[case], opts)
        proj.install([f"lk.bench:{name}" for name in CASES.values()])
        for case, name in CASES.items():
            rows[case]["install"] = _time(getattr(bench, name)[GRID, BLOCK], arguments[case], opts)
    return rows


def _arguments(fake: bool) -> dict:
    import numpy as np

    if fake:
        from kbuild.testing import device_array

        arrays = [device_array(np.ones(ELEMENTS, np.float32)) for _ in range(16)]
    else:
        from numba import cuda

        arrays = [cuda.to_device(np.ones(ELEMENTS, np.float32)) for _ in range(16)]
    return {"0 args": (), "4 args": (np.float32(2.0), *arrays[:3]),
            "16 scalars": tuple(np.float32(i) for i in range(16)), "16 arrays": tuple(arrays)}


def _time(launch, args, opts) -> dict:
    """µs per launch: N launches then one synchronize, `repeats` times (after a warm-up).
    With the fake driver: this process's CPU time (the host work; immune to other
    processes on a shared machine); on a GPU: wall time."""
    sync = _synchronize(opts.fake_driver)
    clock = time.process_time if opts.fake_driver else time.perf_counter
    for _ in range(100):
        launch(*args)
    sync()
    runs = []
    for _ in range(opts.repeats):
        start = clock()
        for _ in range(opts.launches):
            launch(*args)
        sync()
        runs.append((clock() - start) / opts.launches * 1e6)
    return {"median": round(statistics.median(runs), 2), "min": round(min(runs), 2)}


def _synchronize(fake: bool):
    if fake:
        return lambda: None
    from numba import cuda

    return cuda.synchronize


class _driver:
    """The fake driver (and compiles aimed at its arch) with --fake-driver, else nothing."""

    def __init__(self, opts, proj):
        self.opts, self.proj, self.stack = opts, proj, None

    def __enter__(self):
        import contextlib

        self.stack = contextlib.ExitStack()
        if self.opts.fake_driver:
            from kbuild import testing

            # numba's JIT compiles for its arch too
            self.stack.enter_context(testing.fake_device(self.opts.arch, record=False))
        return self

    def __exit__(self, *exc):
        self.stack.close()


# -- time to first launch, fresh processes ---------------------------------------------------

FIRST = textwrap.dedent('''
    import time
    T0 = time.perf_counter()
    import contextlib, json, sys
    import numpy as np
    way, fake = sys.argv[1], sys.argv[2] == "fake"
    if way == "kbuild":
        from kbuild import Project
        proj = Project.load("kbuild.toml", store="store", on_miss="error")
    from numba import cuda
    ctx = contextlib.ExitStack()
    if fake:
        from kbuild import testing
        fake_driver = ctx.enter_context(testing.fake_device("sm_80", record=False))
        x = fake_driver.array(np.ones(%(n)d, np.float32))
    else:
        x = cuda.to_device(np.ones(%(n)d, np.float32))
    if way == "kbuild":
        kernel = proj.kernel("lk.bench:saxpy")
    else:
        import nb_kernels
        kernel = nb_kernels.saxpy_cached if way == "numba cache=True" else nb_kernels.saxpy_jit
    kernel[%(grid)d, %(block)d](np.float32(2.0), x, x, x)
    if fake:
        done = fake_driver.first_launch_at
    else:
        cuda.synchronize()
        done = time.perf_counter()
    print(json.dumps({"in_process_s": done - T0}))
''' % {"n": ELEMENTS, "grid": GRID, "block": BLOCK})


def _first_launches(root: Path, env: dict, opts) -> dict:
    script = root / "first_launch.py"
    script.write_text(FIRST)
    mode = "fake" if opts.fake_driver else "gpu"
    _run_first(script, "numba cache=True", mode, root, env)  # fills numba's cache
    rows = {}
    for way in ("kbuild", "numba cache=True", "numba jit"):
        runs = [_run_first(script, way, mode, root, env) for _ in range(opts.repeats)]
        rows[way] = {"wall_s": round(statistics.median(r[0] for r in runs), 3),
                     "in_process_s": round(statistics.median(r[1] for r in runs), 3)}
    return rows


def _run_first(script: Path, way: str, mode: str, root: Path, env: dict):
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(script), way, mode], cwd=root, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"first launch ({way}) failed:\n{done.stderr[-3000:]}")
    return wall, json.loads(done.stdout.strip().splitlines()[-1])["in_process_s"]


# -- report ----------------------------------------------------------------------------------

def _versions(fake: bool) -> dict:
    from importlib.metadata import version

    found = {"python": platform.python_version(), "machine": platform.processor() or
             platform.machine(), "numba-cuda": version("numba-cuda"), "numba": version("numba"),
             "cuda-core": version("cuda-core"), "cuda-bindings": version("cuda-bindings"),
             "numpy": version("numpy"), "kbuild": _commit()}
    if fake:
        found.update(device="none (kbuild's fake driver: host-side cost only)", driver="none")
    else:
        found.update(_device())
    return found


def _device() -> dict:
    from cuda.bindings import driver
    from numba import cuda

    device = cuda.get_current_device()
    _, version = driver.cuDriverGetVersion()
    return {"device": f"{device.name.decode() if isinstance(device.name, bytes) else device.name}"
                      f" (sm_{device.compute_capability[0]}{device.compute_capability[1]})",
            "driver": f"CUDA {version // 1000}.{version % 1000 // 10}"}


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                          capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def _table(result: dict) -> str:
    what = "CPU µs, host side" if "fake" in result["environment"]["device"] else "µs"
    lines = [f"| per launch, {what} (median) | numba dispatcher | proj.kernel() | install()ed |",
             "|---|---:|---:|---:|"]
    for case, row in result["per_launch_us"].items():
        lines.append(f"| {case} | {row['numba']['median']} | {row['kbuild']['median']} "
                     f"| {row['install']['median']} |")
    lines += ["", "| time to first launch | whole process, s | in process, s |", "|---|---:|---:|"]
    for way, row in result["first_launch_s"].items():
        lines.append(f"| {way} | {row['wall_s']} | {row['in_process_s']} |")
    env = result["environment"]
    lines += ["", "; ".join(f"{k} {v}" for k, v in env.items())]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
