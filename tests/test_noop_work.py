"""What a no-op costs, counted (never timed) on a generated project at two sizes.

`benchmarks/gen_project.py` writes a project of N kernels sharing device functions; each
size is cold-built once. A no-op `kbuild build` then runs under a launcher that counts,
in the process itself, the modules imported, the files opened, the encodings and
digests taken, the manifests parsed and the store files read, and writes them down at
exit. The bounds are stated per target added (the slope between the two sizes), so they
fail when a change makes a no-op's work grow with the project faster than it should:

- direct mode (the journal answers): numba is never imported, no manifest is parsed and
  nothing is keyed; modules imported, files opened and store files read (the journal
  and the store's marker) are the same at both sizes: a target's store files are only
  stat'ed;
- `--full` (every target keyed, every entry checked): per target added, one manifest
  parsed and four store files read (its entry, PTX, cubin and observation record: each
  once), at most `MAX_ENCODINGS_PER_TARGET` encodings and `MAX_DIGESTS_PER_TARGET`
  digests, and `MAX_OPENS_PER_TARGET` files opened (folders on the way included).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from support import REPO_ROOT, run, shared_home

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import gen_project  # noqa: E402

SMALL, LARGE = 4, 16
MAX_ENCODINGS_PER_TARGET = 40  # a target's own nodes: its kernel, signature, options, ...
MAX_DIGESTS_PER_TARGET = 60  # the encodings, and each of its store files verified once
MAX_OPENS_PER_TARGET = 40  # four store files, each opened through its folders, and a touch

COUNTER = r"""
import atexit, json, os, sys, collections
counts = collections.Counter()

def _hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes)):
        counts["files opened"] += 1

sys.addaudithook(_hook)

def _count(module_name, name, label):
    import importlib
    module = importlib.import_module(module_name)
    real = getattr(module, name)
    def counted(*args, **kwargs):
        counts[label] += 1
        return real(*args, **kwargs)
    setattr(module, name, counted)

import xxhash
_count("xxhash", "xxh3_128_hexdigest", "digests")
_count("kbuild.keying.encode", "encode", "encodings")
_count("kbuild.store.entries", "parse_manifest", "manifests parsed")
_count("kbuild.store.tree", "read_file", "store files read")

def _report():
    counts["modules imported"] = len(sys.modules)
    counts["numba imported"] = int("numba" in sys.modules)
    with open(os.environ["TEST_WORK_FILE"], "w") as fh:
        json.dump(counts, fh)

atexit.register(_report)
import runpy
runpy.run_module("kbuild", run_name="__main__", alter_sys=True)
"""


@pytest.fixture(scope="module")
def projects(tmp_path_factory):
    """{N: (project, store)}: a generated project of N kernels, cold-built."""
    made = {}
    for n in (SMALL, LARGE):
        where = tmp_path_factory.mktemp(f"work{n}")
        project = gen_project.generate(where / "project", n, gen_project.default_modules(n), 4)
        built = run("build", "--json", "-j", "2", "--store", where / "store", cwd=project,
                    home=shared_home(), bytecode=False)
        assert built.returncode == 0, built.stderr
        assert built.json["summary"]["built"] == n
        made[n] = (project, where / "store")
    return made


def work(project: Path, store: Path, *args) -> dict:
    """The counts of one no-op `kbuild build ARGS` (it must be one: every target cached)."""
    out = project.parent / "work.json"
    done = run("build", "--json", *args, "--store", store, cwd=project, home=shared_home(),
               env={"TEST_WORK_FILE": str(out)}, launcher=("-c", COUNTER), bytecode=False)
    assert done.returncode == 0, done.stderr
    assert done.json["summary"]["built"] == 0, done.json["summary"]
    counts = json.loads(out.read_text())
    counts["mode"] = done.json["mode"]["used"]
    counts["journal"] = done.json["mode"].get("journal")
    return counts


def test_a_direct_no_op_does_the_same_work_at_any_size(projects):
    counted = {}
    for n, (project, store) in projects.items():
        # The first no-ops may check racy files (changed just before the journal was
        # written) by their bytes and write the journal again: counted once it is settled.
        for _ in range(3):
            counted[n] = work(project, store)
            if counted[n]["journal"] is None:
                break
        assert counted[n]["journal"] is None, counted[n]
    small, large = counted[SMALL], counted[LARGE]
    for counts in (small, large):
        assert counts["mode"] == "direct"
        assert counts["numba imported"] == 0
        assert counts.get("manifests parsed", 0) == 0 and counts.get("encodings", 0) == 0
    for name in ("modules imported", "files opened", "store files read", "digests"):
        assert large.get(name, 0) == small.get(name, 0), (name, small, large)


def test_a_full_no_op_does_bounded_work_per_target(projects):
    small = work(*projects[SMALL], "--full")
    large = work(*projects[LARGE], "--full")
    added = LARGE - SMALL
    assert small["mode"] == large["mode"] == "full"

    def slope(name):
        return (large.get(name, 0) - small.get(name, 0)) / added

    assert slope("manifests parsed") <= 1, (small, large)
    assert slope("store files read") <= 4, (small, large)
    assert slope("files opened") <= MAX_OPENS_PER_TARGET, (small, large)
    assert slope("encodings") <= MAX_ENCODINGS_PER_TARGET, (small, large)
    assert slope("digests") <= MAX_DIGESTS_PER_TARGET, (small, large)
