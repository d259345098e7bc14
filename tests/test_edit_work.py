"""What a rebuild after an edit of a shared device function costs, counted (never timed).

`benchmarks/gen_project.py` writes a project of N kernels that all call `common`; each
size is cold-built, then `common` is edited and rebuilt three times. The last two rebuilds
run under a launcher that counts, in the build process itself (`-j 1`, no time limit:
every compile and link runs there), NVVM's compiles, nvJitLink's links (LTO to PTX, and
to the cubin numba would make: `lto.cubin_of`), the store's entry files and store files
read, the manifests parsed and the digests taken. The bounds:

- one NVVM compile per edit, at any size (common's new object; every other object is
  byte-identical and taken from the store), and one link of each kind per target;
- the entries and store files read, manifests parsed and digests taken grow by at most a
  stated number per target between the sizes;
- they do not grow with the store's history: the third rebuild, over a store holding one
  more build of every target, does exactly the second's work (before, telling what a
  relinked target was relinked for read every entry of the store).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from support import REPO_ROOT, run, shared_home

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import gen_project  # noqa: E402

SMALL, LARGE = 3, 9
# Measured: 9 entry reads per target (3 of its own key: before the build, under its lock,
# and the journal's check after it; its objects' look-ups; 2 early-cutoff records; its
# commit's; its last build's, for what changed), 21.7 store files (those entries, the
# objects' records and LTO-IR, its new blobs), 3 manifests parsed, 59.3 digests.
MAX_ENTRIES_READ_PER_TARGET = 9
MAX_STORE_FILES_READ_PER_TARGET = 22
MAX_MANIFESTS_PER_TARGET = 3
MAX_DIGESTS_PER_TARGET = 60

COUNTER = r"""
import atexit, collections, json, os, runpy, sys
counts = collections.Counter()

def _count(module_name, name, label, owner=None):
    import importlib
    module = importlib.import_module(module_name)
    where = getattr(module, owner) if owner else module
    real = getattr(where, name)
    def counted(*args, **kwargs):
        counts[label] += 1
        return real(*args, **kwargs)
    setattr(where, name, counted)

_count("xxhash", "xxh3_128_hexdigest", "digests")
_count("kbuild.store.entries", "parse_manifest", "manifests parsed")
_count("kbuild.store.tree", "read_file", "store files read")
_count("kbuild.store.entries", "_read_entry", "entries read", owner="EntryShelf")
_count("numba.cuda.cudadrv.nvvm", "compile_ir", "nvvm compiles")
_count("kbuild.backend.lto", "link_ptx", "links to ptx")
_count("kbuild.backend.lto", "cubin_of", "links to cubin")

def _report():
    with open(os.environ["TEST_WORK_FILE"], "w") as fh:
        json.dump(counts, fh)

atexit.register(_report)
runpy.run_module("kbuild", run_name="__main__", alter_sys=True)
"""


def _rebuild(project: Path, store: Path, variant: int, counted: bool) -> dict | None:
    gen_project.edit_common(project, variant)
    out = project.parent / f"work{variant}.json"
    done = run("build", "--json", "-j", "1", "--target-timeout", "0", "--store", store,
               cwd=project, home=shared_home(), env={"TEST_WORK_FILE": str(out)},
               launcher=("-c", COUNTER) if counted else ("-m", "kbuild"))
    assert done.returncode == 0, done.stderr
    targets = done.json["targets"]
    assert sorted(t["link"] for t in targets) == ["lto"] + ["relink"] * (len(targets) - 1)
    relinked = [t["changed"] for t in targets if t["link"] == "relink"]
    assert relinked == [["synth.devfns:common"]] * len(relinked), relinked
    return json.loads(out.read_text()) if counted else None


@pytest.fixture(scope="module")
def edits(tmp_path_factory):
    """{N: [counts of the second rebuild, of the third]} after edits of `common`."""
    made = {}
    for n in (SMALL, LARGE):
        where = tmp_path_factory.mktemp(f"edit{n}")
        project = gen_project.generate(where / "project", n, gen_project.default_modules(n), 4)
        store = where / "store"
        built = run("build", "--json", "-j", "2", "--store", store, cwd=project,
                    home=shared_home())
        assert built.returncode == 0, built.stderr
        _rebuild(project, store, 0, counted=False)
        made[n] = [_rebuild(project, store, variant, counted=True) for variant in (1, 2)]
    return made


def test_an_edit_compiles_one_object_and_links_each_target_once(edits):
    for n, runs in edits.items():
        for counts in runs:
            assert counts["nvvm compiles"] == 1, (n, counts)
            assert counts["links to ptx"] == counts["links to cubin"] == n, (n, counts)


def test_an_edit_reads_the_same_store_whatever_its_history(edits):
    """Before: 'entries read' rose by every entry the earlier rebuild had added."""
    for n, (second, third) in edits.items():
        for name in ("entries read", "store files read", "manifests parsed"):
            assert third.get(name, 0) == second.get(name, 0), (n, name, second, third)


def test_an_edit_does_bounded_work_per_target(edits):
    small, large = edits[SMALL][1], edits[LARGE][1]

    def slope(name):
        return (large.get(name, 0) - small.get(name, 0)) / (LARGE - SMALL)

    assert slope("entries read") <= MAX_ENTRIES_READ_PER_TARGET, (small, large)
    assert slope("store files read") <= MAX_STORE_FILES_READ_PER_TARGET, (small, large)
    assert slope("manifests parsed") <= MAX_MANIFESTS_PER_TARGET, (small, large)
    assert slope("digests") <= MAX_DIGESTS_PER_TARGET, (small, large)
