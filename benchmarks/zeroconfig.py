"""Zero-config caching: generated programs of N lazy kernels, each run in a fresh process.

    python benchmarks/zeroconfig.py --kernels 16,64,256 [--repeats 5] [--fake-driver]
        [--cold-sizes 16,64] [--edit-sizes 64] [--profile] [--out FILE]

The program (generated in a temp dir) has N lazy `@cuda.jit` kernels in one module; each
calls `common` and one of four device functions (`dev0`..`dev3`, which call `common`
too) that live in another module, and reads a module constant. It launches them one
after the other. The ways, each timed in fresh processes with Python's bytecode cache on
(one untimed run of each way first writes `__pycache__`), medians of --repeats,
interleaved so that the machine's load falls on every way alike:

- `kbuild warm`: `kbuild.enable()` first, the store and the program journal filled by
  earlier runs (README: Zero-config caching);
- `kbuild warm, no journal`: the same with `KBUILD_JOURNAL=0`: every kernel keyed in full;
- `numba cache=True warm`: numba alone, its cache filled by an earlier run;
- `import numba.cuda`: the floor every program pays: `import numba.cuda` (and, with
  --fake-driver, the fake driver installed), the kernels' module imported, nothing
  launched;
- `kbuild cold` (sizes in --cold-sizes): `kbuild.enable()` on an empty store (a new one
  each repeat), every kernel compiled and stored;
- `numba jit` (the same sizes): numba alone, the same kernels without `cache=True`.

With --edit-sizes (default 64), the program also has a device function `half` that the
even kernels call (N/2 of N), and each repeat edits it (a new constant) before each way;
`--edit-kind body`: its callers' objects stay (relinked); `inline`: it is
`inline="always"`, so its callers' own code changes (compiled again):

- `kbuild after an edit`: `kbuild.enable()`, the store and journal warm from before the
  edit: the first launch that misses starts the background build (README: Edits
  recovered in parallel), the other changed kernels are built beside the program;
- `kbuild after an edit, no background`: the same with KBUILD_BACKGROUND=0: each changed
  kernel compiled when the program launches it;
- `numba jit after an edit`: numba alone, no cache: every kernel compiled as launched.

For each: seconds from process start to the first launch's driver call, to the N-th
launch's, and the whole process (wall and CPU). With --fake-driver (no GPU) every driver
call is kbuild's fake (`kbuild.testing.fake_device`): nothing runs on a device, so the times are
the host side down to the driver call; on a GPU (without it) the launches are real and the
last one is synchronized. `--profile` also runs one warm kbuild process per size under
cProfile and prints where its time went. Prints a table per size and one JSON object.
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
DEVICE_FUNCTIONS = 4

COMMON = textwrap.dedent("""\
    from numba import cuda

    BIAS = 0.5


    @cuda.jit(device=True)
    def common(v, k):
        return v * 2.0 + k + BIAS
    """)

DEVICE = textwrap.dedent("""\


    @cuda.jit(device=True)
    def dev{j}(v):
        return common(v, {j}.0) * {j}.5
    """)

KERNEL = textwrap.dedent("""\


    @cuda.jit{cache}
    def k{i}(x, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = common(x[i], {i}.0) + dev{j}(x[i]) * SCALE{half}
    """)

# The edit case's device function, called by the even kernels; each edit a new `{c}`.
HALF = textwrap.dedent("""\


    @cuda.jit(device=True)
    def half(v):
        return v * {c} + 1.0
    """)
# --edit-kind inline: `half` is inlined at numba IR level (inline="always"), so that an
# edit of its body changes its callers' own code (compiled again, not relinked).
HALF_INLINE = HALF.replace("device=True", 'device=True, inline="always"')


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
            from kbuild import testing
            stack = contextlib.ExitStack()
            driver = stack.enter_context(testing.fake_device("sm_80", record=False))
            x = driver.array(np.ones(4096, np.float32))
            out = driver.array(np.zeros(4096, np.float32))
        else:
            x = cuda.to_device(np.ones(4096, np.float32))
            out = cuda.device_array(4096, np.float32)
        module = __import__("zk_jit" if way in ("numba jit", "floor") else "zk")
        first = None
        if way != "floor":
            for i in range(n):
                getattr(module, f"k{i}")[16, 256](x, out)
                if first is None:
                    first = time.perf_counter() if not fake else driver.first_launch_at
            if not fake:
                cuda.synchronize()
        last = time.perf_counter()
        if first is None:
            first = last
        counts = {}
        if way == "kbuild":
            counts = dict(kbuild.zeroconf.current().counts)
        print(json.dumps({"first_s": first - T0, "all_s": last - T0,
                          "cpu_s": time.process_time(), "counts": counts}))
        """)


def write_program(root: Path, n: int, edit: int | None = None, kind: str = "body") -> None:
    """The generated program: `zcommon.py` (the shared device functions), `zk.py` (the
    kernels, cache=True), `zk_jit.py` (the same without), `main.py`. `edit`: the even
    kernels also call `half`, whose constant is `edit` (see `edit_half`)."""
    write_common(root, edit, kind)
    names = ", ".join(["common"] + [f"dev{j}" for j in range(DEVICE_FUNCTIONS)]
                      + (["half"] if edit is not None else []))
    for name, cache in (("zk", "(cache=True)"), ("zk_jit", "")):
        body = f"from numba import cuda\n\nfrom zcommon import {names}\n\nSCALE = 3.0\n"
        body += "".join(KERNEL.format(i=i, j=i % DEVICE_FUNCTIONS, cache=cache,
                                      half=" + half(x[i])" if edit is not None and i % 2 == 0
                                      else "")
                        for i in range(n))
        (root / f"{name}.py").write_text(body)
    (root / "main.py").write_text(_main_script())


def write_common(root: Path, edit: int | None = None, kind: str = "body") -> None:
    """`zcommon.py`; with `half(v)` returning `v * <edit>.25 + 1.0` when `edit` is given
    (inlined into its callers with `kind` "inline")."""
    common = COMMON + "".join(DEVICE.format(j=j) for j in range(DEVICE_FUNCTIONS))
    if edit is not None:
        source = HALF_INLINE if kind == "inline" else HALF
        common += source.format(c=f"{edit}.25")
    (root / "zcommon.py").write_text(common)


WARM = ("kbuild warm", "kbuild warm, no journal", "numba cache=True warm", "import numba.cuda")
COLD = ("kbuild cold", "numba jit")
EDIT = ("kbuild after an edit", "kbuild after an edit, no background", "numba jit after an edit")
_ARG = {"kbuild after an edit": "kbuild", "kbuild after an edit, no background": "kbuild",
        "numba jit after an edit": "numba jit",
        "kbuild warm": "kbuild", "kbuild warm, no journal": "kbuild", "kbuild cold": "kbuild", "numba cache=True warm": "numba cache",
        "numba jit": "numba jit", "import numba.cuda": "floor"}


def run_once(root: Path, way: str, mode: str, n: int, env: dict, prefix=()) -> dict:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *prefix, "main.py", _ARG[way], mode, str(n)],
                          cwd=root, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{way} failed:\n{done.stderr[-3000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    found["wall_s"] = wall
    return found


def measure(n: int, repeats: int, fake: bool, cold: bool, profile: bool) -> dict:
    mode = "fake" if fake else "gpu"
    with tempfile.TemporaryDirectory(prefix="kbuild-zeroconfig-bench-") as tmp:
        root = Path(tmp)
        write_program(root, n)
        env = dict(os.environ, PYTHONPATH=str(REPO), HOME=tmp, XDG_CACHE_HOME=tmp,
                   BENCH_STORE=str(root / "store"))
        for name in ("NUMBA_ENABLE_CUDASIM", "KBUILD_ENABLE", "NUMBA_CACHE_DIR",
                     "PYTHONDONTWRITEBYTECODE"):
            env.pop(name, None)
        # Untimed: fill the store and numba's cache, write every __pycache__.
        for way in ("kbuild warm", "numba cache=True warm", "import numba.cuda"):
            run_once(root, way, mode, n, env)
        rows, loads = {}, []
        for _ in range(repeats):
            loads.append(os.getloadavg()[0])
            for way in WARM:
                way_env = dict(env, KBUILD_JOURNAL="0") if "no journal" in way else env
                rows.setdefault(way, []).append(run_once(root, way, mode, n, way_env))
            if cold:
                cold_env = dict(env, BENCH_STORE=str(root / "cold-store"))
                rows.setdefault("kbuild cold", []).append(
                    run_once(root, "kbuild cold", mode, n, cold_env))
                shutil.rmtree(root / "cold-store", ignore_errors=True)
                rows.setdefault("numba jit", []).append(run_once(root, "numba jit", mode, n, env))
        result = {"kernels": n, "repeats": repeats, "load": [round(x, 2) for x in loads],
                  "ways": {way: _medians(runs) for way, runs in rows.items()},
                  "counts": rows["kbuild warm"][-1].get("counts", {})}
        if profile:
            result["profile"] = _profile(root, mode, n, env)
        return result


def measure_edit(n: int, repeats: int, fake: bool, kind: str = "body") -> dict:
    """After an edit of `half` (N/2 of N kernels call it): seconds until every kernel has
    launched, kbuild (with and without its background build) and numba's JIT side by side;
    `half` edited again before each way, so that each finds N/2 kernels changed."""
    mode = "fake" if fake else "gpu"
    with tempfile.TemporaryDirectory(prefix="kbuild-zeroconfig-edit-") as tmp:
        root = Path(tmp)
        edit = 1
        write_program(root, n, edit, kind)
        env = _environment(root)
        run_once(root, "kbuild after an edit", mode, n, env)  # untimed: store and journal
        rows, loads, helper = {}, [], []
        for _ in range(repeats):
            loads.append(os.getloadavg()[0])
            for way in EDIT:
                edit += 1
                write_common(root, edit, kind)
                way_env = dict(env, KBUILD_BACKGROUND="0" if "no background" in way else "1")
                found = run_once(root, way, mode, n, way_env)
                rows.setdefault(way, []).append(found)
                if way == "kbuild after an edit":
                    helper.append(found.get("counts", {}))
        return {"kernels": n, "repeats": repeats, "load": [round(x, 2) for x in loads],
                "ways": {way: _medians(runs) for way, runs in rows.items()},
                "counts": helper[-1], "edit": kind}


def _environment(root: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), HOME=str(root), XDG_CACHE_HOME=str(root),
               BENCH_STORE=str(root / "store"))
    for name in ("NUMBA_ENABLE_CUDASIM", "KBUILD_ENABLE", "NUMBA_CACHE_DIR",
                 "PYTHONDONTWRITEBYTECODE", "KBUILD_BACKGROUND"):
        env.pop(name, None)
    return env


def edit_table(result: dict) -> str:
    ways = result["ways"]
    jit = ways["numba jit after an edit"]
    lines = [f"N = {result['kernels']} kernels, N/2 of them call the edited device function "
             f"(edit: {result['edit']}); "
             f"medians of {result['repeats']} fresh processes, 1-min load "
             f"{min(result['load'])}-{max(result['load'])}",
             "", "| way | first launch s | all N launched s | process wall s | CPU s | "
             "all launched vs numba jit | wall vs numba jit |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for way in EDIT:
        row = ways[way]
        lines.append(f"| {way} | {row['first_s']:.3f} | {row['all_s']:.3f} | "
                     f"{row['wall_s']:.3f} | {row['cpu_s']:.3f} | "
                     f"{row['all_s'] / jit['all_s']:.2f}x | {row['wall_s'] / jit['wall_s']:.2f}x |")
    lines.append(f"\nkbuild's counts in the program (last repeat): {result['counts']}")
    return "\n".join(lines)


def _profile(root: Path, mode: str, n: int, env: dict) -> str:
    """One warm kbuild process under cProfile: the functions with the most cumulative time."""
    out = root / "warm.prof"
    # Twice: under cProfile the program is another (`-m cProfile`), with a journal of its own.
    for _ in range(2):
        run_once(root, "kbuild warm", mode, n, env, prefix=("-m", "cProfile", "-o", str(out)))
    import io
    import pstats

    text = io.StringIO()
    stats = pstats.Stats(str(out), stream=text)
    stats.sort_stats("cumulative").print_stats(r"kbuild|numba/cuda/dispatcher", 30)
    return text.getvalue()


def _medians(runs) -> dict:
    return {k: round(statistics.median(r[k] for r in runs), 3)
            for k in ("first_s", "all_s", "wall_s", "cpu_s")}


def table(result: dict) -> str:
    ways = result["ways"]
    warm, floor = ways["numba cache=True warm"], ways["import numba.cuda"]
    jit = ways.get("numba jit")
    lines = [f"N = {result['kernels']} lazy kernels, medians of {result['repeats']} fresh "
             f"processes, 1-min load {min(result['load'])}-{max(result['load'])}",
             "", "| way | first launch s | all N launched s | process wall s | CPU s | "
             "wall vs numba cache=True warm | wall vs import numba.cuda | wall vs numba jit |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for way in (*WARM, *COLD):
        if way not in ways:
            continue
        row = ways[way]
        vs_jit = f"{row['wall_s'] / jit['wall_s']:.2f}x" if jit else ""
        lines.append(f"| {way} | {row['first_s']:.3f} | {row['all_s']:.3f} | "
                     f"{row['wall_s']:.3f} | {row['cpu_s']:.3f} | "
                     f"{row['wall_s'] / warm['wall_s']:.2f}x | "
                     f"{row['wall_s'] / floor['wall_s']:.2f}x | {vs_jit} |")
    return "\n".join(lines)


def _sizes(text: str) -> list:
    return [int(part) for part in text.split(",") if part.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default="16,64,256", help="sizes, comma-separated")
    parser.add_argument("--cold-sizes", default="16,64",
                        help="sizes that also time kbuild cold and numba jit")
    parser.add_argument("--edit-sizes", default="64",
                        help="sizes that also time the recovery from an edit reaching N/2 "
                             "kernels (empty: none)")
    parser.add_argument("--edit-kind", default="body,inline",
                        help="body: a device function's body changes (its callers are "
                             "relinked); inline: an inline='always' one's (its callers are "
                             "compiled)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fake-driver", action="store_true",
                        help="no GPU: kbuild's fake driver; measures the host side only")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one warm kbuild process per size")
    parser.add_argument("--out", help="also write the JSON here")
    opts = parser.parse_args(argv)
    cold = set(_sizes(opts.cold_sizes))
    results, edits = [], []
    for n in _sizes(opts.kernels):
        result = measure(n, opts.repeats, opts.fake_driver, n in cold, opts.profile)
        results.append(result)
        print(table(result), flush=True)
        if opts.profile:
            print(result["profile"], flush=True)
    for n in _sizes(opts.edit_sizes):
        for kind in opts.edit_kind.split(","):
            edits.append(measure_edit(n, opts.repeats, opts.fake_driver, kind))
            print(edit_table(edits[-1]), flush=True)
    found = {"sizes": results, "edits": edits,
             "environment": {"python": platform.python_version(),
                             "device": "none (fake driver)" if opts.fake_driver else "GPU",
                             "cpus": os.cpu_count()}}
    text = json.dumps(found, indent=1)
    print(text)
    if opts.out:
        Path(opts.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
