"""Zero-config caching: a program with N lazy kernels, each run in a fresh process.

    python benchmarks/zeroconfig.py --kernels 16 [--repeats 5] [--fake-driver] [--out FILE]

The program (generated in a temp dir) has N lazy `@cuda.jit(cache=True)` kernels, each
calling a device function that lives in another file, and launches them one after the
other. Three ways, each timed in fresh processes (medians of --repeats):

- `kbuild warm`: `kbuild.enable()` first, the store filled by an earlier run;
- `numba cache=True warm`: numba alone, its cache filled by an earlier run;
- `numba jit`: numba alone, the same kernels without `cache=True`.

For each: seconds from process start to the first launch's driver call, to the N-th
launch's, and the whole process (wall and CPU). With --fake-driver (no GPU) every driver
call is kbuild's fake (backend/fakedriver.py): nothing runs on a device, so the times are
the host side down to the driver call; on a GPU (without it) the launches are real and the
last one is synchronized. Prints a table and one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

COMMON = textwrap.dedent("""\
    from numba import cuda


    @cuda.jit(device=True)
    def common(v, k):
        return v * 2.0 + k
    """)

KERNEL = textwrap.dedent("""\


    @cuda.jit{cache}
    def k{i}(x, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = common(x[i], {i}.0)
    """)

def _main_script() -> str:
    return textwrap.dedent("""\
        import time
        T0 = time.perf_counter()
        import json, os, sys
        import numpy as np
        way, fake, n = sys.argv[1], sys.argv[2] == "fake", int(sys.argv[3])
        if way == "kbuild":
            import kbuild
            kbuild.enable(store=os.environ["BENCH_STORE"])
        from numba import cuda
        if fake:
            import contextlib
            from kbuild.backend import compiler, fakedriver
            stack = contextlib.ExitStack()
            driver = stack.enter_context(fakedriver.installed((8, 0), record=False))
            stack.enter_context(compiler.targeting((8, 0)))
            # numba binds (loads) a kernel it compiled before cache=True saves it, as on a GPU.
            from numba.cuda import dispatcher
            dispatcher._Kernel.bind = lambda self: self._codelibrary.get_cufunc()
            x = fakedriver.device_array(np.ones(4096, np.float32))
            out = fakedriver.device_array(np.zeros(4096, np.float32))
        else:
            x = cuda.to_device(np.ones(4096, np.float32))
            out = cuda.device_array(4096, np.float32)
        module = __import__("zk_jit" if way == "numba jit" else "zk")
        first = None
        for i in range(n):
            getattr(module, f"k{i}")[16, 256](x, out)
            if first is None:
                first = time.perf_counter() if not fake else driver.first_launch_at
        if not fake:
            cuda.synchronize()
        last = time.perf_counter()
        print(json.dumps({"first_s": first - T0, "all_s": last - T0,
                          "cpu_s": time.process_time()}))
        """)


def write_program(root: Path, n: int) -> None:
    (root / "zcommon.py").write_text(COMMON)
    for name, cache in (("zk", "(cache=True)"), ("zk_jit", "")):
        body = "from numba import cuda\n\nfrom zcommon import common\n"
        body += "".join(KERNEL.format(i=i, cache=cache) for i in range(n))
        (root / f"{name}.py").write_text(body)
    (root / "main.py").write_text(_main_script())


WAYS = ("kbuild warm", "numba cache=True warm", "numba jit")


def run_once(root: Path, way: str, mode: str, n: int, env: dict) -> dict:
    arg = {"kbuild warm": "kbuild", "numba cache=True warm": "numba cache",
           "numba jit": "numba jit"}[way]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "main.py", arg, mode, str(n)], cwd=root, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{way} failed:\n{done.stderr[-3000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    found["wall_s"] = wall
    return found


def measure(n: int, repeats: int, fake: bool) -> dict:
    mode = "fake" if fake else "gpu"
    with tempfile.TemporaryDirectory(prefix="kbuild-zeroconfig-bench-") as tmp:
        root = Path(tmp)
        write_program(root, n)
        env = dict(os.environ, PYTHONPATH=str(REPO), HOME=tmp, XDG_CACHE_HOME=tmp,
                   BENCH_STORE=str(root / "store"))
        for name in ("NUMBA_ENABLE_CUDASIM", "KBUILD_ENABLE", "NUMBA_CACHE_DIR"):
            env.pop(name, None)
        cold = {"kbuild cold": run_once(root, "kbuild warm", mode, n, env),   # fills the store
                "numba cache=True cold": run_once(root, "numba cache=True warm", mode, n, env)}
        rows, loads = {}, []
        for _ in range(repeats):  # interleaved: the machine's load falls on every way alike
            loads.append(os.getloadavg()[0])
            for way in WAYS:
                rows.setdefault(way, []).append(run_once(root, way, mode, n, env))
        result = {way: _medians(runs) for way, runs in rows.items()}
        result.update({way: _medians([r]) for way, r in cold.items()})
        return {"kernels": n, "repeats": repeats, "load": [round(x, 2) for x in loads],
                "ways": result}


def _medians(runs) -> dict:
    return {k: round(statistics.median(r[k] for r in runs), 3)
            for k in ("first_s", "all_s", "wall_s", "cpu_s")}


def table(result: dict) -> str:
    ways = result["ways"]
    base = ways["numba cache=True warm"]
    lines = [f"N = {result['kernels']} lazy kernels, medians of {result['repeats']} fresh "
             f"processes, load {min(result['load'])}-{max(result['load'])}",
             "", "| way | first launch s | all N launched s | process wall s | CPU s | "
             "all N vs numba cache=True warm |", "|---|---:|---:|---:|---:|---:|"]
    for way in (*WAYS, "kbuild cold", "numba cache=True cold"):
        row = ways[way]
        lines.append(f"| {way} | {row['first_s']:.3f} | {row['all_s']:.3f} | "
                     f"{row['wall_s']:.3f} | {row['cpu_s']:.3f} | "
                     f"{row['all_s'] / base['all_s']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fake-driver", action="store_true",
                        help="no GPU: kbuild's fake driver; measures the host side only")
    parser.add_argument("--out", help="also write the JSON here")
    opts = parser.parse_args(argv)
    result = measure(opts.kernels, opts.repeats, opts.fake_driver)
    result["environment"] = {"python": platform.python_version(),
                             "device": "none (fake driver)" if opts.fake_driver else "GPU",
                             "cpus": os.cpu_count()}
    print(table(result))
    text = json.dumps(result, indent=1)
    print(text)
    if opts.out:
        Path(opts.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
