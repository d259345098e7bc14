"""numba-cuda-mlir on a GPU: kbuild's launches against its own JIT and its own launcher.

    python benchmarks/launch_mlir.py [--launches 20000] [--out FILE]     # on a GPU

A small numba-cuda-mlir project (`from numba_cuda_mlir import cuda`: saxpy, no arguments,
16 float32 scalars, 16 arrays, a 2-d kernel calling a device function, a record
argument) is built by `kbuild build` for the device's arch with `backend =
"numba-cuda-mlir"`. Then, in one process:

- results: every kernel launched through `proj.kernel(...)` (kbuild's launcher, its
  memref ABI) and through the installed dispatcher (`proj.install()`) is compared with
  numba-cuda-mlir's own JIT of the same Python function on the same inputs;
- per launch: N launches then one synchronize (median of --repeats, after a warm-up),
  numba-cuda-mlir's own dispatcher (its C++ launcher) beside `proj.kernel(...)`.

Prints a table and one JSON object (also written to --out). Needs numba-cuda-mlir and a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GRID, BLOCK, ELEMENTS = 256, 256, 256 * 256

MODULE = '''
import numpy as np
from numba_cuda_mlir import cuda

POINT = np.dtype([("x", np.float32), ("y", np.float32)], align=True)


@cuda.jit(device=True)
def poly(v, k):
    return v * v * k + 1.0


@cuda.jit
def noargs():
    pass


@cuda.jit
def saxpy(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


@cuda.jit
def scalars16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):
    pass


@cuda.jit
def arrays16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):
    i = cuda.grid(1)
    if i < a0.size:
        a0[i] = a1[i] + a2[i] + a3[i] + a15[i]


@cuda.jit
def grid2d(a, k, out):
    i, j = cuda.grid(2)
    if i < a.shape[0] and j < a.shape[1]:
        out[i, j] = poly(a[i, j], k) - j


@cuda.jit
def norms(points, out):
    i = cuda.grid(1)
    if i < points.size:
        out[i] = (points[i].x * points[i].x + points[i].y * points[i].y) ** 0.5
'''

F32 = "float32[::1]"
SIGNATURES = {
    "noargs": "void()",
    "saxpy": f"void(float32, {F32}, {F32}, {F32})",
    "scalars16": "void(" + ", ".join(["float32"] * 16) + ")",
    "arrays16": "void(" + ", ".join([F32] * 16) + ")",
    "grid2d": "void(float64[:, ::1], float64, float64[:, ::1])",
    "norms": f"void(POINT[::1], {F32})",
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kbuild-mlir-gpu-") as tmp:
        root = Path(tmp)
        arch = _device_arch()
        _build(root, arch)
        sys.path.insert(0, str(root))
        from kbuild import Project

        proj = Project.load(root / "kbuild.toml", store=root / "store", on_miss="error")
        result = {"arch": arch, "results": _results(proj), "per_launch_us": _timed(proj, opts)}
    text = json.dumps(result, indent=1)
    print(text)
    if opts.out:
        Path(opts.out).write_text(text + "\n")
    return 0


def _device_arch() -> str:
    from cuda.core import Device

    major, minor = Device(0).compute_capability
    return f"sm_{major}{minor}"


def _build(root: Path, arch: str) -> None:
    (root / "pmg.py").write_text(textwrap.dedent(MODULE))
    kernels = "".join(f'\n[kernels."pmg:{name}"]\nsignatures = ["{sig}"]\n'
                      for name, sig in SIGNATURES.items())
    (root / "kbuild.toml").write_text(
        f'[project]\nname = "pmg"\npaths = ["."]\narch = ["{arch}"]\n'
        f'backend = "numba-cuda-mlir"\n{kernels}')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(root)]), HOME=str(root))
    done = subprocess.run([sys.executable, "-m", "kbuild", "build", "--store",
                           str(root / "store")], cwd=root, env=env, capture_output=True,
                          text=True)
    print(done.stdout[-3000:], done.stderr[-3000:])
    if done.returncode != 0:
        raise SystemExit("kbuild build failed")


def _inputs():
    import numpy as np

    import pmg

    rng = np.random.default_rng(3)
    pts = np.zeros(4096, dtype=pmg.POINT)
    pts["x"], pts["y"] = rng.standard_normal(4096), rng.standard_normal(4096)
    return {
        "saxpy": ((1, 1), (np.float32(2.5), rng.standard_normal(4096).astype(np.float32),
                           rng.standard_normal(4096).astype(np.float32)),
                  np.float32, 4096),
        "grid2d": ((8, 6), (rng.standard_normal((64, 48)), 0.25), np.float64, (64, 48)),
        "norms": ((1, 1), (pts,), np.float32, 4096),
    }


def _results(proj) -> dict:
    """max |kbuild - its own JIT| per kernel and launch way ('error: ...' if one failed)."""
    import numpy as np
    from numba_cuda_mlir import cuda

    import pmg

    found = {}
    for name, (grid, args, dtype, shape) in _inputs().items():
        two_d = isinstance(shape, tuple)
        config = ((grid, (8, 8)) if two_d else ((4096 + 127) // 128, 128))
        outs = {}
        ways = {"own jit": lambda: cuda.jit(getattr(pmg, name).py_func),
                "kbuild": lambda: proj.kernel(f"pmg:{name}")}
        for way, make in ways.items():
            try:
                out = cuda.to_device(np.full(shape, np.nan, dtype=dtype))
                dev_args = tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a
                                 for a in args)
                make()[config](*dev_args, out)
                cuda.synchronize()
                outs[way] = out.copy_to_host()
            except Exception as exc:  # noqa: BLE001 - report, go on with the others
                outs[way] = f"error: {type(exc).__name__}: {exc}"[:300]
        ref, ours = outs["own jit"], outs["kbuild"]
        if isinstance(ref, str) or isinstance(ours, str):
            found[name] = {"own jit": ref if isinstance(ref, str) else "ok",
                           "kbuild": ours if isinstance(ours, str) else "ok"}
        else:
            found[name] = {"max_abs_diff": float(np.nanmax(np.abs(ref - ours))),
                           "unwritten": int(np.isnan(ours).sum())}
    return found


def _timed(proj, opts) -> dict:
    import numpy as np
    from numba_cuda_mlir import cuda

    import pmg

    arrays = [cuda.to_device(np.ones(ELEMENTS, np.float32)) for _ in range(16)]
    cases = {"0 args": ("noargs", ()), "4 args": ("saxpy", (np.float32(2.0), *arrays[:3])),
             "16 scalars": ("scalars16", tuple(np.float32(i) for i in range(16))),
             "16 arrays": ("arrays16", tuple(arrays))}
    rows = {}
    for case, (name, args) in cases.items():
        rows[case] = {}
        for way, kernel in (("own launcher", cuda.jit(getattr(pmg, name).py_func)),
                            ("kbuild", proj.kernel(f"pmg:{name}"))):
            try:
                rows[case][way] = _time(kernel[GRID, BLOCK], args, opts, cuda.synchronize)
            except Exception as exc:  # noqa: BLE001
                rows[case][way] = f"error: {type(exc).__name__}: {exc}"[:300]
    return rows


def _time(launch, args, opts, sync) -> dict:
    for _ in range(100):
        launch(*args)
    sync()
    runs = []
    for _ in range(opts.repeats):
        start = time.perf_counter()
        for _ in range(opts.launches):
            launch(*args)
        sync()
        runs.append((time.perf_counter() - start) / opts.launches * 1e6)
    return {"median": round(statistics.median(runs), 2), "min": round(min(runs), 2)}


if __name__ == "__main__":
    sys.exit(main())
