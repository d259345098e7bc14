"""No loss at run time: PTX instructions of kernels linked from objects vs whole-program.

    python benchmarks/instructions.py [--kernels 64] [--arch sm_90]

Builds one synthetic project (gen_project.py) twice in temp stores, with kbuild's
default separate compilation (LTO link) and with `--whole-program` (numba's own
way), and counts the instructions in each target's PTX. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gen_project  # noqa: E402


def instructions(ptx: str) -> int:
    return sum(1 for line in ptx.splitlines()
               if line.strip().endswith(";") and not line.strip().startswith((".", "//")))


def build(project: Path, store: Path, arch: str, *extra) -> dict:
    out = subprocess.run([sys.executable, "-m", "kbuild", "build", "--json", "--arch", arch,
                          "--store", str(store), *extra], cwd=project, capture_output=True,
                         text=True, check=True)
    rows = json.loads(out.stdout)["targets"]
    counts = {}
    for row in rows:
        name = row["artifacts"]["ptx"]
        ptx = (store / "v1" / "blobs" / name[:2] / name[2:4] / name).read_text()
        counts[(row["target"], row["signature"])] = (instructions(ptx), row["link"])
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=64)
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        project = gen_project.generate(tmp / "project", args.kernels, max(1, args.kernels // 8),
                                       16)
        apart = build(project, tmp / "apart", args.arch)
        whole = build(project, tmp / "whole", args.arch, "--whole-program")
    ratios = [apart[t][0] / whole[t][0] for t in whole]
    result = {
        "kernels": len(whole),
        "linked_lto": sum(link == "lto" for _, link in apart.values()),
        "instructions_lto": sum(n for n, _ in apart.values()),
        "instructions_whole_program": sum(n for n, _ in whole.values()),
        "fewer": sum(r < 1 for r in ratios), "equal": sum(r == 1 for r in ratios),
        "more": sum(r > 1 for r in ratios), "max_ratio": round(max(ratios), 4),
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
