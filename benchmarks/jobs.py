"""Cold builds of one generated project at several `-j` values, side by side in one run.

    python benchmarks/jobs.py [--n 512] [--jobs 1,2,4,8,16] [--out FILE]

Each `kbuild build -jN` goes into an empty store of its own (the same project, the same
warm file cache: numba and the project modules are imported once first, untimed), and
one plain sequential numba-cuda compile of every kernel in one process
(`seq_compile.py`) is the baseline. Prints a table and a JSON line: wall seconds, CPU
seconds (workers included) and the speed-up over -j1. Meant for a machine with more
cores than the CI's two (issue 22 asks for -j1..-j16 at N=512 on the 16-core GPU host).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gen_project  # noqa: E402
from run import N_DEVICE_FNS, Sandbox, expect, snapshot_kbuild, warm_up  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=512, help="kernels in the project")
    parser.add_argument("--jobs", default="1,2,4,8,16", help="-j values, comma-separated")
    parser.add_argument("--out", help="also write the JSON object here")
    args = parser.parse_args(argv)
    jobs = [int(j) for j in args.jobs.split(",") if j.strip()]
    with tempfile.TemporaryDirectory(prefix="kbuild-jobs-") as tmp:
        work = Path(tmp)
        snapshot_kbuild(work / "kbuild-src", None)
        box = Sandbox(work, args.n, work / "kbuild-src")
        gen_project.generate(box.project, args.n, gen_project.default_modules(args.n),
                             N_DEVICE_FNS)
        warm_up(box)
        rows = []
        seq = box.script("seq_compile.py", box.project, store=box.store("seq"))
        rows.append({"run": "sequential numba-cuda", "wall_s": round(seq.wall, 2),
                     "cpu_s": round(seq.cpu, 2)})
        for j in jobs:
            timed = box.kbuild(box.store(f"j{j}"), "-j", str(j))
            expect(timed.data, f"cold build -j{j}", built=args.n, failed=0)
            rows.append({"run": f"kbuild build -j{j}", "jobs": j, "wall_s": round(timed.wall, 2),
                         "cpu_s": round(timed.cpu, 2), "built": timed.data["built"],
                         "peak_rss_mb": timed.rss_mb})
    one = next((r["wall_s"] for r in rows if r.get("jobs") == 1), None)
    for r in rows:
        r["vs_j1"] = round(one / r["wall_s"], 2) if one else None
        r["vs_sequential"] = round(r["wall_s"] / rows[0]["wall_s"], 3)
    report = {"n": args.n, "cores": os.cpu_count(), "rows": rows}
    print(f"N={args.n}, {os.cpu_count()} cores")
    print(f"{'run':28} {'wall s':>8} {'cpu s':>8} {'vs -j1':>7} {'vs seq':>7}")
    for r in rows:
        print(f"{r['run']:28} {r['wall_s']:8.2f} {r['cpu_s']:8.2f} "
              f"{(r['vs_j1'] or 0):7.2f} {r['vs_sequential']:7.3f}")
    print(json.dumps(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
