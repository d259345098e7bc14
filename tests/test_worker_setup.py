"""What forked compile workers work out again, counted (never timed).

`kbuild build -j2` forks its workers from the process that keyed the targets. What a
compile needs once per process and the parent can make before the fork - numba's typing
and lowering set-up, the modules a first compile imports, the index of the typing and
lowering registries and what each registration holds (`backend/registrations.py`) - is
made there once (`Backend.prepare`), and every worker inherits it. Before, each worker
indexed numba's registrations again (some 5,700 of them, about 0.2 CPU-s)
as soon as its compile met one of the project's `@overload`s, and the parent once more
after the workers, to record what they observed.

A launcher counts, in the build process and in every worker it forks (one line per event
appended to a file, by process id: a worker leaves with `os._exit`, no atexit runs),
the indexes built and the registrations worked out for one; for numba-cuda, and for
numba-cuda-mlir (its own registries, vendored: the same index) where it is installed.
"""

from __future__ import annotations

import collections
import textwrap
from pathlib import Path

import pytest

import mlir_support
from support import run

N_KERNELS = 4

EXT = '''\
from numba.cuda.extending import overload


def clamp01(x):
    pass


@overload(clamp01, target="cuda")
def ol_clamp01(x):
    def impl(x):
        return min(max(x, 0.0), 1.0)

    return impl
'''

KERNEL = '''
@cuda.jit
def k_{i}(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = clamp01(x[i] * {i}.5)
'''

COUNTER = r"""
import os, runpy, sys
log = os.environ["TEST_WORK_FILE"]

def _note(label):
    with open(log, "a") as fh:
        fh.write(f"{os.getpid()} {label}\n")

_note("parent")
import kbuild.backend.registrations as registrations
real_init, real_memo = registrations.Index.__init__, registrations._memo

def init(self):
    _note("index built")
    real_init(self)

def memo(item, compute):
    def counted():
        _note("registration worked out")
        return compute()
    return real_memo(item, counted)

registrations.Index.__init__ = init
registrations._memo = memo
runpy.run_module("kbuild", run_name="__main__", alter_sys=True)
"""


def _project(root: Path) -> Path:
    (root / "rx").mkdir(parents=True)
    (root / "rx" / "__init__.py").write_text("")
    (root / "rx" / "ext.py").write_text(EXT)
    kernels = "from numba import cuda\n\nfrom rx.ext import clamp01\n" + "".join(
        KERNEL.format(i=i) for i in range(N_KERNELS))
    (root / "rx" / "kernels.py").write_text(kernels)
    sig = 'signatures = ["void(float32[::1], float32[::1])"]'
    (root / "kbuild.toml").write_text(textwrap.dedent("""\
        [project]
        name = "rx"
        paths = ["."]
        arch = ["sm_80"]
        """) + "".join(f'\n[kernels."rx.kernels:k_{i}"]\n{sig}\n' for i in range(N_KERNELS)))
    return root


@pytest.mark.parametrize("backend", ["numba-cuda", pytest.param(
    mlir_support.MLIR, marks=mlir_support.needs_mlir)])
def test_workers_inherit_the_registrations_index(tmp_path, backend):
    project = _project(tmp_path / "proj")
    if backend == mlir_support.MLIR:
        mlir_support.port(project)
    log = tmp_path / "work.txt"
    done = run("build", "--json", "-j", "2", cwd=project, home=tmp_path / "home",
               store=tmp_path / "store", env={"TEST_WORK_FILE": str(log)},
               launcher=("-c", COUNTER))
    assert done.returncode == 0, done.stderr
    assert [t["status"] for t in done.json["targets"]] == ["built"] * N_KERNELS, done.stdout
    counts: dict = collections.defaultdict(collections.Counter)
    parent = None
    for line in log.read_text().splitlines():
        pid, label = line.split(" ", 1)
        if label == "parent":
            parent = pid
        counts[pid][label] += 1
    workers = [pid for pid in counts if pid != parent]
    assert len(workers) == 2, dict(counts)  # the compiles did run in two forked workers
    # The parent indexes numba's registrations (thousands) once, before the fork ...
    assert counts[parent]["index built"] == 1, dict(counts)
    assert counts[parent]["registration worked out"] > 1000, dict(counts)
    # ... and no worker works them out again: at most what its own compiles registered.
    for pid in workers:
        assert counts[pid]["registration worked out"] <= 20, dict(counts)
