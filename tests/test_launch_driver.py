"""The real launch path, down to the CUDA driver, on a machine with no GPU.

`Project.load()` on tests/launchproj built into a temp store with the real
compiler, then `proj.kernel(...)[grid, block, stream, sharedmem](...)`: the key
check, the artifact choice, loading, argument packing and the stream conversion
all run; only the driver calls are fakes (`kbuild.testing.fake_device`) that
check what they are handed as cuda.core would (a Stream, a LaunchConfig of
3-tuples, parameters as many and as large as the stored PTX's `.entry`
declares) and record it. The launch of today's GPUs failed at exactly this
boundary ("Stream or GraphBuilder expected, got int"); the simulator never
reaches it.
"""

import ctypes
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import run

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """tests/launchproj (declaring sm_80 and sm_90) built for sm_80 only."""
    root = tmp_path_factory.mktemp("launchproj")
    shutil.copytree(REPO / "tests" / "launchproj", root, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return _built_for_sm80(root)


def _built_for_sm80(root):
    """`root`'s project built for sm_80 only into `root`/store, in a kbuild process."""
    done = run("build", "--arch", "sm_80", "--store", root / "store", cwd=root, home=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def _load(root, on_miss="error"):
    from kbuild import Project

    return Project.load(root / "kbuild.toml", store=root / "store", on_miss=on_miss)


@pytest.fixture
def launch(built):
    """(project, fake device) for a device of compute capability 8.0."""
    from kbuild import testing

    proj = _load(built)
    with testing.fake_device("sm_80", proj.store) as device:
        yield proj, device


# -- every stream form -----------------------------------------------------------------

class _ForeignStream:
    """A stream as CuPy and PyTorch give one: only `__cuda_stream__`."""

    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def _numba_stream(handle):
    from cuda.bindings import driver as binding
    from numba.cuda.cudadrv.driver import Stream

    return Stream(binding.CUstream(handle))


def _core_stream(handle):
    from cuda.core import Stream

    return Stream.from_handle(handle)


STREAMS = [  # (name, make the stream, the CUstream handle the launch must get)
    ("omitted", None, 0),
    ("0", lambda: 0, 0),
    ("None", lambda: None, 0),
    ("False", lambda: False, 0),
    ("numpy 0", lambda: np.int64(0), 0),
    ("numba default stream", lambda: _numba_stream(0), 0),
    ("numba legacy stream", lambda: _numba_stream(1), 1),
    ("numba stream", lambda: _numba_stream(0x5000), 0x5000),
    ("cuda.core Stream", lambda: _core_stream(0x6000), 0x6000),
    ("__cuda_stream__ object", lambda: _ForeignStream(0x7000), 0x7000),
]


@pytest.mark.parametrize("name, make, handle", STREAMS, ids=[s[0] for s in STREAMS])
@pytest.mark.parametrize("target", ["lk.bench:noargs", "lk.bench:saxpy"])
def test_every_stream_form_reaches_the_driver_as_a_cuda_core_stream(launch, name, make,
                                                                     handle, target):
    from kbuild import testing

    proj, fake = launch
    x = testing.device_array(np.arange(8, dtype=np.float32))
    args = () if target.endswith("noargs") else (np.float32(2), x, x, x)
    kernel = proj.kernel(target)
    config = kernel[2, 4] if make is None else kernel[2, 4, make(), 0]
    config(*args)
    assert fake.launches[-1].stream == handle
    assert (fake.launches[-1].grid, fake.launches[-1].block) == ((2, 1, 1), (4, 1, 1))


@pytest.mark.parametrize("stream, message", [
    (5, "stream must be 0, None, a numba or cuda.core Stream, or an object with "
        "__cuda_stream__; got int 5"),
    ("s", "stream must be 0, None, a numba or cuda.core Stream, or an object with "
          "__cuda_stream__; got str 's'"),
    (np.int32(3), "stream must be 0, None, a numba or cuda.core Stream, or an object with "
                  "__cuda_stream__; got int32 np.int32(3)"),
])
def test_a_wrong_stream_is_refused_by_name(launch, stream, message):
    proj, fake = launch
    with pytest.raises(TypeError) as info:
        proj.kernel("lk.bench:noargs")[1, 1, stream, 0]()
    assert str(info.value) == message
    assert fake.launches == []


# -- every argument kind ----------------------------------------------------------------

def _host(n=8, dtype=np.float32):
    return np.arange(n, dtype=dtype)


def _array_fields(a):
    """numba's parameters of an array: meminfo, parent, nitems, itemsize, data, shape, strides."""
    return (0, 0, a.size, a.itemsize, a.ctypes.data, *a.shape, *a.strides)


def _saxpy_with(wrap):
    x, y, out = _host(), _host(), _host()
    wrapped = [wrap(a) for a in (x, y, out)]
    return "lk.bench:saxpy", (2, 4), (np.float32(2), *wrapped), (x, y, out)


def _mixed_args():
    from lk.kinds import REC_DTYPE

    rec = np.zeros(1, REC_DTYPE)[0]
    return (True, np.int8(-3), np.uint16(7), np.float16(1.5), np.complex64(1 + 2j), 3 - 4j,
            rec, np.zeros((), np.float64), np.zeros(8))


class _BothInterfaces:
    """CuPy's and PyTorch's arrays: both `__cuda_array_interface__` and DLPack (numba reads
    DLPack first, and so does kbuild)."""

    def __init__(self, device, host):
        self._cai, self._dlpack = device.foreign_array(host), device.dlpack_array(host)

    @property
    def __cuda_array_interface__(self):
        return self._cai.__cuda_array_interface__

    def __dlpack__(self, *args, **kwargs):
        return self._dlpack.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._dlpack.__dlpack_device__()


ARGUMENT_KINDS = {  # case -> device -> (target, grid/block, args, hosts behind the arrays)
    "host numpy arrays": lambda d: _saxpy_with(lambda a: a),
    "numba device arrays": lambda d: _saxpy_with(d.array),
    "__cuda_array_interface__": lambda d: _saxpy_with(d.foreign_array),
    "DLPack": lambda d: _saxpy_with(d.dlpack_array),
    "__cuda_array_interface__ and DLPack": lambda d: _saxpy_with(lambda a: _BothInterfaces(d, a)),
    "cuda.InOut hints": lambda d: _saxpy_with(__import__("numba").cuda.InOut),
}


@pytest.mark.parametrize("case", list(ARGUMENT_KINDS))
def test_arrays_are_packed_in_numbas_abi(launch, case):
    proj, fake = launch
    target, (grid, block), args, hosts = ARGUMENT_KINDS[case](fake)
    proj.kernel(target)[grid, block](*args)
    packed = fake.launches[-1].args
    assert type(packed[0]) is np.float32 and packed[0] == 2.0
    assert packed[1:] == sum((_array_fields(h) for h in hosts), ())
    # numba copies a host array back after the launch; device memory stays where it is
    assert fake.copies_back == (3 if case in ("host numpy arrays", "cuda.InOut hints") else 0)


def test_every_scalar_kind_a_record_and_a_0d_array(launch):
    proj, fake = launch
    args = _mixed_args()
    proj.kernel("lk.kinds:mixed")[1, 1](*args)
    p = fake.launches[-1].args
    # numpy scalars of the declared type go to cuda.core as they are; the rest as ctypes
    assert [type(v) for v in p[:8]] == [ctypes.c_bool, np.int8, np.uint16, np.float16,
                                       ctypes.c_float, ctypes.c_float, ctypes.c_double,
                                       ctypes.c_double]
    assert [getattr(v, "value", v) for v in p[:8]] == [True, -3, 7, 1.5, 1.0, 2.0, 3.0, -4.0]
    assert p[8] != 0  # the record's device copy
    assert p[9:14] == (0, 0, 1, 8, args[7].ctypes.data)  # a 0-d array: no shape, no strides
    assert fake.copies_back == 3  # the record, the 0-d array and `out` come back


def test_python_scalars_take_the_declared_type(launch):
    proj, fake = launch
    proj.kernel("lk.bench:scalars16")[1, 1](*[float(i) for i in range(16)])
    assert [(type(v), v.value) for v in fake.launches[-1].args] == \
        [(ctypes.c_float, float(i)) for i in range(16)]


def test_dynamic_shared_memory_and_2d_strided_arrays(launch):
    from kbuild import testing

    proj, fake = launch
    x, sums = testing.device_array(_host(16)), testing.device_array(_host(4))
    proj.kernel("lk.kinds:block_sums")[4, 4, 0, 4 * 4](x, sums)
    assert fake.launches[-1].shared_memory == 16
    a = np.zeros((8, 4), np.float32).T  # F-ordered: declared float32[:, :]
    out = np.zeros((4, 8), np.float32)
    proj.kernel("lk.kinds:transpose_add")[(1, 2), [4, 4]](a, out)
    launched = fake.launches[-1]
    assert (launched.grid, launched.block) == ((1, 2, 1), (4, 4, 1))
    assert launched.args[:9] == _array_fields(a)


def test_a_grid_sync_kernel_launches_cooperatively(launch):
    from kbuild import testing

    proj, fake = launch
    x = testing.device_array(_host(64))
    proj.kernel("lk.kinds:grid_reverse")[2, 32](x, x, x)
    # (the fake device refuses a cooperative flag the kernel's code does not need)
    assert fake.launches[-1].cooperative


@pytest.mark.parametrize("config, error", [
    ((1,), "launch with kernel[griddim, blockdim] or kernel[griddim, blockdim, stream, sharedmem]"),
    (((1, 2, 3, 4), 1), "griddim must be a sequence of 1, 2 or 3 integers, got [1, 2, 3, 4]"),
    ((1.5, 1), "griddim must be a sequence of integers, got [1.5]"),
    ((1, None), "must specify launch configuration"),
])
def test_a_wrong_launch_configuration_is_refused(launch, config, error):
    proj, fake = launch
    with pytest.raises((TypeError, ValueError)) as info:
        proj.kernel("lk.bench:noargs")[config]()
    assert str(info.value) == error
    assert fake.launches == []


# -- per-launch work ------------------------------------------------------------------

def test_arguments_are_typed_once_per_kind_and_modules_loaded_once(launch, monkeypatch):
    from kbuild.backend import launcher
    from kbuild import testing

    proj, fake = launch
    typed = []
    real = launcher.argument_types
    monkeypatch.setattr(launcher, "argument_types", lambda *a: typed.append(1) or real(*a))
    x = testing.device_array(_host())
    saxpy = proj.kernel("lk.bench:saxpy")
    for _ in range(50):
        saxpy[1, 8](np.float32(1), x, x, x)
    saxpy[1, 8](1.0, x, x, x)  # a new kind (a Python float): typed again, once
    saxpy[1, 8](2.0, x, x, x)
    assert (len(typed), len(fake.launches), len(fake.loads)) == (2, 52, 1)


# -- which artifact, on which device ---------------------------------------------------

@pytest.mark.parametrize("cc, kind, target", [
    ((8, 0), "cubin", None),       # the exact arch
    ((9, 0), "ptx", "sm_80"),      # declared, never built: sm_80's PTX, JIT-compiled
    ((8, 9), "ptx", "sm_80"),      # not declared: the highest below
])
def test_the_device_gets_the_cubin_else_the_highest_ptx_below(built, cc, kind, target):
    from kbuild import testing

    proj = _load(built, on_miss="build")  # PTX is usable: nothing is built
    entries = sorted(p.name for p in (built / "store").rglob("*.json"))
    with testing.fake_device(f"sm_{cc[0]}{cc[1]}", proj.store) as fake:
        proj.kernel("lk.bench:saxpy")[1, 8](np.float32(1), *[testing.device_array(_host())] * 3)
    assert [(k.kind, k.ptx_target) for k in fake.loads] == [(kind, target)]
    assert sorted(p.name for p in (built / "store").rglob("*.json")) == entries


def test_a_cooperative_kernels_ptx_is_linked_with_cudadevrt_for_the_device(built):
    from kbuild import testing

    proj = _load(built)
    with testing.fake_device("sm_90", proj.store) as fake:
        x = testing.device_array(_host(64))
        proj.kernel("lk.kinds:grid_reverse")[2, 32](x, x, x)
    # sm_80's PTX + cudadevrt, linked by nvJitLink into a cubin for sm_90, loaded
    assert [k.kind for k in fake.loads] == ["cubin"]
    assert fake.launches[-1].cooperative


def test_a_device_below_every_declared_arch_is_refused_by_name(built):
    from kbuild import testing
    from kbuild.errors import LaunchError

    proj = _load(built)
    with testing.fake_device("sm_75", proj.store) as fake, pytest.raises(LaunchError) as info:
        proj.kernel("lk.bench:noargs")[1, 1]()
    assert str(info.value) == (
        "kernel 'lk.bench:noargs' void() has no usable artifact for device sm_75: nothing is "
        "declared for sm_75 or below (declared archs: sm_80, sm_90)")
    assert fake.launches == []


# -- debug kernels and install() --------------------------------------------------------

def test_a_debug_kernel_reports_a_device_exception_as_numba_does(launch):
    from kbuild import testing

    proj, fake = launch
    x = testing.device_array(_host())
    checked = proj.kernel("lk.kinds:checked_store")
    checked[1, 1, _core_stream(0x8000), 0](x, 3)
    assert fake.launches[-1].stream == 0x8000
    fake.raise_in_kernel(1)  # the code numba's exception table gives the IndexError
    with pytest.raises(IndexError) as info:
        checked[1, 1](x, 30)
    assert str(info.value).endswith(
        "tid=[0, 0, 0] ctaid=[0, 0, 0]: checked_store: index out of range")
    assert "In function 'checked_store', file" in str(info.value)


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_installed_dispatchers_launch_the_stored_binaries(built, cc, monkeypatch):
    from numba.cuda import dispatcher

    from kbuild.backend import launcher
    from kbuild import testing

    compiles, packed = [], []
    real = dispatcher.compile_cuda
    monkeypatch.setattr(dispatcher, "compile_cuda", lambda *a, **k: compiles.append(1) or real(*a, **k))
    real_bind = launcher.StoredKernel.bind
    monkeypatch.setattr(launcher.StoredKernel, "bind",
                        lambda self, kinds: packed.append(kinds) or real_bind(self, kinds))
    proj = _load(built)
    with testing.fake_device(f"sm_{cc[0]}{cc[1]}", proj.store) as fake:
        installed = proj.install(["lk.bench:saxpy", "lk.kinds:grid_reverse"])
        from lk import bench, kinds

        x = testing.device_array(_host(64))
        bench.saxpy[1, 8, _numba_stream(0x9000), 0](np.float32(1), x, x, x)
        kinds.grid_reverse[2, 32](x, x, x)
    assert len(installed) == 2
    assert [(l.stream, l.cooperative) for l in fake.launches] == [(0x9000, False),
                                                                        (0, True)]
    assert [k.kind for k in fake.loads] == (["cubin", "cubin"] if cc == (8, 0)
                                            else ["ptx", "cubin"])
    assert compiles == []
    # A stored cubin's launches are packed by kbuild's launcher behind numba's dispatcher;
    # a PTX fallback keeps numba's launch.
    assert len(packed) == (2 if cc == (8, 0) else 0)


# -- a kernel linked with CUDA C or PTX, on a device its cubin is not for ---------------

# A device function's PTX (sm_80), as a linked `.ptx` file or PTXSource holds it.
MUL_PTX = """.version 7.0
.target sm_80
.address_size 64
.visible .func (.param .b32 r) {name}(.param .b64 p0, .param .b32 p1, .param .b32 p2)
{{
.reg .b32 %r<2>;
.reg .b64 %rd<2>;
.reg .f32 %f<4>;
ld.param.u64 %rd1, [p0];
ld.param.f32 %f1, [p1];
ld.param.f32 %f2, [p2];
mul.f32 %f3, %f1, %f2;
st.f32 [%rd1], %f3;
mov.u32 %r1, 0;
st.param.b32 [r], %r1;
ret;
}}
"""


LINKED = '''import os

from numba import cuda

MUL = 'extern "C" __device__ int {name}(float* out, float a, float b) {{ *out = a * b; return 0; }}'
MUL_PTX = {mul_ptx!r}

mul = cuda.declare_device("mul", "float32(float32, float32)")
mul_code = cuda.declare_device("mul_code", "float32(float32, float32)")
mul_hidden = cuda.declare_device("mul_hidden", "float32(float32, float32)",
                                 link=[cuda.CUSource(MUL.format(name="mul_hidden"))])


@cuda.jit(link=[os.path.join(os.path.dirname(__file__), "mul.cu")])
def from_file(x):
    x[0] = mul(x[0], 2.0)


@cuda.jit(link=[cuda.CUSource(MUL.format(name="mul_code"))])
def from_code(x):
    x[0] = mul_code(x[0], 2.0)


@cuda.jit
def from_declaration(x):
    x[0] = mul_hidden(x[0], 2.0)


# PTX linked: numba's LTO link leaves it out of the kernel's PTX (it is no LTO-IR), so
# the stored PTX declares `mul_ptx` and only the cubin holds its code.
mul_ptx = cuda.declare_device("mul_ptx", "float32(float32, float32)")
mul_ptx_hidden = cuda.declare_device("mul_ptx_hidden", "float32(float32, float32)",
                                     link=[cuda.PTXSource(MUL_PTX.format(name="mul_ptx_hidden")
                                                          .encode())])


@cuda.jit(link=[os.path.join(os.path.dirname(__file__), "mul.ptx")])
def from_ptx_file(x):
    x[0] = mul_ptx(x[0], 2.0)


@cuda.jit
def from_ptx_declaration(x):
    x[0] = mul_ptx_hidden(x[0], 2.0)
'''
LINKED = LINKED.replace("{mul_ptx!r}", repr(MUL_PTX))
LINKED_KERNELS = ("from_file", "from_code", "from_declaration")


@pytest.fixture(scope="module")
def linked(tmp_path_factory):
    """A project whose kernels call CUDA C linked in three ways, and PTX in two, built
    for sm_80 only."""
    root = tmp_path_factory.mktemp("linkproj")
    (root / "lkfile").mkdir()
    (root / "lkfile" / "__init__.py").write_text("")
    (root / "lkfile" / "ops.py").write_text(LINKED)
    (root / "lkfile" / "mul.cu").write_text(
        'extern "C" __device__ int mul(float* out, float a, float b)\n'
        "{ *out = a * b; return 0; }\n")
    (root / "lkfile" / "mul.ptx").write_text(MUL_PTX.format(name="mul_ptx"))
    (root / "kbuild.toml").write_text(
        '[project]\nname = "linkproj"\narch = ["sm_80", "sm_90"]\n' + "".join(
            f'\n[kernels."lkfile.ops:{k}"]\nsignatures = ["void(float32[::1])"]\n'
            for k in LINKED_KERNELS + ("from_ptx_file", "from_ptx_declaration")))
    return _built_for_sm80(root)


@pytest.mark.parametrize("kernel", LINKED_KERNELS)
def test_a_linked_lto_kernels_ptx_holds_its_code_for_the_device(linked, kernel):
    """With `lto` on (numba-cuda's default) the stored PTX is that of numba's LTO link,
    which compiled the CUDA C code to LTO-IR with the kernel's: on an sm_90 device it is
    whole, and the driver's JIT takes it as it is, however the code was linked."""
    from kbuild import testing

    proj = _load(linked)
    launcher = proj.kernel(f"lkfile.ops:{kernel}")
    with testing.fake_device("sm_90", proj.store) as fake:
        launcher[1, 1](testing.device_array(_host()))
    assert [k.kind for k in fake.loads] == ["ptx"]
    assert len(fake.launches) == 1


def test_a_linked_kernels_ptx_is_linked_with_its_code_for_the_device(linked):
    """sm_80's PTX declares `mul_ptx` but its code (a linked PTX file, no LTO-IR) is only
    in the cubin: on an sm_90 device the PTX is linked with it again (nvJitLink), not
    handed to the driver, whose JIT fails on an unresolved extern function."""
    from kbuild import testing

    proj = _load(linked)
    launcher = proj.kernel("lkfile.ops:from_ptx_file")
    with testing.fake_device("sm_90", proj.store) as fake:
        launcher[1, 1](testing.device_array(_host()))
        assert launcher.numba_kernel("void(float32[::1])") is not None  # install()'s path
    assert [k.kind for k in fake.loads] == ["cubin"]
    assert len(fake.launches) == 1


def test_ptx_calling_code_kbuild_cannot_link_is_refused_by_name(linked):
    """A declare_device whose code is an in-memory object: the compile records no file
    and the kernel names no link item, so there is nothing to link the PTX with."""
    from kbuild import testing
    from kbuild.errors import LaunchError

    proj = _load(linked)
    with testing.fake_device("sm_90", proj.store) as fake, pytest.raises(LaunchError) as info:
        proj.kernel("lkfile.ops:from_ptx_declaration")[1, 1](
            testing.device_array(_host()))
    assert fake.loads == []
    assert str(info.value) == (
        "kernel 'lkfile.ops:from_ptx_declaration' void(float32[::1]): its sm_80 PTX calls "
        "mul_ptx_hidden, code its cubin was linked with, and kbuild cannot link it for device "
        "sm_90 here; add sm_90 to the kernel's archs and build")


def test_a_cai_array_numba_would_misread_as_contiguous_is_refused_by_name(launch):
    # float32 strided by 32 bytes: numba-cuda compares byte strides with the dtype's
    # width in bits and types it 'C', so the float32[::1] kernel would read x[0..7]
    from kbuild.errors import LaunchError

    proj, fake = launch
    strided = np.zeros(64, np.float32)[::8]
    args = [np.float32(2)] + [fake.foreign_array(a) for a in (strided, _host(8), _host(8))]
    with pytest.raises(LaunchError, match=r"argument 1 of 'lk.bench:saxpy' is a "
                                          r"__cuda_array_interface__ array .* bits"):
        proj.kernel("lk.bench:saxpy")[1, 8](*args)
    assert fake.launch_count == 0
