"""Issue 33: one builder. `kbuild build`, `Project.load()`'s launcher and `kbuild.enable()`
reach the store's commit and the compiler only through the build service
(`kbuild.builder.service.BuildService`), counted in one process with the real compiler and
store under the fake device: each route builds its kernel once, and every compile and every
target commit happens inside a service call.

(tests/test_architecture.py keeps it so statically: only the service takes a builder's steps.)
"""

import json
import subprocess
import sys
import textwrap

from zeroconf_support import env_for

KERNELS = """\
from numba import cuda


@cuda.jit(device=True)
def twice(v):
    return v * 2.0


@cuda.jit
def scale(x, a):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = twice(x[i]) * a
"""

TOML = """\
[project]
name = "onebuilder"
paths = ["."]
arch = ["sm_80"]

[kernels."ob_kernels:scale"]
signatures = ["void(float32[::1], float32)"]
"""

PROGRAM = """\
import json
import sys

import numpy as np

from kbuild.backend.numbacuda import NumbaCuda
from kbuild.builder.service import BuildService
from kbuild.store.local import Store

depth = [0]
calls = []


def inside(name):
    real = getattr(BuildService, name)

    def wrapped(self, *args, **kwargs):
        depth[0] += 1
        try:
            return real(self, *args, **kwargs)
        finally:
            depth[0] -= 1
    setattr(BuildService, name, wrapped)


# `job` is where `compile_all`'s waves (a generator) run each compile or link.
for name in ("ensure", "produce", "compile", "job", "compile_fresh", "finish",
             "commit"):
    inside(name)


def noting(cls, name, what):
    real = getattr(cls, name)

    def wrapped(self, *args, **kwargs):
        if what(args):
            calls.append([name, depth[0] > 0])
        return real(self, *args, **kwargs)
    setattr(cls, name, wrapped)


noting(NumbaCuda, "compile", lambda args: True)
noting(Store, "commit", lambda args: "target" in args[1])  # a target's entry


report = {}
import kbuild
from kbuild import Project, testing
from kbuild.cli.entry import main

host = np.arange(64, dtype=np.float32)

calls.clear()
assert main(["build", "--store", "cli-store", "--json"]) == 0
report["kbuild build"] = list(calls)

calls.clear()
proj = Project.load("kbuild.toml", store="project-store", on_miss="build")
with testing.fake_device("sm_80", store="project-store") as device:
    proj.kernel("ob_kernels:scale")[2, 32](device.array(host), np.float32(2))
report["Project.load"] = list(calls)

calls.clear()
session = kbuild.enable(store="zeroconf-store", archs=["sm_80"])
import ob_kernels
with testing.fake_device("sm_80") as device:
    ob_kernels.scale[2, 32](device.array(host), np.float32(2))
report["enable"] = list(calls)
report["counts"] = dict(session.counts)
print("REPORT " + json.dumps(report))
"""


def test_every_route_compiles_and_commits_through_the_build_service(tmp_path):
    (tmp_path / "ob_kernels.py").write_text(KERNELS)
    (tmp_path / "kbuild.toml").write_text(TOML)
    (tmp_path / "program.py").write_text(textwrap.dedent(PROGRAM))
    done = subprocess.run([sys.executable, "program.py"], cwd=tmp_path, env=env_for(tmp_path),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("REPORT "))
    report = json.loads(line[len("REPORT "):])
    for route in ("kbuild build", "Project.load", "enable"):
        # one compile of the kernel and one commit of its entry, both inside the service
        assert report[route] == [["compile", True], ["commit", True]], (route, report)
    assert report["counts"]["built"] == 1 and report["counts"]["served"] == 1
