"""Launch-config-sensitive kernels: one binary per launch configuration, never one served
for another, under `kbuild.enable()` and as declared targets (`launch = [...]`).

The extension below is what numba-cuda 0.30 lets a library do (block-wide cooperative
primitives need the block size): a rewrite that, while a launch compiles a kernel,
reads the launch configuration, bakes the block size into the code and calls
`dispatcher.mark_launch_config_sensitive()`.
"""

import json
import shutil

import pytest

from zeroconf_support import cubin_of, kbuild, run, write_program

EXTENSION = """\
from numba.cuda.core import ir
from numba.cuda import launchconfig
from numba.cuda.core.rewrites import Rewrite, register_rewrite, rewrite_registry

LOG = []

if not getattr(rewrite_registry, "_kbuild_test_lcs", False):
    @register_rewrite("after-inference")
    class BlockSizeRewrite(Rewrite):
        # `out[0] = 7.5` in block_kernel becomes `out[0] = <block size>`.
        def match(self, func_ir, block, typemap, calltypes):
            if func_ir.func_id.func_name != "block_kernel":
                return False
            self.block = block
            return any(isinstance(s, ir.Assign) and isinstance(s.value, ir.Const)
                       and s.value.value == 7.5 for s in block.body)

        def apply(self):
            cfg = launchconfig.ensure_current_launch_config()
            LOG.append(cfg.blockdim)
            for stmt in self.block.body:
                if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Const) \\
                        and stmt.value.value == 7.5:
                    stmt.value = ir.Const(float(cfg.blockdim[0]), stmt.value.loc)
            cfg.dispatcher.mark_launch_config_sensitive()
            return self.block

    rewrite_registry._kbuild_test_lcs = True
"""

KERNELS = """\
from numba import cuda

import block_ext  # noqa: F401 - registers the rewrite


@cuda.jit
def block_kernel(out):
    out[0] = 7.5


@cuda.jit
def plain(out):
    out[0] = 1.5


@cuda.jit
def marked(out):
    out[0] = 2.5
"""

APP = """\
import numpy as np
from numba.cuda import launchconfig

import app_kernels as K


def _marking(dispatcher):
    # The program marks the dispatcher before numba compiles (as numba-cuda's own test
    # of the mark does), not the compile while it runs.
    original = dispatcher._compile_for_args

    def compile_marked(*args, **kws):
        launchconfig.ensure_current_launch_config().dispatcher.mark_launch_config_sensitive()
        return original(*args, **kws)

    dispatcher._compile_for_args = compile_marked


_marking(K.marked)


def main(device_array, which):
    out = device_array(np.zeros(4, np.float32))
    for item in which:
        name, block = item.split("@")
        getattr(K, name)[1, int(block)](out)
        if name == "marked":
            (kernel,) = K.marked.overloads.values()
            assert kernel.launch_config_sensitive, "served as insensitive"
"""

SIG = "void(float32[::1])"


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return write_program(tmp_path_factory.mktemp("lcs") / "prog", KERNELS, APP,
                         block_ext=EXTENSION)


def _cubins(report):
    return [d for entry, kind, d in report["loads"] if "block_kernel" in entry]


def test_two_block_sizes_get_two_binaries(program, tmp_path):
    root = tmp_path / "prog"
    shutil.copytree(program, root)
    store = tmp_path / "store"
    which = ("block_kernel@32", "block_kernel@64", "block_kernel@32", "plain@32", "plain@64")
    first = run(root, "kbuild", which, enable={"store": str(store)})
    assert first["counts"] == {"built": 3, "served": 3}, first["stderr"]
    keys = {(name, k) for name, sig, arch, k in first["served"]}
    assert len([k for n, k in keys if n == "app_kernels:block_kernel"]) == 2
    assert len(set(_cubins(first))) == 2  # 32 and 64 baked in: two binaries

    # A fresh process takes each block size's own binary, compiling nothing; the order of
    # the launches does not matter.
    second = run(root, "kbuild", ("block_kernel@64", "block_kernel@32", "plain@128"),
                 enable={"store": str(store)})
    assert (second["nvvm"], second["counts"]) == (0, {"hits": 3, "served": 3})
    assert _cubins(second) == list(reversed(_cubins(first)))

    # The plain kernel is not launch-config sensitive: one binary for every launch.
    plain = [k for name, sig, arch, k in first["served"] + second["served"]
             if name == "app_kernels:plain"]
    assert len(set(plain)) == 1

    # Declared for the same launch configurations, `kbuild build` makes the same keys and
    # binaries (into an empty store).
    (root / "kbuild.toml").write_text(
        '[project]\nname = "lcs"\narch = ["sm_80"]\n\n'
        '[kernels."app_kernels:block_kernel"]\n'
        f'signatures = ["{SIG}"]\n'
        'launch = [{grid = 1, block = 32}, {grid = 1, block = [64]}]\n')
    aot = tmp_path / "aot"
    done = kbuild(root, "build", "--json", "--store", str(aot))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(done.stdout)["targets"]
    assert [r["launch"]["block"] for r in rows] == [[32, 1, 1], [64, 1, 1]]
    built = {r["key"]: r["artifacts"]["cubin"] for r in rows}
    served = {k: cubin_of(store, k) for name, sig, arch, k in first["served"]
              if name == "app_kernels:block_kernel"}
    assert built == served

    # The journal that build wrote answers a no-op for each launch configuration apart.
    again = kbuild(root, "build", "--json", "--store", str(aot))
    assert again.returncode == 0, again.stdout + again.stderr
    again = json.loads(again.stdout)
    assert again["mode"]["used"] == "direct", again["mode"]
    assert [(r["launch"], r["key"], r["status"]) for r in again["targets"]] == \
        [(r["launch"], r["key"], "cached") for r in rows]
    status = kbuild(root, "status", "--json", "--store", str(aot))
    status = json.loads(status.stdout)
    assert [(r["launch"], r["key"], r["status"]) for r in status["targets"]] == \
        [(r["launch"], r["key"], "up-to-date") for r in rows], status["mode"]


def test_a_dispatcher_marked_before_it_compiles_keys_its_kernel_by_the_launch(program,
                                                                             tmp_path):
    root = tmp_path / "prog"
    shutil.copytree(program, root)
    store = tmp_path / "store"
    first = run(root, "kbuild", ("marked@32",), enable={"store": str(store)})
    assert first["counts"] == {"built": 1, "served": 1}, first["stderr"]
    again = run(root, "kbuild", ("marked@32",), enable={"store": str(store)})
    assert (again["nvvm"], again["counts"]) == (0, {"hits": 1, "served": 1}), again["stderr"]
    other = run(root, "kbuild", ("marked@64",), enable={"store": str(store)})
    assert other["counts"] == {"built": 1, "served": 1}, other["stderr"]  # its own entry
    keys = [k for runs in (first, again, other) for name, sig, arch, k in runs["served"]]
    assert keys[0] == keys[1] != keys[2]


@pytest.mark.parametrize("launch, message", [
    ("[{grid = 1}]", "has no 'block'"),
    ("[{grid = 1, block = 0}]", "must be a positive integer"),
    ("[{grid = 1, block = [1, 2, 3, 4]}]", "list of 1 to 3"),
    ("[{grid = 1, block = 32, shared = -1}]", "shared must be a number of bytes"),
    ("[{grid = 1, block = 32, blocks = 2}]", "did you mean 'block'"),
    ("{grid = 1, block = 32}", "must be a non-empty list"),
])
def test_declared_launch_is_validated(tmp_path, launch, message):
    (tmp_path / "kbuild.toml").write_text(
        '[kernels."m:k"]\nsignatures = ["void(float32[::1])"]\n' f"launch = {launch}\n")
    done = kbuild(tmp_path, "keys")
    assert done.returncode == 2
    assert message in done.stderr and "launch" in done.stderr


def test_a_launch_target_that_cannot_be_imported_keeps_its_launch_in_status(tmp_path):
    """Each launch configuration's row stays its own when the module fails to import."""
    root = tmp_path / "prog"
    root.mkdir()
    (root / "broken_kernels.py").write_text("from numba import cuda\n\nraise ImportError('x')\n")
    (root / "kbuild.toml").write_text(
        '[project]\nname = "lcs"\narch = ["sm_80"]\n\n'
        '[kernels."broken_kernels:k"]\n'
        f'signatures = ["{SIG}"]\n'
        'launch = [{grid = 1, block = 32}, {grid = 1, block = 64}]\n')
    done = kbuild(root, "status", "--json", "--store", str(tmp_path / "store"))
    rows = json.loads(done.stdout)["targets"]
    assert [(r["status"], r["launch"]["block"]) for r in rows] == \
        [("failed", [32, 1, 1]), ("failed", [64, 1, 1])], rows
