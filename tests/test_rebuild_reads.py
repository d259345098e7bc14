"""A rebuild's reads of the store: what many targets share is read and verified once."""

from __future__ import annotations

from support import run

SHARED = '''
from numba import cuda


@cuda.jit(device=True)
def edited(x):
    return x * 2.0


@cuda.jit(device=True)
def other(x):
    return x + 0.5
'''

CALLERS = "from numba import cuda\n\nfrom pkg.shared import edited, other\n" + "".join(f'''

@cuda.jit
def k{i}(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = edited(x[i]) + other(x[i]) * {i + 1}.0
''' for i in range(4))

COUNT_RECORD_READS = """
import collections, json, sys
from kbuild import Project
from kbuild.store.local import Store

reads = collections.Counter()
real = Store.read_blob
Store.read_blob = lambda self, name, *a, **k: reads.update([name]) or real(self, name, *a, **k)
project = Project.load(sys.argv[1], store=sys.argv[2])
rows = project.build(jobs=1)
records = {m["artifacts"]["observed"] for _, m in project.store.entries()
           if m.get("kind") == "object"}
print(json.dumps({"links": sorted(r.link for r in rows),
                  "most": max(reads[name] for name in records)}))
"""


def test_a_rebuild_reads_each_stored_objects_record_once_for_all_its_relinks(tmp_path,
                                                                            run_kbuild):
    """Four kernels share `other`; after `edited` changes, one compile makes edited's new
    object and three kernels relink with it and other's. The record of what each object's
    compile observed is read and verified once for every recipe that links it (and once when
    the compile commits beside it), not once per kernel."""
    import json

    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "shared.py").write_text(SHARED)
    (root / "pkg" / "kernels.py").write_text(CALLERS)
    (root / "kbuild.toml").write_text('[project]\nname = "reads"\narch = ["sm_80"]\n' + "".join(
        f'\n[kernels."pkg.kernels:k{i}"]\nsignatures = ["void(float32[::1], float32[::1])"]\n'
        for i in range(4)))
    store = tmp_path / "store"
    assert run_kbuild("build", cwd=root, store=store).returncode == 0
    shared = root / "pkg" / "shared.py"
    shared.write_text(SHARED.replace("x * 2.0", "x * 3.0"))

    done = run(root / "kbuild.toml", store, launcher=("-c", COUNT_RECORD_READS), cwd=root,
               home=tmp_path / "home")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["links"] == ["lto", "relink", "relink", "relink"]
    assert result["most"] <= 2, result
