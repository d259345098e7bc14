"""`kbuild.testing`: a user's own launch path, ABI-checked, with no GPU (public API only).

A project's kernel is built with the real compiler into a store and launched through
`Project.load()`; `testing.fake_device` stands in for the GPU, checks the parameters against
the stored PTX's `.entry` and records the launch.
"""

import numpy as np
import pytest

KERNELS = """\
from numba import cuda


@cuda.jit("void(float32[::1], float32)")
def scale(x, a):
    i = cuda.grid(1)
    if i < x.size:
        x[i] *= a
"""

TOML = """\
[project]
name = "fakedevice"
paths = ["."]
arch = ["sm_80"]

[kernels."fakedevice_kernels:scale"]
signatures = ["void(float32[::1], float32)"]
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("fakedevice")
    (root / "fakedevice_kernels.py").write_text(KERNELS)
    (root / "kbuild.toml").write_text(TOML)
    return root


def test_a_launch_is_checked_against_the_kernels_abi_and_recorded(project):
    from kbuild import Project, testing

    proj = Project.load(project / "kbuild.toml", store=project / "store", on_miss="build")
    host = np.arange(64, dtype=np.float32)
    # The store is empty when the block starts: the first launch builds the kernel, and
    # the fake device reads its ABI then.
    with testing.fake_device("sm_80", store=project / "store") as device:
        x = device.array(host)
        proj.kernel("fakedevice_kernels:scale")[2, 32](x, 2.0)
        proj.kernel("fakedevice_kernels:scale")[(1, 2), 64, 0, 128](x, np.float32(3))
    first, second = device.launches
    assert first.kind == "cubin" and first.entry == second.entry
    assert "scale" in first.entry and device.loaded == [first.entry]
    assert (first.grid, first.block, first.shared_memory) == ((2, 1, 1), (32, 1, 1), 0)
    assert (second.grid, second.block, second.shared_memory) == ((1, 2, 1), (64, 1, 1), 128)
    assert first.stream == 0 and not first.cooperative
    # numba's ABI for a 1-d array (meminfo, parent, nitems, itemsize, data, shape, stride),
    # then the float32: exactly the sizes the PTX `.entry` declares, or the launch fails
    assert first.args[:7] == (0, 0, 64, 4, host.ctypes.data, 64, 4)
    assert [float(getattr(v.args[7], "value", v.args[7])) for v in (first, second)] == [2, 3]


def test_a_kernel_the_fake_device_knows_no_abi_of_is_refused(project):
    from kbuild import Project, testing

    proj = Project.load(project / "kbuild.toml", store=project / "store", on_miss="build")
    with testing.fake_device("sm_80") as device, pytest.raises(AssertionError) as info:
        x = device.array(np.ones(32, np.float32))
        proj.kernel("fakedevice_kernels:scale")[1, 32](x, 1.0)
    assert "no stored PTX declares .entry" in str(info.value)
    assert "pass store=" in str(info.value)
    assert device.launches == []


def test_an_architecture_that_is_none_is_named():
    from kbuild import testing
    from kbuild.errors import ConfigError

    with pytest.raises(ConfigError) as info, testing.fake_device("ampere"):
        pass
    assert str(info.value) == ("fake_device: 'ampere' is not an architecture; name one as "
                               "kbuild.toml does, e.g. 'sm_80'")


def test_loads_say_how_each_kernel_came_and_hand_back_its_code(project):
    from kbuild import Project, testing

    proj = Project.load(project / "kbuild.toml", store=project / "store", on_miss="build")
    with testing.fake_device("sm_80", store=project / "store") as device:
        x = testing.device_array(np.ones(32, np.float32))
        proj.kernel("fakedevice_kernels:scale")[1, 32](x, 1.0)
    (loaded,) = device.loads
    assert (loaded.entry, loaded.kind, loaded.ptx_target) == (device.loaded[0], "cubin", None)
    assert loaded.binary[:4] == b"\x7fELF" and loaded.entry.encode() in loaded.binary
    assert device.launches[0].abi == "numba-cuda" and device.launch_count == 1


def test_unrecorded_launches_are_only_counted_and_need_no_stored_abi(project):
    """record=False: a kernel no store holds (the test above refuses it) launches and is
    counted; the JIT's compile inside the block is for the device's arch."""
    from numba import cuda

    from kbuild import testing

    with testing.fake_device("sm_86", record=False) as device:
        @cuda.jit
        def fill(x):
            x[cuda.grid(1)] = 1.0

        fill[1, 8](device.array(np.zeros(8, np.float32)))
        fill[1, 8](device.array(np.zeros(8, np.float32)))
        ptx = fill.inspect_asm(next(iter(fill.overloads)))
    assert device.launch_count == 2 and device.launches == []
    assert [(loaded.kind, loaded.binary[:4]) for loaded in device.loads] == [("cubin", b"\x7fELF")]
    assert ".target sm_86" in ptx.splitlines()


def test_a_compiler_that_is_none_is_named():
    from kbuild import testing
    from kbuild.errors import ConfigError

    with pytest.raises(ConfigError) as info, testing.fake_device("sm_80", compilers=("nvcc",)):
        pass
    assert str(info.value) == ("fake_device: no compiler named 'nvcc'; name one of "
                               "numba-cuda, numba-cuda-mlir")


CACHED = """\
from numba import cuda


@cuda.jit(cache=True)
def fill(x):
    x[cuda.grid(1)] = 2.0


@cuda.jit("void(float32[::1])")
def eager(x):
    x[cuda.grid(1)] = 3.0
"""


def test_kernels_are_loaded_where_a_gpu_binds_them_so_numbas_own_cache_saves(tmp_path,
                                                                             monkeypatch):
    """numba binds (loads) an eager kernel right after compiling it at import, and a
    `cache=True` kernel before saving it: the fake device loads both, so the user's own
    cache=True path runs on a CPU-only runner and writes numba's cache files."""
    from kbuild import testing

    (tmp_path / "cached_kernels.py").write_text(CACHED)
    monkeypatch.syspath_prepend(str(tmp_path))
    with testing.fake_device("sm_80", record=False) as device:
        import cached_kernels

        eager_loads = len(device.loads)
        cached_kernels.fill[1, 8](device.array(np.zeros(8, np.float32)))
    assert eager_loads == 1 and len(device.loads) == 2
    saved = sorted(p.suffix for p in (tmp_path / "__pycache__").glob("cached_kernels.fill-*"))
    assert saved == [".nbc", ".nbi"], saved
