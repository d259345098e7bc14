"""numba-cuda-mlir, kbuild's second backend: chosen, keyed, built, launched (issue 23).

Builds run the real `kbuild` CLI with the real numba-cuda-mlir compiler (NVVM, nvJitLink)
on a machine with no GPU and no driver; launches go down to the driver boundary through
the fake device (`kbuild.testing.fake_device`), which checks every parameter against
the stored PTX's `.entry` and every array against numba-cuda-mlir's memref descriptor.

Tests that need the package are skipped with the reason where it is not installed; the
ones about choosing a backend and its absence run everywhere.
"""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import blob_bytes
from mlir_support import MLIR, UNSUPPORTED, needs_mlir, port_sources
from support import REPO_ROOT
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

# A project in two backends: `pn` numba-cuda, `pm` numba-cuda-mlir (unique names: several
# tests import them in this process).
KERNELS = '''import numpy as np
from numba_cuda_mlir import cuda
from numba_cuda_mlir.numba_cuda.np import numpy_support

from pm.dev import helper

POINT = np.dtype([("x", np.float32), ("y", np.float32)], align=True)
Point = numpy_support.from_dtype(POINT)


@cuda.jit
def saxpy(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = helper(a * x[i]) + y[i]


@cuda.jit
def grid2(m, c, t):
    i, j = cuda.grid(2)
    if i < m.shape[0] and j < m.shape[1]:
        m[i, j] = c.real * m[i, j] + c.imag + t[0] * t[1]


@cuda.jit
def norms(points, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = points[i].x * points[i].x + points[i].y * points[i].y


@cuda.jit
def zero_d(counter, flag):
    if flag:
        counter[()] = 1


@cuda.jit
def gsync(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i]
    g = cuda.cg.this_grid()
    g.sync()
    if i < x.size:
        out[i] = out[x.size - 1 - i]
'''
DEV = '''from numba_cuda_mlir import cuda


@cuda.jit(device=True)
def helper(x):
    return x + 1.0
'''
SAXPY = "void(float32, float32[::1], float32[::1], float32[::1])"
CONFIG = f'''[project]
name = "pm"
arch = ["sm_80", "sm_90"]
backend = "{MLIR}"

[kernels."pm.k:saxpy"]
signatures = ["{SAXPY}", "void(float64, float64[:], float64[:], float64[:])"]

[kernels."pm.k:grid2"]
signatures = ["void(float32[:, :], complex64, UniTuple(float32, 2))"]

[kernels."pm.k:norms"]
signatures = ["void(Point[::1], float32[::1])"]

[kernels."pm.k:zero_d"]
signatures = ["void(Array(int64, 0, 'C'), boolean)"]

[kernels."pm.k:gsync"]
signatures = ["void(float32[::1], float32[::1])"]
'''


def _write(root: Path, files: dict) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _project(root: Path, config: str = CONFIG) -> Path:
    return _write(root, {"kbuild.toml": config, "pm/__init__.py": "", "pm/k.py": KERNELS,
                         "pm/dev.py": DEV})


# Runs kbuild with numba-cuda-mlir made unimportable, installed or not.
WITHOUT_MLIR = ("-c", "import runpy, sys\nsys.modules['numba_cuda_mlir'] = None\n"
                      "runpy.run_module('kbuild', run_name='__main__', alter_sys=True)")


# -- choosing a backend, and its absence (no numba-cuda-mlir needed) -----------------------

def test_an_unknown_backend_is_a_config_error_with_a_did_you_mean(tmp_path, run_kbuild):
    project = _project(tmp_path / "p", CONFIG.replace(f'backend = "{MLIR}"',
                                                      'backend = "numba-cuda-mlr"'))
    result = run_kbuild("build", "--json", cwd=project, store=tmp_path / "store")
    assert result.returncode == 2
    assert result.json["kind"] == "ConfigError"
    assert "unknown backend 'numba-cuda-mlr'; did you mean 'numba-cuda-mlir'?" \
        in result.json["error"]


def test_asking_for_it_without_the_package_is_one_error_naming_the_extra(tmp_path, run_kbuild):
    project = _project(tmp_path / "p")
    result = run_kbuild("build", cwd=project, store=tmp_path / "store", launcher=WITHOUT_MLIR)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert "asks for backend 'numba-cuda-mlir', but its package (numba_cuda_mlir) is not " \
           'installed; install it with: pip install "kbuild[mlir]"' in errors[0]
    assert not (tmp_path / "store").exists()


def test_a_kernel_module_importing_it_without_the_package_fails_naming_the_extra(
        tmp_path, run_kbuild):
    """No backend named in kbuild.toml: the module's import fails its own targets, and the
    error says how to install the backend."""
    project = _project(tmp_path / "p", CONFIG.replace(f'backend = "{MLIR}"\n', ""))
    result = run_kbuild("build", "--json", "-k", cwd=project, store=tmp_path / "store",
                        launcher=WITHOUT_MLIR)
    assert result.returncode == 1
    errors = [r["error"] for r in result.json["targets"]]
    assert len(errors) == 12 and all(
        "importing 'pm.k' failed: ModuleNotFoundError" in e and "numba_cuda_mlir" in e
        and e.endswith("; backend 'numba-cuda-mlir' is installed with: "
                       'pip install "kbuild[mlir]"') for e in errors), errors


def test_init_finds_its_kernels_and_names_the_backend(tmp_path):
    from kbuild.scaffold import find_kernels, render

    _write(tmp_path, {"pm/__init__.py": "", "pm/k.py": KERNELS, "pm/dev.py": DEV})
    found = find_kernels(tmp_path)
    assert [(k.name, k.backend) for k in found] == [
        (f"pm.k:{name}", MLIR) for name in ("saxpy", "grid2", "norms", "zero_d", "gsync")]
    text = render("pm", ["sm_80"], found)
    assert f'backend = "{MLIR}"' in text.split("[kernels")[0] and text.count("backend") == 1
    # With numba-cuda kernels beside them, each numba-cuda-mlir kernel names its backend.
    _write(tmp_path, {"pn/__init__.py": "",
                      "pn/k.py": "from numba import cuda\n\n\n@cuda.jit('void(float32[::1])')\n"
                                 "def k(x):\n    x[0] = 1\n",
                      "pm/eager.py": "from numba_cuda_mlir.cuda import jit\n\n\n"
                                     "@jit('void(float32[::1])')\ndef e(x):\n    x[0] = 2\n"})
    mixed = render("mixed", ["sm_80"], find_kernels(tmp_path))
    assert "backend" not in mixed.split("[kernels")[0]
    assert '[kernels."pm.eager:e"]\nbackend = "numba-cuda-mlir"\nsignatures' in mixed
    assert '[kernels."pn.k:k"]\nsignatures' in mixed
    assert f'# [kernels."pm.k:saxpy"]\n# backend = "{MLIR}"' in mixed


# -- building ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The numba-cuda-mlir project built for sm_80 and sm_90: (project, store, JSON)."""
    if not __import__("mlir_support").INSTALLED:
        pytest.skip(__import__("mlir_support").NOT_INSTALLED)
    from support import run

    root = tmp_path_factory.mktemp("mlirproj")
    project = _project(root / "project")
    result = run("build", "--json", cwd=project, home=root / "home", store=root / "store")
    assert result.returncode == 0, result.stdout + result.stderr
    return project, root / "store", result.json


def _entries(store: Path) -> list:
    return [json.loads(p.read_text()) for p in sorted((store / "v1" / "entries").glob("??/*.json"))]


@needs_mlir
def test_every_target_builds_for_every_arch_without_a_driver(built):
    project, store, result = built
    rows = result["targets"]
    assert {r["status"] for r in rows} == {"built"} and len(rows) == 12
    assert {r["arch"] for r in rows} == {"sm_80", "sm_90"}
    # One program each (numba-cuda-mlir compiles device functions into their callers),
    # which is its way with every target: no per-row note.
    assert {(r["link"], r["note"]) for r in rows} == {("whole", None)}
    entries = _entries(store)
    assert {e["backend"] for e in entries} == {MLIR}
    assert {e["link"]["mode"] for e in entries} == {"whole"}
    # The grid-synchronising kernel is cooperative; the entry symbol is upstream's mangling.
    by_target = {(e["target"], e["arch"]): e for e in entries}
    assert by_target[("pm.k:gsync", "sm_90")]["cooperative"] is True
    assert by_target[("pm.k:saxpy", "sm_90")]["entry"].startswith("_Z5saxpy")


@needs_mlir
def test_the_key_names_the_backend_and_its_compilers(built):
    _, store, _ = built
    inputs = {" > ".join(path): text for path, text, _ in _entries(store)[0]["inputs"]}
    assert inputs["target > toolchain > backend"] == MLIR
    assert inputs[f"target > toolchain > {MLIR}"] == __import__("importlib.metadata").metadata \
        .version(MLIR)
    assert re.fullmatch(r"[0-9a-f]{32}", inputs[f"target > toolchain > {MLIR} libraries"])
    assert {"target > toolchain > nvvm", "target > toolchain > nvjitlink",
            "target > config > OPT", "target > config > LIBLLVM7"} <= set(inputs)
    assert not any("numba-cuda" == p.rpartition(" > ")[2] for p in inputs)
    # Options that only cache, dump or name the arch are not keyed (the arch is).
    options = {p.rpartition(" option ")[2] for p in inputs if " option " in p}
    assert {"fastmath", "max_registers", "lineinfo", "opt", "inline"} <= options
    assert not options & {"cache", "chip", "cc", "dump_ptx"}


@needs_mlir
def test_a_second_build_is_all_cached_and_status_up_to_date(built, run_kbuild, tmp_path):
    project, store, first = built
    copy = shutil.copytree(store, tmp_path / "store")
    again = run_kbuild("build", "--json", cwd=project, store=copy)
    assert again.returncode == 0
    assert {r["status"] for r in again.json["targets"]} == {"cached"}
    assert [r["key"] for r in again.json["targets"]] == [r["key"] for r in first["targets"]]
    status = run_kbuild("status", "--json", "--check", cwd=project, store=copy)
    assert status.returncode == 0
    assert {r["status"] for r in status.json["targets"]} == {"up-to-date"}


@needs_mlir
def test_a_kernel_of_one_backend_named_for_the_other_is_a_target_error(tmp_path, run_kbuild):
    """As for any declared target that is not what kbuild.toml says (a usage error)."""
    project = _project(tmp_path / "p", CONFIG.replace(
        '[kernels."pm.k:grid2"]', '[kernels."pm.k:grid2"]\nbackend = "numba-cuda"'))
    result = run_kbuild("build", "--json", "--arch", "sm_80", cwd=project,
                        store=tmp_path / "store")
    assert result.returncode == 2 and result.json["kind"] == "TargetError"
    assert result.json["error"] == (
        "target 'pm.k:grid2' in kbuild.toml is a numba-cuda-mlir kernel (MLIRDispatcher), but "
        "kbuild.toml names backend 'numba-cuda' for it; import cuda from the package of "
        "numba-cuda or set backend = 'numba-cuda-mlir'")


@needs_mlir
def test_one_project_builds_kernels_of_both_backends(tmp_path, run_kbuild):
    """The project names no backend: each kernel object says which compiles it."""
    project = _project(tmp_path / "p", textwrap.dedent(f'''\
        [project]
        name = "both"
        arch = ["sm_80"]

        [kernels."pm.k:saxpy"]
        signatures = ["{SAXPY}"]

        [kernels."pn.k:saxpy"]
        signatures = ["{SAXPY}"]
        '''))
    # The same kernel and device function, written for numba-cuda.
    saxpy = KERNELS[KERNELS.index("@cuda.jit\ndef saxpy"):KERNELS.index("@cuda.jit\ndef grid2")]
    _write(project, {"pn/__init__.py": "",
                     "pn/dev.py": DEV.replace("numba_cuda_mlir", "numba"),
                     "pn/k.py": f"from numba import cuda\n\nfrom pn.dev import helper\n\n\n{saxpy}"})
    result = run_kbuild("build", "--json", cwd=project, store=tmp_path / "store")
    assert result.returncode == 0, result.stdout + result.stderr
    entries = {e["target"]: e for e in _entries(tmp_path / "store") if "target" in e}
    assert entries["pm.k:saxpy"]["backend"] == MLIR
    assert entries["pn.k:saxpy"]["backend"] == "numba-cuda"
    assert entries["pn.k:saxpy"]["link"]["mode"] == "lto"  # numba-cuda's separate objects


# -- the same source under both backends, in one store -----------------------------------

@needs_mlir
def test_the_examples_build_under_both_backends_in_one_store(examples_template, tmp_path,
                                                             run_kbuild):
    """The examples, then the same files with the import changed (a migration), into one
    store: same target names, other keys; each backend's entries are its own, and what
    numba-cuda-mlir cannot compile fails alone, saying why."""
    template = examples_template()
    project, store = template.copy_to(tmp_path / "project", tmp_path / "store")
    numba_keys = {(r["target"], r["signature"], r["arch"]): r["key"]
                  for r in template.json["targets"]}
    port_sources(project / "examples")
    mlir = run_kbuild("build", "--json", "-k", cwd=project, store=store)
    assert mlir.returncode == 1
    rows = {(r["target"], r["signature"], r["arch"]): r for r in mlir.json["targets"]}
    failed = {t for (t, _, _), r in rows.items() if r["status"] == "failed"}
    assert failed == {name for name in UNSUPPORTED if name.startswith("examples.")}
    for (target, _, _), row in rows.items():
        if target in failed:
            assert row["error"].split(": ", 2)[1] == "CompilerBug" or \
                "numba-cuda-mlir cannot compile it" in row["error"], row["error"]
    built = {k: r["key"] for k, r in rows.items() if r["status"] == "built"}
    assert len(built) == 16
    assert not set(built.values()) & set(numba_keys.values())
    # Both backends' entries side by side; switching back is a full hit.
    backends = {e.get("backend") for e in _entries(store) if "target" in e}
    assert backends == {"numba-cuda", MLIR}
    shutil.rmtree(project / "examples")
    shutil.copytree(REPO_ROOT / "examples", project / "examples",
                    ignore=shutil.ignore_patterns("__pycache__"))
    back = run_kbuild("build", "--json", cwd=project, store=store)
    assert back.returncode == 0
    assert {r["status"] for r in back.json["targets"]} == {"cached"}
    port_sources(project / "examples")
    again = run_kbuild("status", "--json", cwd=project, store=store)
    assert {(r["target"], r["signature"], r["arch"]): r["status"]
            for r in again.json["targets"] if r["status"] == "up-to-date"}.keys() == built.keys()


@needs_mlir
def test_an_entry_of_one_backend_is_never_taken_for_the_others(built):
    """The lookup of a key states what its entry must be: a numba-cuda kernel's symbol
    prefix, or the numba-cuda-mlir backend. Each refuses the other's manifest."""
    from kbuild.backend import backends
    from kbuild.builder import expected
    from kbuild.discover import Target
    from kbuild.store.manifest import EntryProblem, parse_manifest

    _, store, _ = built
    entry = next(e for e in _entries(store) if e["target"] == "pm.k:saxpy")
    target = Target(entry["target"], entry["signature"], entry["arch"])

    class NumbaKernel:  # what numba-cuda's expectation reads of a kernel: its function
        py_func = saxpy = None

    def saxpy(a, x, y, out):
        pass

    saxpy.__module__, saxpy.__qualname__ = "pm.k", "saxpy"
    NumbaKernel.py_func = saxpy
    numba = expected(target, NumbaKernel(), backends.get("numba-cuda"))
    mlir = expected(target, object(), backends.get(MLIR))
    text = json.dumps(entry)
    assert parse_manifest(entry["key"], text, mlir)["backend"] == MLIR
    with pytest.raises(EntryProblem, match="is another kernel's"):
        parse_manifest(entry["key"], text, numba)
    without = json.dumps({k: v for k, v in entry.items() if k != "backend"})
    with pytest.raises(EntryProblem, match="it names backend 'None', not 'numba-cuda-mlir'"):
        parse_manifest(entry["key"], without, mlir)


# -- launching from the store (fake driver) -----------------------------------------------

@pytest.fixture
def launching(built, monkeypatch):
    """(project, kbuild.testing): the built project loaded in this process."""
    from kbuild import Project, testing

    project, store, _ = built
    monkeypatch.syspath_prepend(str(project))
    return Project.load(project / "kbuild.toml", store=store, on_miss="error"), testing


@needs_mlir
def test_launches_pack_numba_cuda_mlir_s_abi_checked_against_the_ptx(launching):
    proj, testing = launching
    x = np.arange(8, dtype=np.float32)
    y, out = np.ones(8, np.float32), np.zeros(8, np.float32)
    m = np.asfortranarray(np.ones((3, 4), np.float32))
    with testing.fake_device("sm_90", proj.store) as fake:
        proj.kernel("saxpy")[1, 8](np.float32(2), x, y, out)
        proj.kernel("saxpy")[2, 4](2.0, fake.array(np.arange(4.0)[::-1].copy()),
                                   fake.foreign_array(np.ones(4)),
                                   fake.dlpack_array(np.zeros(4)))
        proj.kernel("grid2")[(1, 1), (4, 4)](m, np.complex64(1 + 2j), (np.float32(1), np.float32(2)))
        import pm.k

        proj.kernel("norms")[1, 4](np.zeros(4, pm.k.POINT), out[:4])
        proj.kernel("zero_d")[1, 1](np.zeros((), np.int64), True)
        proj.kernel("gsync")[1, 8](x, out)
    launches = fake.launches
    assert [l.abi for l in launches] == [MLIR] * 6
    assert [l.kind for l in launches] == ["cubin"] * 6
    # saxpy: a float32, then three 1-d memrefs of 5 values (pointer, pointer, 0, size, stride).
    first = launches[0].args
    assert len(first) == 1 + 3 * 5 and first[1:6] == testing.memref_of(x)
    # grid2: a 2-d F-ordered memref (strides in elements: 1, 3), complex64 as one value,
    # the tuple flattened.
    grid = launches[2].args
    assert grid[:7] == (m.ctypes.data, m.ctypes.data, 0, 3, 4, 1, 3)
    assert isinstance(grid[7], np.complex64) and len(grid) == 10
    assert launches[4].args[:3] == (launches[4].args[0],) * 2 + (0,)  # a 0-d memref
    assert [l.cooperative for l in launches] == [False] * 5 + [True]
    assert fake.copies_back >= 3  # host arrays copied in and back, as numba-cuda does


@needs_mlir
def test_host_arrays_are_typed_as_numba_cuda_mlir_types_its_device_copy(launching):
    """Its dispatcher types the writable copy it makes of a host array, not the array: a
    read-only array launches a kernel declared for writable ones (as its own launch does),
    and an x[:, None] (numpy's 'C', a broadcast copy) picks the 'A' signature."""
    proj, testing = launching
    x = np.arange(8, dtype=np.float32)
    x.flags.writeable = False
    out = np.zeros(8, np.float32)
    with testing.fake_device("sm_90", proj.store) as fake:
        proj.kernel("saxpy")[1, 8](np.float32(2), x, x, out)
        assert proj.kernel("saxpy").signature_for((np.float32(2), x, x, out)) == SAXPY
        column = np.ones(3, np.float32)[:, None]
        assert proj.kernel("grid2").signature_for(
            (column, np.complex64(1), (np.float32(1), np.float32(2)))) == \
            "void(float32[:, :], complex64, UniTuple(float32, 2))"
    assert fake.launch_count == 1


@needs_mlir
def test_a_cai_array_numba_cuda_mlir_would_misread_as_contiguous_is_refused(launching):
    """numba-cuda-mlir's vendored typing compares byte strides with the dtype's width in
    bits, as numba-cuda's does: a float32 array strided by 32 bytes is 'C' to it, and its
    float32[::1] kernel would read x[0..7]; kbuild refuses that launch by name."""
    from kbuild.errors import LaunchError

    proj, testing = launching
    strided = np.zeros(64, np.float32)[::8]
    with testing.fake_device("sm_90", proj.store) as fake:
        args = [np.float32(2)] + [fake.foreign_array(a) for a in
                                  (strided, np.ones(8, np.float32), np.ones(8, np.float32))]
        with pytest.raises(LaunchError, match=r"argument 1 of 'pm.k:saxpy' is a "
                                              r"__cuda_array_interface__ array that "
                                              r"numba-cuda-mlir types as contiguous"):
            proj.kernel("saxpy")[1, 8](*args)
    assert fake.launch_count == 0


@needs_mlir
def test_the_fake_driver_refuses_numba_cuda_s_abi_for_its_kernels(launching):
    """The check that makes the test above mean something: numba-cuda's layout of the same
    arguments (7 values per array) does not fit the `.entry`."""
    from kbuild.backend import launcher
    from kbuild.launch import current_arch

    proj, testing = launching
    x = np.arange(8, dtype=np.float32)
    with testing.fake_device("sm_90", proj.store):
        kernel = proj.kernel("saxpy")
        ready = kernel.prepare(SAXPY, current_arch(("sm_80", "sm_90")))
        from numba.core import types

        numba_abi = launcher.StoredKernel(ready.kernel, (types.float32,) + (types.float32[::1],) * 3,
                                          False)
        args = (np.float32(2), x, x, x)
        with pytest.raises(AssertionError, match="parameters of"):
            numba_abi.bind(launcher.kinds_of(args))(args, (1, 8))


@needs_mlir
def test_a_device_newer_than_every_build_gets_the_ptx_of_the_highest_arch(built, monkeypatch):
    from kbuild import Project, testing

    project, store, _ = built
    monkeypatch.syspath_prepend(str(project))
    proj = Project.load(project / "kbuild.toml", store=store, on_miss="error")
    x = np.arange(8, dtype=np.float32)
    with testing.fake_device("sm_86", proj.store) as fake:
        proj.kernel("saxpy")[1, 8](np.float32(2), x, x, x)
        proj.kernel("gsync")[1, 8](x, x)  # cooperative: its PTX linked with cudadevrt first
    assert [(k.kind, k.ptx_target) for k in fake.loads] == [("ptx", "sm_80"), ("cubin", None)]


@needs_mlir
def test_install_hands_the_stored_cubin_to_its_own_dispatcher(launching, monkeypatch):
    """`install()`: the user's MLIRDispatcher finds the stored kernel as its compiled
    overload; what its C++ launcher asks (`_compile_impl`) is answered without a compile."""
    from numba_cuda_mlir import mlir_compiler

    proj, testing = launching
    compiles = []
    real = mlir_compiler.compile_mlir
    monkeypatch.setattr(mlir_compiler, "compile_mlir",
                        lambda *a, **k: compiles.append(1) or real(*a, **k))
    with testing.fake_device("sm_90", proj.store):
        installed = proj.install(["pm.k:saxpy"])
    import pm.k

    assert installed == [f"pm.k:saxpy {SAXPY}", "pm.k:saxpy void(float64, float64[:], "
                                                "float64[:], float64[:])"]
    x = np.arange(8, dtype=np.float32)
    cubin, entry, cooperative = pm.k.saxpy._compile_impl([np.float32(2), x, x, x])[:3]
    stored = next(e for e in _entries(proj.store.root) if e["target"] == "pm.k:saxpy"
                  and e["arch"] == "sm_90" and e["signature"] == SAXPY)
    assert entry == stored["entry"] and cooperative is False
    assert bytes(cubin) == proj.store.read_blob(stored["artifacts"]["cubin"])
    assert compiles == []


# -- the seed bug: numba-cuda-mlir's own cache=True after a callee's file is edited --------

SEED_CALLEE = '''from numba_cuda_mlir import cuda


@cuda.jit(device=True)
def f(x):
    return x + 1.0
'''
SEED_KERNEL = '''from numba_cuda_mlir import cuda

from b import f


@cuda.jit(cache=True)
def k(r, x):
    i = cuda.grid(1)
    if i < r.size:
        r[i] = f(x[i])
'''
# One launch's compile as numba-cuda-mlir's C++ launcher asks for it (`_compile_impl`,
# which consults its cache=True index first), on a machine without a driver (the same
# host-arch answer kbuild's backend gives); prints the PTX's float constants and whether
# the index answered.
SEED_LAUNCH = '''
import re, sys
import numpy as np
from kbuild.backend.mlir.nodriver import pinned_target
with pinned_target((9, 0)):
    import a
    a.k._compile_impl([np.zeros(4, np.float32), np.ones(4, np.float32)])
cres = next(iter(a.k.overloads.values()))
print("hits", sum(a.k._cache_hits.values()), "misses", sum(a.k._cache_misses.values()),
      "constants", re.findall(r"0f[0-9A-F]{8}", cres.ptx))
'''


@needs_mlir
def test_its_own_cache_serves_the_stale_kernel_after_the_callee_is_edited_kbuild_rebuilds(
        tmp_path, run_kbuild):
    project = _write(tmp_path / "p", {
        "a.py": SEED_KERNEL, "b.py": SEED_CALLEE,
        "kbuild.toml": f'[project]\nname = "seed"\narch = ["sm_90"]\nbackend = "{MLIR}"\n\n'
                       '[kernels."a:k"]\nsignatures = ["void(float32[::1], float32[::1])"]\n'})
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba-cache"), "PYTHONPATH": str(project)}

    def launch_compile():
        done = run_kbuild(cwd=project, env=env, launcher=("-c", SEED_LAUNCH))
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    def kbuild_ptx():
        result = run_kbuild("build", "--json", cwd=project, store=tmp_path / "store", env=env)
        assert result.returncode == 0, result.stderr
        row = result.json["targets"][0]
        blob = tmp_path / "store" / "v1" / "blobs"
        ptx = blob_bytes(next(blob.glob(f"??/??/{row['artifacts']['ptx']}"))).decode()
        return row["status"], re.findall(r"0f[0-9A-F]{8}", ptx)

    one, two = "0f3F800000", "0f40000000"  # 1.0 and 2.0
    first = launch_compile()
    assert first[:4] == ["hits", "0", "misses", "1"] and one in " ".join(first)
    assert kbuild_ptx() == ("built", [one])
    (project / "b.py").write_text(SEED_CALLEE.replace("x + 1.0", "x + 2.0"))
    stale = launch_compile()
    # numba-cuda-mlir's index is keyed by a.py's mtime and size, which did not change:
    # it serves the kernel compiled with the old callee.
    assert stale[:4] == ["hits", "1", "misses", "0"] and one in " ".join(stale) \
        and two not in " ".join(stale)
    assert kbuild_ptx() == ("built", [two])


# -- what makes its compiles build on any machine, and the same bytes in any process -------

NEVER_INLINED = '''from numba_cuda_mlir import cuda


@cuda.jit(device=True, inline="never")
def helper(x):
    return x * 2.0 + 1.0


@cuda.jit
def k(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = helper(x[i])
'''


@needs_mlir
def test_a_device_function_it_does_not_inline_has_the_same_bytes_in_every_process(
        tmp_path, run_kbuild):
    """Upstream names it after its dispatcher's address; kbuild builds the same PTX and cubin
    in processes of other hash seeds, its symbol numbered instead."""
    project = _write(tmp_path / "p", {
        "dn/__init__.py": "", "dn/k.py": NEVER_INLINED,
        "kbuild.toml": '[project]\nname = "det"\narch = ["sm_80"]\n\n'
                       '[kernels."dn.k:k"]\nsignatures = ["void(float32[::1])"]\n'})
    built = []
    for seed in ("1", "2"):
        result = run_kbuild("build", "--json", cwd=project, store=tmp_path / f"store{seed}",
                            env={"PYTHONHASHSEED": seed})
        assert result.returncode == 0, result.stderr
        built.append(result.json["targets"][0]["artifacts"])
    assert built[0] == built[1]
    ptx = blob_bytes(next((tmp_path / "store1" / "v1" / "blobs").glob(
        f"??/??/{built[0]['ptx']}"))).decode()
    assert re.search(r"\.func .*_Z8helper_1f\(", ptx)


@needs_mlir
def test_the_host_arch_workaround_applies_only_while_upstream_asks_the_driver(monkeypatch):
    from numba_cuda_mlir import tools

    from kbuild.backend.mlir import nodriver

    nodriver.upstream_asks_the_host.cache_clear()
    assert nodriver.upstream_asks_the_host() is True  # 0.6.0 asks even when the arch is given
    before = tools._cached_cc
    # The host taken for the arch being built: no driver asked, and the cubin linked for
    # that arch (a newer host would have it linked for the host's: upstream's other half).
    with nodriver.pinned_target((8, 0)):
        assert tools.resolve_gpu_target({"chip": "sm_80"})["linker_arch"] == "sm_80"
        assert tools._cached_cc == (8, 0)
    with nodriver.pinned_target((9, 0)):
        assert tools.resolve_gpu_target({"chip": "sm_80"})["linker_arch"] == "sm_90"
    assert tools._cached_cc == before

    def fixed(targetoptions=None):  # an upstream that resolves a given arch by itself
        chip = (targetoptions or {})["chip"]
        return {"chip": chip, "cc": tools.parse_compute_capability(chip)}

    monkeypatch.setattr(tools, "resolve_gpu_target", fixed)
    nodriver.upstream_asks_the_host.cache_clear()
    try:
        assert nodriver.upstream_asks_the_host() is False
        with nodriver.pinned_target((9, 0)):
            assert tools._cached_cc == before  # nothing pinned
    finally:
        monkeypatch.undo()
        nodriver.upstream_asks_the_host.cache_clear()


NAMED_BY_COUNTERS = '''import numpy as np
from numba_cuda_mlir import cuda

TABLE = np.array([1.0, 2.0, 3.0, 5.0], dtype=np.float32)
OTHER = np.array([7.0, 8.0, 9.0, 4.0], dtype=np.float32)


@cuda.jit(device=True, inline="never")
def picked(n):
    word = "omega" if n > 2 else "beta"
    return word == "omega"


@cuda.jit
def a(x, n):
    s = cuda.shared.array(32, np.float32)
    s[cuda.threadIdx.x] = x[0] + TABLE[n]
    cuda.syncthreads()
    word = "alpha" if n > 1 else "beta"
    x[0] = s[1] + (word == "alpha") + picked(n)


@cuda.jit
def b(x, n):
    s = cuda.shared.array(16, np.float32)
    s[cuda.threadIdx.x] = x[0] + OTHER[n]
    cuda.syncthreads()
    word = "gamma" if n > 1 else "delta"
    x[0] = s[1] + (word == "gamma") + picked(n)
'''


@needs_mlir
def test_a_kernel_has_the_same_bytes_whatever_the_process_compiled_before(
        tmp_path, monkeypatch):
    """Upstream names shared arrays, string and array constants from per-process counters;
    kbuild names them by content: `a` compiled after `b` is `a` compiled alone (with a
    callee's strings cloned into it, whose names meet the kernel's)."""
    from numba_cuda_mlir.numba_cuda import types

    from numba_cuda_mlir.lowering import cuda as lowering_cuda

    from kbuild.backend.mlir.compiler import compile_kernel

    upstream = lowering_cuda.cuda_static_shared_memory
    monkeypatch.syspath_prepend(str(_write(tmp_path, {"counted.py": NAMED_BY_COUNTERS})))
    import counted

    sig = (types.float32[::1], types.int64)
    ptx = [compile_kernel(k, sig, (8, 0)).ptx for k in (counted.a, counted.b, counted.a)]
    names = [sorted(set(re.findall(
        rb"(static_shared_memory|__numba_cuda_mlir_str|constant_array)_\d+", p))) for p in ptx]
    assert names[0] == names[2] == [b"__numba_cuda_mlir_str", b"constant_array",
                                    b"static_shared_memory"]
    assert ptx[0] == ptx[2]
    assert lowering_cuda.cuda_static_shared_memory is upstream  # put back after each compile


WATCHED_EXT = '''from numba_cuda_mlir.numba_cuda.extending import overload


def gain(x):
    pass


@overload(gain, target="cuda")
def _gain(x):
    def impl(x):
        return x * 2.0
    return impl
'''

WATCHED_KERNEL = '''from numba_cuda_mlir import cuda

from wp.ext import gain


@cuda.jit
def k1(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = gain(x[i])
'''


@needs_mlir
def test_watch_compiles_what_a_new_process_compiles_after_an_overload_is_saved(
        tmp_path, kbuild_process):
    """numba-cuda-mlir loads its registries at a process's first compile only: `kbuild
    watch` imports the project again after a save, and the kernel calling the overload
    that import registered failed to type ("Untyped global name 'gain'") in its second
    round, though a new process builds it. The round builds it, the bytes a new process
    builds."""
    import subprocess

    from support import kbuild_argv, kbuild_env

    project = _write(tmp_path / "proj", {
        "wp/__init__.py": "", "wp/ext.py": WATCHED_EXT, "wp/k.py": WATCHED_KERNEL,
        "kbuild.toml": f'[project]\nname = "wp"\npaths = ["."]\narch = ["sm_90"]\n'
                       f'backend = "{MLIR}"\n\n[kernels."wp.k:k1"]\n'
                       'signatures = ["void(float32[::1], float32[::1])"]\n'})
    store, home = tmp_path / "store", tmp_path / "home"
    proc = subprocess.Popen(kbuild_argv("watch", "--rounds", "2"), cwd=project,
                            env=kbuild_env(home, store=store), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("watching "):
                ext = project / "wp" / "ext.py"
                ext.write_text(ext.read_text().replace("x * 2.0", "x * 5.0"))
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    finally:
        proc.kill()
    summaries = [ln.split(" in ")[0] for ln in lines if " built, " in ln]
    assert summaries == ["1 built, 0 cached, 0 failed"] * 2, "\n".join(lines)
    again = kbuild_process("build", "--json", cwd=project, store=store)
    fresh = kbuild_process("build", "--json", cwd=project, store=tmp_path / "fresh")
    assert [r["status"] for r in again.json["targets"]] == ["cached"]
    assert again.json["targets"][0]["artifacts"] == fresh.json["targets"][0]["artifacts"]
