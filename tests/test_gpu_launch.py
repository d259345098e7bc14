"""Launching from the store on a real GPU gives what numba's JIT gives (`pytest --gpu`).

tests/launchproj is built on the GPU's machine (its toolchain keys its own store)
for the device's arch, and once more for sm_80 only (the PTX fallback). Every
launch form of issue 13 runs through `proj.kernel()` and through `install()`ed
dispatchers, and its results are compared with a fresh numba `@cuda.jit` of the
same Python function: every stream form, dynamic shared memory, a grid sync,
scalar kinds, records and 0-d arrays, host arrays, device arrays,
`__cuda_array_interface__` and DLPack objects, the PTX fallback (also for a
cooperative kernel), a debug kernel's device-side exception, and no compile.
Skipped where there is no GPU; tests/test_launch_driver.py covers the same path
down to the driver without one.
"""

import shutil
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[1]
N = 1024


def _device_arch() -> str:
    from numba import cuda

    major, minor = cuda.get_current_device().compute_capability
    return f"sm_{major}{minor}"


def _build(root: Path, arch: str) -> Path:
    shutil.copytree(REPO / "tests" / "launchproj", root, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    if arch not in ("sm_80", "sm_90"):  # declare the device's arch too
        toml = root / "kbuild.toml"
        toml.write_text(toml.read_text().replace('arch = ["sm_80", "sm_90"]',
                                                 f'arch = ["sm_80", "sm_90", "{arch}"]'))
    from support import run

    done = run("build", "--arch", arch, "--store", root / "store", cwd=root, home=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return root


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    """The project, its store holding the device's arch."""
    from kbuild import Project

    root = _build(tmp_path_factory.mktemp("gpu-launch"), _device_arch())
    project = Project.load(root / "kbuild.toml", store=root / "store", on_miss="error")
    project.plan()  # puts the project's import roots on sys.path: the tests import `lk`
    return project


@pytest.fixture(scope="module")
def sm80_store(tmp_path_factory):
    """The same project's store built for sm_80 only: a newer device takes its PTX."""
    if _device_arch() == "sm_80":
        pytest.skip("the PTX fallback needs a device newer than sm_80")
    return _build(tmp_path_factory.mktemp("gpu-sm80"), "sm_80")


def _jit(kernel):
    """A fresh numba dispatcher of the same Python function and options (never the store's)."""
    from numba import cuda

    options = {k: v for k, v in kernel.targetoptions.items()
               if k in ("debug", "opt", "lineinfo", "fastmath")}
    return cuda.jit(**options)(kernel.py_func)


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)


def _saxpy_both(proj, launch_kbuild):
    """saxpy's output from the store (through `launch_kbuild`) and from numba's JIT."""
    from numba import cuda

    from lk import bench

    x, y = _inputs()
    dx, dy = cuda.to_device(x), cuda.to_device(y)
    ours, theirs = cuda.device_array(N, np.float32), cuda.device_array(N, np.float32)
    launch_kbuild(proj.kernel("lk.bench:saxpy"), (np.float32(2.5), dx, dy, ours))
    _jit(bench.saxpy)[N // 128, 128](np.float32(2.5), dx, dy, theirs)
    cuda.synchronize()
    return ours.copy_to_host(), theirs.copy_to_host()


# -- every stream form -----------------------------------------------------------------

def _streams():
    from numba import cuda

    class Foreign:  # as CuPy's and PyTorch's streams: only __cuda_stream__
        def __init__(self, stream):
            self.stream = stream

        def __cuda_stream__(self):
            return (0, int(self.stream.handle))

    def core_stream():
        from cuda.core import Device

        device = Device(cuda.get_current_device().id)
        device.set_current()
        return device.create_stream()

    return {"0": lambda: 0, "None": lambda: None,
            "numba default": cuda.default_stream, "numba legacy": cuda.legacy_default_stream,
            "numba per-thread": cuda.per_thread_default_stream, "numba stream": cuda.stream,
            "cuda.core Stream": core_stream, "__cuda_stream__": lambda: Foreign(cuda.stream())}


@pytest.mark.parametrize("form", list(_streams()))
def test_every_stream_form_launches_like_numba(proj, form):
    stream = _streams()[form]()

    def launch(kernel, args):
        kernel[N // 128, 128, stream, 0](*args)

    ours, theirs = _saxpy_both(proj, launch)
    assert np.array_equal(ours, theirs)


# -- argument kinds -----------------------------------------------------------------------

class _CudaArrayInterface:
    """Only `__cuda_array_interface__`, as CuPy and PyTorch arrays have it."""

    def __init__(self, device_array):
        self.array = device_array

    @property
    def __cuda_array_interface__(self):
        return self.array.__cuda_array_interface__


def _wrap(kind, host):
    from numba import cuda

    if kind == "host":
        return host
    device = cuda.to_device(host)
    if kind == "device":
        return device
    if kind == "cai":
        return _CudaArrayInterface(device)
    if kind == "cupy":
        cupy = pytest.importorskip("cupy")
        return cupy.asarray(host)
    if kind == "torch":
        torch = pytest.importorskip("torch")
        return torch.from_numpy(host).cuda()
    if kind == "dlpack":
        cupy = pytest.importorskip("cupy")

        class DLPackOnly:
            def __init__(self, a):
                self.a = a

            def __dlpack__(self, *args, **kwargs):
                return self.a.__dlpack__(*args, **kwargs)

            def __dlpack_device__(self):
                return self.a.__dlpack_device__()

        return DLPackOnly(cupy.asarray(host))
    raise AssertionError(kind)


def _to_host(value):
    if isinstance(value, np.ndarray):
        return value
    for name in ("copy_to_host", "get"):
        if hasattr(value, name):
            return getattr(value, name)()
    if hasattr(value, "cpu"):
        return value.cpu().numpy()
    if hasattr(value, "array"):
        return value.array.copy_to_host()
    return _to_host(value.a)


@pytest.mark.parametrize("kind", ["host", "device", "cai", "cupy", "torch", "dlpack"])
def test_every_array_kind_gives_numbas_result(proj, kind):
    from numba import cuda

    from lk import bench

    x, y = _inputs(1)
    ours = [_wrap(kind, a.copy()) for a in (x, y, np.zeros(N, np.float32))]
    proj.kernel("lk.bench:saxpy")[N // 128, 128](np.float32(-1.5), *ours)
    theirs = np.zeros(N, np.float32)
    _jit(bench.saxpy)[N // 128, 128](np.float32(-1.5), x, y, theirs)
    cuda.synchronize()
    assert np.array_equal(_to_host(ours[2]), theirs)


def test_scalar_kinds_records_and_0d_arrays_give_numbas_result(proj):
    from numba import cuda

    from lk import kinds

    def run(kernel):
        rec = np.zeros(1, kinds.REC_DTYPE)[0]
        rec["a"], rec["b"] = 1.25, -7
        zero_d, out = np.full((), 3.5), np.zeros(8)
        kernel[1, 32](True, np.int8(-3), np.uint16(65000), np.float16(1.5),
                      np.complex64(1 + 2j), 3 - 4j, rec, zero_d, out)
        cuda.synchronize()
        return out, zero_d

    ours, theirs = run(proj.kernel("lk.kinds:mixed")), run(_jit(kinds.mixed))
    assert np.array_equal(ours[0], theirs[0]) and ours[1] == theirs[1] == 42.0
    assert ours[0].tolist() == [1.0, -3.0, 65000.0, 1.5, 3.0, 7.0, -5.75, 3.5]


def test_dynamic_shared_memory(proj):
    from numba import cuda

    from lk import kinds

    x = np.arange(N, dtype=np.float32)
    ours, theirs = np.zeros(N // 128, np.float32), np.zeros(N // 128, np.float32)
    proj.kernel("lk.kinds:block_sums")[N // 128, 128, 0, 128 * 4](x, ours)
    _jit(kinds.block_sums)[N // 128, 128, 0, 128 * 4](x, theirs)
    cuda.synchronize()
    assert np.array_equal(ours, theirs)
    assert np.allclose(ours, x.reshape(-1, 128).sum(axis=1))


def test_a_strided_2d_argument(proj):
    from numba import cuda

    from lk import kinds

    a = np.arange(32 * 64, dtype=np.float32).reshape(32, 64).T  # (64, 32), F-ordered
    ours, theirs = np.ones((32, 64), np.float32), np.ones((32, 64), np.float32)
    proj.kernel("lk.kinds:transpose_add")[(4, 8), (8, 8)](a, ours)
    _jit(kinds.transpose_add)[(4, 8), (8, 8)](a, theirs)
    cuda.synchronize()
    assert np.array_equal(ours, theirs) and np.array_equal(ours, 1 + a.T)


def _grid_reverse(kernel, grid):
    from numba import cuda

    x = cuda.to_device(np.arange(N, dtype=np.float32))
    tmp, out = cuda.device_array(N, np.float32), cuda.device_array(N, np.float32)
    kernel[grid, 128](x, tmp, out)
    cuda.synchronize()
    return out.copy_to_host()


def test_a_grid_sync_kernel(proj):
    from lk import kinds

    ours = _grid_reverse(proj.kernel("lk.kinds:grid_reverse"), 8)  # 8 x 128: co-resident
    assert np.array_equal(ours, _grid_reverse(_jit(kinds.grid_reverse), 8))
    assert np.array_equal(ours, 2 * np.arange(N, dtype=np.float32)[::-1])


# -- the PTX fallback ------------------------------------------------------------------

@pytest.mark.parametrize("target", ["lk.bench:saxpy", "lk.kinds:grid_reverse"])
def test_a_store_without_the_devices_arch_launches_sm80s_ptx(sm80_store, target):
    from kbuild import Project

    proj = Project.load(sm80_store / "kbuild.toml", store=sm80_store / "store",
                        on_miss="error")
    launcher = proj.kernel(target)
    signature = next(iter(launcher.resolved.argtypes))
    found = launcher.artifact(signature, _device_arch())
    assert (found.arch, found.kind) == ("sm_80", "ptx")
    if target == "lk.bench:saxpy":
        def launch(kernel, args):
            kernel[N // 128, 128](*args)

        ours, theirs = _saxpy_both(proj, launch)
        assert np.array_equal(ours, theirs)
    else:
        assert np.array_equal(_grid_reverse(launcher, 8),
                              2 * np.arange(N, dtype=np.float32)[::-1])


# -- debug kernels, install(), no compile ----------------------------------------------------

def _raised(kernel, x, i):
    from numba import cuda

    with pytest.raises(IndexError) as info:
        kernel[1, 1](x, i)
        cuda.synchronize()
    return str(info.value)


def test_a_debug_kernel_raises_the_device_exception_as_numba_does(proj):
    from numba import cuda

    from lk import kinds

    x = cuda.to_device(np.zeros(8, np.float32))
    proj.kernel("lk.kinds:checked_store")[1, 1](x, 3)
    cuda.synchronize()
    assert x.copy_to_host()[3] == 1.0
    ours = _raised(proj.kernel("lk.kinds:checked_store"), x, 30)
    assert ours == _raised(_jit(kinds.checked_store), x, 30)
    assert ours.endswith("checked_store: index out of range")


def test_installed_dispatchers_launch_the_store_without_compiling(proj, sm80_store):
    from numba import cuda
    from numba.cuda import dispatcher

    from kbuild import Project
    from lk import bench, kinds

    compiles = []
    real = dispatcher.compile_cuda
    dispatcher.compile_cuda = lambda *a, **k: compiles.append(1) or real(*a, **k)
    try:
        # the PTX fallback store: install() loads sm_80's PTX (cooperative: linked)
        fallback = Project.load(sm80_store / "kbuild.toml", store=sm80_store / "store",
                                on_miss="error")
        assert len(fallback.install(["lk.bench:saxpy", "lk.kinds:grid_reverse"])) == 2

        def launch(kernel, args):
            bench.saxpy[N // 128, 128, cuda.stream(), 0](*args)

        ours, theirs = _saxpy_both(proj, launch)
        reversed_ = _grid_reverse(kinds.grid_reverse, 8)
    finally:
        dispatcher.compile_cuda = real
    assert np.array_equal(ours, theirs)
    assert np.array_equal(reversed_, 2 * np.arange(N, dtype=np.float32)[::-1])
    assert len(compiles) == 1  # numba's JIT baseline in _saxpy_both, nothing else


def test_a_warm_launch_compiles_nothing(proj):
    from numba import cuda
    from numba.cuda import dispatcher

    compiles = []
    real = dispatcher.compile_cuda
    dispatcher.compile_cuda = lambda *a, **k: compiles.append(1) or real(*a, **k)
    try:
        x = cuda.to_device(np.ones(N, np.float32))
        for name in ("noargs", "scalars16"):
            kernel = proj.kernel(f"lk.bench:{name}")
            args = () if name == "noargs" else tuple(np.float32(i) for i in range(16))
            kernel[1, 32](*args)
        proj.kernel("lk.bench:arrays16")[N // 128, 128](*[x] * 16)
        cuda.synchronize()
    finally:
        dispatcher.compile_cuda = real
    assert compiles == []
    assert np.array_equal(x.copy_to_host(), np.full(N, 15.0, np.float32))
