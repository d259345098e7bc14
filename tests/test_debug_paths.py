"""Debug binaries name the files of the checkout that loads them, and stores stay shared.

A `lineinfo=True` or `debug=True` kernel's PTX and cubin name its source files (and
numba's own, compiled into it). kbuild writes them against placeholders (the project's
import roots, the toolchain's folder; `backend/debugpaths.py`), so the bytes and the key
are the same in every checkout, and puts the loading checkout's folders back at load, in
place. Two checkouts of one project share one store: the second builds nothing, and each
loads a binary whose paths are its own files (what a debugger and compute-sanitizer show).
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path

import pytest

from conftest import blob_bytes
from editmatrix_support import build
from support import run

# A placeholder left in a located path (not any folder named kbuild-*: CI's virtual
# environment is /tmp/kbuild-ci-venv).
PLACEHOLDER = re.compile(r"/kbuild-(root-\d+|toolchain)/\./")

FILES = {
    "kbuild.toml": """\
        [project]
        name = "dbg"
        paths = ["src"]
        arch = ["sm_80"]

        [kernels."dbgk.kernels:k_lines"]
        signatures = ["void(float32[::1], int64)"]

        [kernels."dbgk.kernels:k_debug"]
        signatures = ["void(float32[::1])"]

        [kernels."dbgk.kernels:k_plain"]
        signatures = ["void(float32[::1])"]
        """,
    "src/dbgk/__init__.py": "",
    "src/dbgk/helpers.py": """\
        from numba import cuda


        @cuda.jit(device=True, lineinfo=True)
        def twice(x):
            return x * 2.0
        """,
    "src/dbgk/kernels.py": """\
        from numba import cuda

        from dbgk.helpers import twice


        @cuda.jit(lineinfo=True)
        def k_lines(x, n):
            i = cuda.grid(1)
            if i < x.size:
                x[i] = twice(x[i]) ** n  # numba's int_power is compiled in: its file too


        @cuda.jit(device=True, debug=True, opt=False)
        def bump(x):
            return x + 1.0


        @cuda.jit(debug=True, opt=False)
        def k_debug(x):  # a debug compile's PTX: one module per function, joined
            x[0] = bump(x[0])


        @cuda.jit
        def k_plain(x):
            x[0] = x[0] + 1.0
        """,
}

# In a checkout's process: load each kernel for an sm_80 device (the cubin) and an sm_86
# one (the sm_80 PTX, JIT-compiled by the driver) through the fake driver, and print what
# each binary handed to the driver names as source files.
LOAD = """
import hashlib, json, re, sys
from kbuild import Project, testing

SIGS = {"k_lines": "void(float32[::1], int64)", "k_debug": "void(float32[::1])",
        "k_plain": "void(float32[::1])"}
proj = Project.load(sys.argv[1], store=sys.argv[2], on_miss="error")
out = {}
for cc, arch in (((8, 0), "sm_80"), ((8, 6), "sm_86")):
    with testing.fake_device(arch, proj.store) as fake:
        binaries = {}
        for name in ("k_lines", "k_plain"):
            proj.kernel(name).prepare(SIGS[name], arch)
            binaries[name] = fake.loads[-1].binary
        # A debug kernel launches through numba's own kernel object, from the same bytes.
        binaries["k_debug"] = proj.kernel("k_debug").artifact(SIGS["k_debug"], arch).binary
    for name, data in binaries.items():
        if data[:4] == b"\\x7fELF":  # a cubin's line table: its folders and file names
            paths = re.findall(rb"/[\\x21-\\x7e]+(?=\\x00)", data)
        else:
            paths = re.findall(rb'\\.file\\s+\\d+\\s+"([^"]+)"', data)
        out[f"{name} {arch}"] = {"paths": [p.decode() for p in paths],
                                 "digest": hashlib.sha256(data).hexdigest()}
print(json.dumps(out))
"""


def _write(root: Path) -> Path:
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def _loaded(project: Path, store: Path) -> dict:
    done = run(project / "kbuild.toml", store, cwd=project, home=project.parent / "home",
               launcher=("-c", LOAD))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _blobs(store: Path) -> list:
    return [blob_bytes(p) for p in (store / "v1" / "blobs").rglob("*") if p.is_file()]


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory):
    """Two checkouts of one project and the one store they share, built by the first."""
    where = tmp_path_factory.mktemp("debug-paths")
    first, second = _write(where / "first" / "dbg"), _write(where / "second" / "dbg-copy")
    store = where / "store"
    built = build(first, store)
    assert {r["status"] for r in built["targets"]} == {"built"}
    return first, second, store, built


def test_a_second_checkout_shares_every_binary(checkouts):
    first, second, store, built = checkouts
    again = build(second, store)
    assert {r["status"] for r in again["targets"]} == {"cached"}
    assert [(r["key"], r["artifacts"]) for r in again["targets"]] == \
        [(r["key"], r["artifacts"]) for r in built["targets"]]
    for blob in _blobs(store):  # the store names no checkout, and no toolchain folder
        assert str(first).encode() not in blob and str(second).encode() not in blob
        assert b"site-packages" not in blob


@pytest.mark.parametrize("arch", ["sm_80", "sm_86"])
def test_each_checkout_loads_binaries_naming_its_own_files(checkouts, arch):
    """sm_80: the stored cubin, sm_86: the stored sm_80 PTX the driver compiles."""
    first, second, store, _ = checkouts
    loaded = {p: _loaded(p, store) for p in (first, second)}
    for project, other in ((first, second), (second, first)):
        for kernel in ("k_lines", "k_debug"):
            paths = loaded[project][f"{kernel} {arch}"]["paths"]
            mine = [os.path.normpath(p) for p in paths
                    if os.path.normpath(p).startswith(str(project) + os.sep)]
            assert mine, f"{kernel} loaded in {project} names {paths}"
            assert not any(str(other) in p or PLACEHOLDER.search(p) for p in paths), paths
            for path in mine:  # what the debugger opens: this checkout's files and folders
                assert os.path.isfile(path) if path.endswith(".py") else os.path.isdir(path)
                assert Path(path).is_relative_to(project / "src")
            if arch == "sm_86":  # PTX names whole paths: the device function's file too
                assert str(project / "src" / "dbgk" / "helpers.py") in mine or kernel != "k_lines"
                assert str(project / "src" / "dbgk" / "kernels.py") in mine
    # A kernel without debug information loads the same bytes in both checkouts.
    assert loaded[first][f"k_plain {arch}"]["digest"] == \
        loaded[second][f"k_plain {arch}"]["digest"]


def test_a_folder_longer_than_the_placeholder_keeps_it():
    from kbuild.backend.debugpaths import SLOT, path_map

    short, long = path_map(["/a/proj"]), path_map(["/" + "x" * SLOT])
    written = short.written("/a/proj/pkg/mod.py").encode()
    assert len(short.located(written)) == len(written)
    assert os.path.normpath(short.located(written).decode()) == "/a/proj/pkg/mod.py"
    assert b"/kbuild-root-0" in long.located(long.written("/" + "x" * SLOT + "/m.py").encode())
    assert short.written("/elsewhere/m.py") == "/elsewhere/m.py"
    assert re.fullmatch(r"/kbuild-root-0(/\.)+/pkg/mod\.py", written.decode())


# On a real device (`pytest --gpu`): the located cubin (sm_90 here, the device's own arch
# elsewhere: PTX JIT-compiled) loads and computes, and nvdisasm reads its line table.
ON_DEVICE = """
import json, shutil, subprocess, sys, tempfile
import numpy as np
from numba import cuda
from kbuild import Project
from kbuild.backend.cubin import cuda_tool

proj = Project.load(sys.argv[1], store=sys.argv[2], on_miss="error")
cc = cuda.get_current_device().compute_capability
arch = f"sm_{cc[0]}{cc[1]}"
x = cuda.to_device(np.arange(1, 5, dtype=np.float32))
proj.kernel("k_lines")[1, 4](x, 2)
y = cuda.to_device(np.zeros(1, dtype=np.float32))
proj.kernel("k_debug")[1, 1](y)
found = proj.kernel("k_lines").artifact("void(float32[::1], int64)", "sm_80")
files = []
tool = cuda_tool("nvdisasm")
if found.kind == "cubin" and tool:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
        fh.write(found.binary)
    text = subprocess.run([tool, "--print-line-info", fh.name], capture_output=True,
                          text=True, check=True).stdout
    files = sorted(set(l.split('"')[1] for l in text.splitlines() if 'File "' in l))
print(json.dumps({"x": x.copy_to_host().tolist(), "y": y.copy_to_host().tolist(),
                  "kind": found.kind, "files": files}))
"""


@pytest.mark.gpu
def test_located_binaries_load_and_run_on_a_device(checkouts, tmp_path):
    first, second, store, _ = checkouts
    for project, other in ((second, first), (first, second)):
        done = run(project / "kbuild.toml", store, cwd=project, home=tmp_path / "home",
                   launcher=("-c", ON_DEVICE))
        assert done.returncode == 0, done.stdout + done.stderr
        found = json.loads(done.stdout.strip().splitlines()[-1])
        assert found["x"] == [4.0, 16.0, 36.0, 64.0] and found["y"] == [1.0]
        for path in found["files"]:  # what nvdisasm (and so a debugger) reads back
            assert str(other) not in path and not PLACEHOLDER.search(path)
        assert any(os.path.normpath(p).startswith(str(project)) for p in found["files"]) \
            or not found["files"]


# Under `kbuild.enable()`: a lineinfo kernel served from the store is loaded naming this
# program's files, both when it was just built and from a later process.
SERVED = '''
import json, os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "src"))
import numpy as np
import kbuild
from kbuild import testing

with testing.fake_device("sm_80", record=False) as fake:
    session = kbuild.enable(store=sys.argv[1], archs=["sm_80"])
    import lined
    lined.k_lined[1, 4](fake.array(np.arange(4, dtype=np.float32)))
print(json.dumps({"counts": dict(session.counts), "blobs": [l.binary.hex() for l in fake.loads]}))
'''

LINED = '''from numba import cuda


@cuda.jit(lineinfo=True)
def k_lined(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] * 2.0
'''


def test_a_served_lineinfo_kernel_names_the_programs_own_files(tmp_path):
    store = tmp_path / "store"
    for n, name in enumerate(("first", "second")):
        program = tmp_path / name
        (program / "src").mkdir(parents=True)
        (program / "src" / "lined.py").write_text(LINED)
        (program / "kbuild.toml").write_text(
            f'[project]\nname = "lined"\npaths = ["src"]\narch = ["sm_80"]\n')
        done = run(str(store), cwd=program, home=tmp_path / "home", launcher=("-c", SERVED))
        assert done.returncode == 0, done.stdout + done.stderr
        found = json.loads(done.stdout.strip().splitlines()[-1])
        assert found["counts"] == ({"built": 1, "served": 1} if n == 0
                                   else {"hits": 1, "served": 1}), found["counts"]
        binary = bytes.fromhex(found["blobs"][-1])
        assert str(program / "src").encode() in binary  # this program's folder, padded
        assert not PLACEHOLDER.search(binary.decode("latin-1"))
        other = tmp_path / ("second" if name == "first" else "first")
        assert str(other).encode() not in binary
