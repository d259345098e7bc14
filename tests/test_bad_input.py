"""Bad projects and bad command lines: exit 2, a message naming the culprit, an untouched store.

Then compile failures: exit 1, the failed row carries numba's message, the rest is skipped
(or built with -k), and a fixed kernel rebuilds alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import entry_files, store_files
from support import run_kbuild_in_process  # noqa: F401 - its commands run in process
from kbuild.store.local import Store

GOOD_KERNEL = '''
@cuda.jit
def k(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] + 1
'''

MODULE = "from numba import cuda\n" + GOOD_KERNEL + '''

@cuda.jit(device=True)
def dev(v):
    return v + 1


def plain(x):
    x[0] = 1
'''

SIG = 'signatures = ["void(float32[::1])"]'
GOOD_TABLE = f'[kernels."pkg.mod:k"]\n{SIG}\n'

# id -> (kbuild.toml text, extra command-line arguments, [expected stderr fragments]).
# "{toml}" in a fragment stands for the absolute path of the project's kbuild.toml.
CASES = {
    "toml-syntax": (
        '[project]\nname = "bad"\narch = ["sm_80" "sm_90"]\n\n' + GOOD_TABLE, [],
        ["{toml}: invalid TOML", "line 3"]),
    "no-kernels": (
        '[project]\nname = "bad"\n', [],
        ["{toml}: missing [kernels] table"]),
    "kernels-empty": (
        "[kernels]\n", [],
        ["{toml}: [kernels] declares no kernel"]),
    "kernel-not-a-table": (
        '[kernels]\n"pkg.mod:k" = 3\n', [],
        ["{toml}: kernels.\"pkg.mod:k\" must be a table with 'signatures'"]),
    "no-colon-in-name": (
        f'[kernels."pkg.mod.k"]\n{SIG}\n', [],
        ["{toml}: target 'pkg.mod.k' must be written 'module:attr.path'"]),
    "no-signatures": (
        '[kernels."pkg.mod:k"]\narch = ["sm_80"]\n', [],
        ["{toml}: target 'pkg.mod:k' has no 'signatures'"]),
    "signatures-a-string": (
        '[kernels."pkg.mod:k"]\nsignatures = "void(float32[::1])"\n', [],
        ['{toml}: [kernels."pkg.mod:k"] signatures must be a list of strings, not a string']),
    "signatures-not-strings": (
        '[kernels."pkg.mod:k"]\nsignatures = ["void(float32[::1])", 1]\n', [],
        ['{toml}: [kernels."pkg.mod:k"] signatures must be a list of strings; '
         "item 2 is an integer"]),
    "signatures-empty": (
        '[kernels."pkg.mod:k"]\nsignatures = []\n', [],
        ["{toml}: target 'pkg.mod:k' has an empty 'signatures' list"]),
    "unknown-module": (
        f'[kernels."pkg.nope:k"]\n{SIG}\n', [],
        ["unknown target 'pkg.nope:k' in kbuild.toml: no module named 'pkg.nope'"]),
    "unknown-package": (
        f'[kernels."nopkg.mod:k"]\n{SIG}\n', [],
        ["unknown target 'nopkg.mod:k' in kbuild.toml: no module named 'nopkg'"]),
    "unknown-attribute": (
        f'[kernels."pkg.mod:k_nope"]\n{SIG}\n', [],
        ["unknown target 'pkg.mod:k_nope' in kbuild.toml: "
         "module 'pkg.mod' has no attribute 'k_nope'"]),
    "unknown-nested-attribute": (
        f'[kernels."pkg.mod:k.nope"]\n{SIG}\n', [],
        ["unknown target 'pkg.mod:k.nope' in kbuild.toml: "
         "object 'pkg.mod:k' has no attribute 'nope'"]),
    "plain-function": (
        f'[kernels."pkg.mod:plain"]\n{SIG}\n', [],
        ["target 'pkg.mod:plain' in kbuild.toml is a function, not a numba-cuda kernel"]),
    "device-function": (
        f'[kernels."pkg.mod:dev"]\n{SIG}\n', [],
        ["target 'pkg.mod:dev' in kbuild.toml is a device function (device=True)"]),
    "unknown-arch-in-project": (
        '[project]\narch = ["sm_80", "sm_81"]\n\n' + GOOD_TABLE, [],
        ["{toml}: [project] arch: unknown arch 'sm_81'"]),
    "unknown-arch-in-kernel": (
        GOOD_TABLE + 'arch = ["sm_81"]\n', [],
        ["{toml}: target 'pkg.mod:k' arch: unknown arch 'sm_81'"]),
    "malformed-arch": (
        GOOD_TABLE + 'arch = ["compute_80"]\n', [],
        ["{toml}: target 'pkg.mod:k' arch: unknown arch 'compute_80'"]),
    "unknown-arch-on-command-line": (
        GOOD_TABLE, ["--arch", "sm_80,sm_81"],
        ["--arch: unknown arch 'sm_81'"]),
    "unknown-target-on-command-line": (
        GOOD_TABLE, ["k_nope"],
        ["unknown target 'k_nope': kbuild.toml declares pkg.mod:k"]),
    "misspelt-target-on-command-line": (
        GOOD_TABLE, ["kk"],
        ["unknown target 'kk': kbuild.toml declares pkg.mod:k; did you mean 'k'?"]),
    "misspelt-full-target-name": (
        GOOD_TABLE, ["pkg.mdo:k"],
        ["unknown target 'pkg.mdo:k': kbuild.toml declares pkg.mod:k; "
         "did you mean 'pkg.mod:k'?"]),
    # Unknown tables and keys are typos, not silence (issue 16): a did-you-mean.
    "kernel-table-typo": (
        f'[kernel."pkg.mod:k"]\n{SIG}\n', [],
        ["{toml}: unknown table [kernel]; did you mean [kernels]?"]),
    "archs-in-project": (
        '[project]\narchs = ["sm_80"]\n\n' + GOOD_TABLE, [],
        ["{toml}: unknown key 'archs' in [project]; did you mean 'arch'?"]),
    "path-in-project": (
        '[project]\npath = ["."]\n\n' + GOOD_TABLE, [],
        ["{toml}: unknown key 'path' in [project]; did you mean 'paths'?"]),
    "signature-in-kernel": (
        '[kernels."pkg.mod:k"]\nsignature = ["void(float32[::1])"]\n', [],
        ["{toml}: unknown key 'signature' in [kernels.\"pkg.mod:k\"]; "
         "did you mean 'signatures'?"]),
    "unknown-store-key": (
        '[store]\nbananas = 1\n\n' + GOOD_TABLE, [],
        ["{toml}: unknown key 'bananas' in [store]; known: 'max_size', 'remote', "
         "'remote_timeout'"]),
}
# A module that raises at import fails its own targets (exit 1): test_cli_newcomer.py.


def write_project(root: Path, toml: str) -> Path:
    pkg = root / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(MODULE)
    (root / "kbuild.toml").write_text(toml)
    return root


@pytest.fixture
def seeded_store(tmp_path) -> Path:
    """A store holding one entry, so 'unchanged' is checked against real contents."""
    root = tmp_path / "store"
    store = Store(root)
    store.ensure_writable()
    blobs = {"ptx": store.put_blob(b".target sm_80\n"), "cubin": store.put_blob(b"\x7fELF")}
    store.commit("ab" * 16, {"target": "x:y", "artifacts": blobs, "entry": "y"})
    store.close()
    return root


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_exits_2_names_the_culprit_and_leaves_the_store_alone(
        tmp_path, seeded_store, run_kbuild, case):
    toml, extra, fragments = CASES[case]
    project = write_project(tmp_path / "project", toml)
    before = store_files(seeded_store)
    result = run_kbuild("build", *extra, cwd=project, store=seeded_store)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("kbuild: error: ")]
    for fragment in fragments:
        assert fragment.replace("{toml}", str(project / "kbuild.toml")) in line
    assert "Traceback" not in result.stderr
    assert store_files(seeded_store) == before


def test_no_project_file_is_a_usage_error(tmp_path, run_kbuild, store):
    result = run_kbuild("build", cwd=tmp_path, store=store)
    assert result.returncode == 2
    assert (f"no kbuild.toml (nor a pyproject.toml with [tool.kbuild]) in {tmp_path}"
            in result.stderr)
    missing = run_kbuild("build", "--config", tmp_path / "nope.toml", cwd=tmp_path, store=store)
    assert missing.returncode == 2
    assert f"config file {tmp_path / 'nope.toml'} does not exist" in missing.stderr
    assert not store.exists()


# -- compile failures -----------------------------------------------------------------

BROKEN = '''from numba import cuda


@cuda.jit
def bad(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] + "s"
'''

# k's compile types probe(), which runs this overload: the marker file proves k was compiled.
PROBED = '''import os

from numba import cuda
from numba.extending import overload

MARK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "k_was_compiled")


def probe(v):
    return v


@overload(probe)
def _probe_typing(v):
    open(MARK, "w").close()
    return lambda v: v


@cuda.jit
def k(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = probe(x[i]) + 1
'''

FAILING_PROJECT = f'''[project]
name = "failing"
arch = ["sm_80"]

[kernels."pkg.broken:bad"]
{SIG}

[kernels."pkg.probed:k"]
{SIG}

[kernels."pkg.mod:k"]
{SIG}
'''


@pytest.fixture
def failing_project(tmp_path) -> Path:
    root = write_project(tmp_path / "project", FAILING_PROJECT)
    (root / "pkg" / "broken.py").write_text(BROKEN)
    (root / "pkg" / "probed.py").write_text(PROBED)
    return root


def _by_target(result) -> dict:
    return {r["target"]: r for r in result.json["targets"]}


def test_a_kernel_that_fails_to_type_fails_alone_and_does_not_poison_the_store(
        failing_project, store, kbuild_process):
    run_kbuild = kbuild_process  # a file edited back to its size and mtime: a fresh process
    marker = failing_project / "pkg" / "k_was_compiled"
    others = ("pkg.probed:k", "pkg.mod:k")

    # Without -k: the failed row carries numba's message, the rest are skipped, not compiled.
    first = run_kbuild("build", "--json", "-j", "1", cwd=failing_project, store=store)
    assert first.returncode == 1, first.stderr
    rows = _by_target(first)
    bad = rows["pkg.broken:bad"]
    assert bad["status"] == "failed"
    assert bad["error"].startswith("TypingError: ")
    assert "No implementation of function Function(<built-in function add>)" in bad["error"]
    assert "\x1b[" not in bad["error"]  # numba's terminal highlighting is stripped
    assert bad["artifacts"] == {}
    for name in others:
        assert rows[name]["status"] == "skipped"
        assert "-k" in rows[name]["error"]
    summary = first.json["summary"]
    assert (summary["built"], summary["cached"], summary["failed"], summary["skipped"]) == \
        (0, 0, 1, 2)
    assert not marker.exists(), "a skipped target was compiled anyway"
    assert entry_files(store) == {}

    # Human output says the same and exits 1 too.
    human = run_kbuild("build", "-j", "1", cwd=failing_project, store=store)
    assert human.returncode == 1
    assert "failed   pkg.broken:bad void(float32[::1]) sm_80" in human.stdout
    assert "TypingError: No implementation of function" in human.stdout
    assert "0 built, 0 cached, 1 failed, 2 skipped" in human.stdout

    # With -k: the others are built.
    keep_going = run_kbuild("build", "--json", "-k", cwd=failing_project, store=store)
    assert keep_going.returncode == 1, keep_going.stderr
    rows = _by_target(keep_going)
    assert rows["pkg.broken:bad"]["status"] == "failed"
    assert [rows[name]["status"] for name in others] == ["built", "built"]
    assert marker.exists()
    assert set(entry_files(store)) == {rows[name]["key"] for name in others}

    # Fix the kernel with a same-size edit inside the same mtime second: a .pyc from the
    # failed builds would still pass Python's (mtime, size) check, so this also proves
    # the fixed source, not stale bytecode, is what gets compiled.
    broken = failing_project / "pkg" / "broken.py"
    stat = broken.stat()
    fixed = BROKEN.replace('x[i] + "s"', "x[i] + 1.0")
    assert len(fixed) == len(BROKEN)
    broken.write_text(fixed)
    os.utime(broken, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    marker.unlink()

    after = run_kbuild("build", "--json", cwd=failing_project, store=store)
    assert after.returncode == 0, after.stderr
    fixed_rows = _by_target(after)
    assert fixed_rows["pkg.broken:bad"]["status"] == "built"
    assert fixed_rows["pkg.broken:bad"]["key"] != bad["key"]
    for name in others:
        assert fixed_rows[name]["status"] == "cached"
        assert fixed_rows[name]["key"] == rows[name]["key"]
        assert fixed_rows[name]["artifacts"] == rows[name]["artifacts"]
    assert not marker.exists()
    assert after.json["warnings"] == []



LINKS_A_MISSING_FILE = '''import os

from numba import cuda

mul = cuda.declare_device("mul", "float32(float32, float32)")


@cuda.jit(link=[os.path.join(os.path.dirname(__file__), "gone.cu")])
def k(x):
    x[0] = mul(x[0], 2.0)
'''


def test_a_link_file_that_is_gone_fails_its_target_alone(tmp_path, store, run_kbuild):
    root = write_project(tmp_path / "project", '[project]\nname = "p"\narch = ["sm_80"]\n\n'
                         f'[kernels."pkg.links:k"]\n{SIG}\n\n' + GOOD_TABLE)
    (root / "pkg" / "links.py").write_text(LINKS_A_MISSING_FILE)
    done = run_kbuild("build", "--json", "-k", cwd=root, store=store)
    assert done.returncode == 1, done.stderr
    rows = _by_target(done)
    assert rows["pkg.mod:k"]["status"] == "built"
    assert rows["pkg.links:k"]["status"] == "failed" and rows["pkg.links:k"]["key"] is None
    assert rows["pkg.links:k"]["error"] == (
        f"pkg.links:k: link file {root / 'pkg' / 'gone.cu'} cannot be read (No such file or "
        "directory); restore it or fix the link= path")


READS_THROUGH_RAISING_CODE = {
    "lazy.py": '''def __getattr__(name):
    raise LookupError(name)  # a lazy loader that meant AttributeError
''',
    "readers.py": '''from numba import cuda

from pkg import lazy


@cuda.jit
def k_lazy(x):
    x[0] = lazy.GAIN
''',
}


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_read_that_runs_program_code_which_raises_fails_its_target_alone(
        tmp_path, store, run_kbuild, jobs):
    """What a kernel reads through a module's own `__getattr__` is the program's code
    running as kbuild keys it (and as numba compiles it); when it raises, that target
    fails saying what raised, the others build, and nothing is an internal error."""
    root = write_project(tmp_path / "project", '[project]\nname = "p"\narch = ["sm_80"]\n\n'
                         f'[kernels."pkg.readers:k_lazy"]\n{SIG}\n\n' + GOOD_TABLE)
    for name, text in READS_THROUGH_RAISING_CODE.items():
        (root / "pkg" / name).write_text(text)
    done = run_kbuild("build", "--json", "-k", "-j", jobs, cwd=root, store=store)
    assert done.returncode == 1, done.stderr
    rows = _by_target(done)
    assert rows["pkg.mod:k"]["status"] == "built"
    bad = rows["pkg.readers:k_lazy"]
    assert bad["status"] == "failed" and "internal error" not in bad["error"]
    assert "reading 'GAIN' of module pkg.lazy" in bad["error"], bad["error"]
    assert "LookupError: GAIN" in bad["error"]


def test_a_read_through_raising_code_of_a_module_beside_the_project_fails_its_target_alone(
        tmp_path, store, run_kbuild):
    """The same through a module that is not the project's (a package beside it on
    PYTHONPATH, followed by value): a clear error for that target, never internal."""
    root = write_project(tmp_path / "project", '[project]\nname = "p"\narch = ["sm_80"]\n\n'
                         f'[kernels."pkg.readers:k_lazy"]\n{SIG}\n\n' + GOOD_TABLE)
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    (vendor / "lazyvendor.py").write_text(READS_THROUGH_RAISING_CODE["lazy.py"])
    (root / "pkg" / "readers.py").write_text(
        READS_THROUGH_RAISING_CODE["readers.py"].replace("from pkg import lazy",
                                                         "import lazyvendor as lazy"))
    done = run_kbuild("build", "--json", "-k", cwd=root, store=store,
                      env={"PYTHONPATH": str(vendor)})
    assert done.returncode == 1, done.stderr
    rows = _by_target(done)
    assert rows["pkg.mod:k"]["status"] == "built"
    bad = rows["pkg.readers:k_lazy"]
    assert bad["status"] == "failed" and "internal error" not in bad["error"], bad["error"]
    assert "reading 'GAIN' of module lazyvendor" in bad["error"], bad["error"]


LINKS_CUDA_C_WITHOUT_LTO = '''import os

from numba import cuda

mul = cuda.declare_device("mul", "float32(float32, float32)")


def body(x):
    x[0] = mul(x[0], 2.0)


# The function-first form: numba-cuda's decorator factory drops `lto`.
k = cuda.jit(body, link=[os.path.join(os.path.dirname(__file__), "mul.cu")], lto=False)
'''


def test_cuda_c_linked_with_lto_off_says_it_needs_the_driver_and_is_not_recorded(
        tmp_path, store, run_kbuild):
    """numba-cuda compiles CUDA C for a kernel with lto=False to PTX for the driver's
    version: on a machine without the driver the row says so and what to do, and the
    failure is not recorded under the key (a machine with the driver builds it)."""
    import ctypes.util

    if ctypes.util.find_library("cuda"):
        pytest.skip("the NVIDIA driver is installed here: numba-cuda compiles it")
    root = write_project(tmp_path / "project", '[project]\nname = "p"\narch = ["sm_80"]\n\n'
                         f'[kernels."pkg.links:k"]\n{SIG}\n\n' + GOOD_TABLE)
    (root / "pkg" / "links.py").write_text(LINKS_CUDA_C_WITHOUT_LTO)
    (root / "pkg" / "mul.cu").write_text(
        'extern "C" __device__ int mul(float* out, float a, float b) { *out = a * b; '
        'return 0; }\n')
    for _ in range(2):  # the second is compiled again, not answered from a record
        done = run_kbuild("build", "--json", "-k", cwd=root, store=store)
        assert done.returncode == 1, done.stderr
        rows = _by_target(done)
        assert rows["pkg.mod:k"]["status"] in ("built", "cached")
        error = rows["pkg.links:k"]["error"]
        assert rows["pkg.links:k"]["status"] == "failed"
        assert "NeedsDriver: this compile needs the NVIDIA driver" in error, error
        assert "leave the kernel's lto on" in error and "failed earlier" not in error, error
