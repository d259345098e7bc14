"""kbuild types launch arguments as numba does: over a matrix of argument values, the
type kbuild picks a signature with (`kinds` then `argument_types`) is numba's own
`typeof(value, Purpose.argument)`, and two values of equal kinds (the key a launch's
binding is cached under) always get equal numba types. The same holds for
numba-cuda-mlir (its launcher module's `kinds_of` and `argument_types`) against what its
own dispatcher types each argument as (`_mlir_dispatcher_type`)."""

from __future__ import annotations

import contextlib
import enum
import itertools

import numpy as np
import pytest
from mlir_support import INSTALLED, MLIR, needs_mlir


class _Cai:
    """A foreign device array that only has `__cuda_array_interface__`, as given."""

    def __init__(self, shape, strides, typestr="<f4", readonly=False):
        self.desc = {"shape": shape, "strides": strides, "typestr": typestr,
                     "data": (0x1000, readonly), "version": 3}

    @property
    def __cuda_array_interface__(self):
        return self.desc


class _CaiAndDLPack:
    """CuPy's and PyTorch's arrays speak both: numba reads DLPack first."""

    def __init__(self, host):
        self.host = host

    @property
    def __cuda_array_interface__(self):
        a = self.host
        return {"shape": a.shape, "strides": a.strides, "typestr": a.dtype.str,
                "data": (a.ctypes.data, False), "version": 3}

    def __dlpack__(self, *args, **kwargs):
        return self.host.__dlpack__()

    def __dlpack_device__(self):
        return self.host.__dlpack_device__()


class _Color(enum.Enum):
    red = 1
    blue = 2


class _Level(enum.IntEnum):
    low = 1


ALIGNED = np.dtype([("a", np.int32), ("b", np.float64)], align=True)
PACKED = np.dtype([("a", np.int32), ("b", np.float64)])
NESTED = np.dtype([("p", PACKED), ("c", np.int8)])
TITLED = np.dtype({"names": ["a"], "formats": [np.float32], "titles": ["alpha"]})


def _f32(*shape):
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)


def _readonly(a):
    a.flags.writeable = False
    return a


def _strided(a, shape, strides):
    return np.lib.stride_tricks.as_strided(a, shape, strides)  # writable, unlike broadcast_to


def _unaligned():
    return np.ndarray((4,), np.float32, np.zeros(17, np.uint8).data, 1)


def _values(fake):
    from kbuild import testing

    host = {
        "host C": _f32(4, 3), "host F": np.asfortranarray(_f32(4, 3)),
        "host A": _f32(4, 6)[:, ::2], "host 0-d": np.array(1.0), "host 0-size": np.zeros((0, 3)),
        "host broadcast": np.broadcast_to(np.float32(1), (4, 3)),
        "host broadcast 1-d": np.broadcast_to(np.float32(1), (4,)),
        "host read-only": _readonly(_f32(4)), "host unaligned": _unaligned(),
        "host aligned record": np.zeros(3, ALIGNED), "host packed record": np.zeros(3, PACKED),
        "host nested record": np.zeros(3, NESTED), "host titled record": np.zeros(3, TITLED),
        "host datetime64[s]": np.zeros(3, "M8[s]"), "host datetime64[ms]": np.zeros(3, "M8[ms]"),
        "host complex64": np.zeros(3, np.complex64), "host 1 element strided": _f32(4)[::4],
        "host int8 F": np.asfortranarray(np.zeros((2, 3), np.int8)),
        "host newaxis": _f32(4)[:, np.newaxis],  # shape (4, 1), strides (4, 0): numpy's 'C'
        "host writable broadcast": _strided(_f32(3), (4, 3), (0, 4)),
        "host strided broadcast": _strided(_f32(6), (4, 3), (0, 8)),
    }
    device = {
        "device C": testing.device_array(_f32(4, 3)),
        "device F": testing.device_array(np.asfortranarray(_f32(4, 3))),
        "device strided": testing.device_array(_f32(4, 6)[:, ::2]),
        "device broadcast": testing.device_array(np.broadcast_to(np.float32(1), (4, 3))),
        "device 1-d": testing.device_array(_f32(8)),
    }
    cai = {
        "cai strides None": _Cai((4, 3), None), "cai C strides": _Cai((4, 3), (12, 4)),
        "cai F strides": _Cai((4, 3), (4, 16)), "cai strided": _Cai((4,), (8,)),
        "cai stride == bitwidth": _Cai((4,), (32,)),
        "cai F strides == bitwidth": _Cai((4, 3), (32, 128)),
        "cai C strides == bitwidth f8": _Cai((4, 3), (192, 64), "<f8"),
        "cai (4, 1) by bits": _Cai((4, 1), (32, 32)), "cai (4, 1) by bytes": _Cai((4, 1), (4, 4)),
        "cai read-only": _Cai((4,), None, readonly=True), "cai record |V8": _Cai((4,), None, "|V8"),
        "cai 0-d": _Cai((), None), "cai broadcast": _Cai((4,), (0,)),
        "cai 0-size": _Cai((0, 3), (12, 4)), "cai int8 C strides": _Cai((2, 3), (3, 1), "|i1"),
        "foreign array F": fake.foreign_array(np.asfortranarray(_f32(4, 3))),
        "foreign array C": fake.foreign_array(_f32(4, 3)),
        "foreign array strided": fake.foreign_array(_f32(4, 6)[:, ::2]),
    }
    dlpack = {
        "dlpack C": fake.dlpack_array(_f32(4, 3)),
        "dlpack F": fake.dlpack_array(np.asfortranarray(_f32(4, 3))),
        "dlpack strided": fake.dlpack_array(_f32(4, 6)[:, ::2]),
        "cai+dlpack C": _CaiAndDLPack(_f32(4, 3)),
        "cai+dlpack F": _CaiAndDLPack(np.asfortranarray(_f32(4, 3))),
        "cai+dlpack strided": _CaiAndDLPack(_f32(4, 6)[:, ::2]),
        "cai+dlpack stride == bitwidth": _CaiAndDLPack(_f32(32)[::8]),
    }
    scalars = {
        "True": True, "int 1": 1, "int -1": -1, "int 2**40": 2 ** 40, "int 2**63 - 1": 2 ** 63 - 1,
        "int -2**63": -2 ** 63, "int 2**63": 2 ** 63, "int 2**64 - 1": 2 ** 64 - 1,
        "float": 1.5, "complex": 1j, "np.float32": np.float32(1), "np.int16": np.int16(1),
        "np.bool_": np.bool_(True), "np.complex64": np.complex64(1), "enum": _Color.red,
        "enum other member": _Color.blue, "IntEnum": _Level.low,
        "np.datetime64[s]": np.datetime64(1, "s"), "np.datetime64[D]": np.datetime64(1, "D"),
        "np.timedelta64[s]": np.timedelta64(1, "s"),
        "record aligned": np.zeros(1, ALIGNED)[0], "record packed": np.zeros(1, PACKED)[0],
        "np.str_ 1": np.str_("a"), "np.str_ 3": np.str_("abc"),
        "np.bytes_ 1": np.bytes_(b"a"), "np.bytes_ 2": np.bytes_(b"ab"),
    }
    tuples = {
        "tuple": (1, 2.0), "uniform tuple": (1, 2), "nested tuple": ((1, 2), 3.0),
        "tuple of arrays": (_f32(3), np.asfortranarray(_f32(2, 2))),
        "tuple of big int": (2 ** 63,), "empty tuple": (),
    }
    return {**host, **device, **cai, **dlpack, **scalars, **tuples}


def _numba_type(value):
    from numba.cuda.typing.typeof import Purpose, typeof

    try:
        return typeof(value, Purpose.argument)
    except Exception as e:  # noqa: BLE001 - what numba refuses, kbuild must refuse
        return type(e)


def _kbuild_type(value):
    from kbuild.backend import kinds

    try:
        return kinds.argument_types((value,), kinds.kinds_of((value,)))[0]
    except Exception as e:  # noqa: BLE001
        return type(e)


def _made():
    from kbuild import testing

    with testing.fake_device("sm_80", record=False) as fake:
        return _values(fake)


VALUES = _made()


@pytest.mark.parametrize("name", list(VALUES))
def test_kbuild_types_an_argument_as_numba_does(name):
    value = VALUES[name]
    assert _kbuild_type(value) == _numba_type(value)


def test_arguments_of_equal_kinds_get_equal_numba_types():
    from kbuild.backend import kinds

    keyed = [(name, kinds.kinds_of((v,))) for name, v in VALUES.items()]
    keyed = [(name, k) for name, k in keyed if kinds.cacheable(k)]
    clashes = [(a, b, _numba_type(VALUES[a]), _numba_type(VALUES[b]))
               for (a, ka), (b, kb) in itertools.combinations(keyed, 2)
               if ka == kb and _numba_type(VALUES[a]) != _numba_type(VALUES[b])]
    assert clashes == []


MISREAD = [  # (value, declared, index misread): numba types these as contiguous wrongly
    ("cai stride == bitwidth", "float32[::1]", 0),
    ("cai stride == bitwidth", "float32[:]", None),
    ("cai F strides == bitwidth", "float32[::1, :]", 0),
    ("cai (4, 1) by bits", "float32[:, ::1]", 0),
    ("cai strides None", "float32[:, ::1]", None),
    ("cai C strides == bitwidth f8", "float64[:, ::1]", 0),
]


@pytest.mark.parametrize("name, declared, index", MISREAD)
def test_numbas_contiguous_misreading_of_a_cai_array_is_found(name, declared, index):
    from numba.core import sigutils

    from kbuild.backend import kinds

    args, _ = sigutils.normalize_signature(f"void({declared}, {declared})")
    value = VALUES[name]
    assert kinds.misread(kinds.kinds_of((1, value)), (args[0], args[1])) == \
        (None if index is None else index + 1)
    assert kinds.misread(kinds.kinds_of(((1, value),)),
                         (__import__("numba").types.Tuple((args[0], args[1])),)) == \
        (None if index is None else 0)


def test_numbas_misreading_inside_cuda_in_is_found_where_numba_misreads():
    """numba-cuda types `cuda.In(x)` as `x`'s CAI reading (contiguous, wrongly) and launches
    the device array made from its real strides: refused. numba-cuda-mlir types the array
    it makes (strided: 'A'), so the same launch is not a misreading there."""
    from numba.core import sigutils
    from numba.cuda import In
    from numba.cuda.typing.typeof import Purpose, typeof

    from kbuild.backend import kinds

    value = In(_Cai((4,), (32,)))
    assert typeof(value.value, Purpose.argument).layout == "C"  # numba's misreading
    (contiguous,), _ = sigutils.normalize_signature("void(float32[::1])")
    assert kinds.misread(kinds.kinds_of((value,)), (contiguous,)) == 0
    assert kinds.misread(kinds.kinds_of((value,)), (contiguous,), in_hints=False) is None
    (strided,), _ = sigutils.normalize_signature("void(float32[:])")
    assert kinds.misread(kinds.kinds_of((value,)), (strided,)) is None


class _CpuTensor:
    """PyTorch's CPU tensor: DLPack, and a `__cuda_array_interface__` that raises."""

    def __init__(self, host):
        self.host = host

    def __dlpack__(self, *args, **kwargs):
        return self.host.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.host.__dlpack_device__()

    @property
    def __cuda_array_interface__(self):
        raise AttributeError("Can't get __cuda_array_interface__ on non-CUDA tensor")


def test_a_cpu_tensor_in_cuda_in_has_a_kind_and_numbas_type():
    """numba asks for the CAI with getattr (`auto_device`): a CPU tensor wrapped in
    `cuda.In` is typed by its DLPack, and its kind is read without raising."""
    from numba.cuda import In
    from numba.cuda.typing.typeof import Purpose, typeof

    from kbuild.backend import kinds

    first, second = In(_CpuTensor(np.arange(4.0))), In(_CpuTensor(np.arange(8.0)))
    assert kinds.kinds_of((first,)) == kinds.kinds_of((second,))
    assert kinds.argument_types((first,), kinds.kinds_of((first,))) == \
        (typeof(first, Purpose.argument),)


# -- numba-cuda-mlir -------------------------------------------------------------------------
# Its dispatcher (`descriptor._ArgMarshaller._call_impl`) types an argument with its vendored
# `typeof` after `_maybe_copy_to_device_item`: a host array (in a tuple too, or in
# cuda.In/Out/InOut) is typed as the device copy it makes of it (`cuda.to_device`), its
# own DeviceNDArray. Here that copy is made by its own `auto_device` without memory
# (`_no_device_memory`): the typing is what is under test, not the allocation.

class _CaiRecord(_Cai):
    """A CAI array of records (`|V16`) that has the dtype numba-cuda-mlir reads the fields
    from (`resolve_cuda_array_interface_dtype`): CuPy's structured arrays."""

    def __init__(self, dtype):
        super().__init__((4,), None, f"|V{dtype.itemsize}")
        self.dtype = dtype


class _NoMemory:
    """Device memory that is never touched: a pointer-less allocation."""

    def memalloc(self, size):
        return self

    device_ctypes_pointer = None


@contextlib.contextmanager
def _no_device_memory():
    import numba_cuda_mlir.cuda as mlir_cuda
    from numba_cuda_mlir.numba_cuda import api
    from numba_cuda_mlir.numba_cuda.cudadrv import devicearray, devices

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(devices, "get_context", lambda *a, **k: _NoMemory())
        patch.setattr(api, "current_context", lambda *a, **k: _NoMemory())
        patch.setattr(devices._runtime, "ensure_context", contextlib.nullcontext)
        patch.setattr(mlir_cuda, "to_device", lambda obj, stream=0, copy=True, to=None:
                      devicearray.auto_device(obj, stream=stream, copy=False)[0])
        yield


def _mlir_device_array(host):
    """numba-cuda-mlir's own DeviceNDArray laid out as `host` (over no memory)."""
    from numba_cuda_mlir.numba_cuda.cudadrv.devicearray import DeviceNDArray

    with _no_device_memory():
        return DeviceNDArray(host.shape, host.strides, host.dtype, gpu_data=_NoMemory())


def _mlir_values():
    from numba import cuda

    from kbuild import testing

    return {
        "mlir device C": _mlir_device_array(_f32(4, 3)),
        "mlir device F": _mlir_device_array(np.asfortranarray(_f32(4, 3))),
        "mlir device strided": _mlir_device_array(_f32(4, 6)[:, ::2]),
        "mlir device broadcast": _mlir_device_array(np.broadcast_to(np.float32(1), (4, 3))),
        "mlir device 0-size": _mlir_device_array(np.zeros((0, 3), np.float32)),
        "cai record with its dtype": _CaiRecord(ALIGNED),
        "cai other record with its dtype": _CaiRecord(np.dtype([("a", np.float64),
                                                                 ("b", np.int64)])),
        "tuple with a read-only array": (1, _readonly(_f32(4))),
        "cuda.In read-only": cuda.In(_readonly(_f32(4))),
        "cuda.InOut F": cuda.InOut(np.asfortranarray(_f32(4, 3))),
        "cuda.In CAI C strides": cuda.In(_Cai((4, 3), (12, 4))),
        "cuda.In CAI contiguous by bytes": cuda.In(_Cai((4,), (4,))),
        "cuda.In CAI strided": cuda.In(_Cai((4,), (8,))),
        "cuda.In CAI stride == bitwidth": cuda.In(_Cai((4,), (32,))),
        "cuda.In CAI strides None": cuda.In(_Cai((4, 3), None)),
        "cuda.In numba device array": cuda.In(testing.device_array(_f32(4))),
        "host (4, 1) odd stride": np.ndarray((4, 1), np.float32, np.zeros(8, np.float32).data,
                                             0, (4, 12)),
    }


def _mlir_dispatcher_type(value):
    """The type numba-cuda-mlir's dispatcher gives a launch argument (see above), in its
    types. A numba-cuda device array it types by its `_numba_type_`, numba-cuda's own type,
    which none of its overloads takes: kbuild passes it as the array it is, so it is
    compared in numba-cuda-mlir's types."""
    from numba_cuda_mlir.descriptor import _ArgMarshaller
    from numba_cuda_mlir.numba_cuda.typing.typeof import typeof

    marshaller = object.__new__(_ArgMarshaller)
    marshaller._callbacks = []
    try:
        with _no_device_memory():
            return _in_mlir_types(typeof(marshaller._maybe_copy_to_device_item(value)))
    except Exception as e:  # noqa: BLE001 - what it refuses, kbuild must refuse
        return type(e)


def _in_mlir_types(ty):
    from numba.core import types as numba_types
    from numba.np.numpy_support import as_dtype
    from numba_cuda_mlir.numba_cuda import types
    from numba_cuda_mlir.numba_cuda.np.numpy_support import from_dtype

    if isinstance(ty, numba_types.Array):
        return types.Array(from_dtype(as_dtype(ty.dtype)), ty.ndim, ty.layout,
                           readonly=not ty.mutable, aligned=ty.aligned)
    return ty


def _mlir_launching():
    from kbuild.backend import backends

    return backends.get(MLIR).launcher()


def _kbuild_mlir_type(value):
    launching = _mlir_launching()
    try:
        return launching.argument_types((value,), launching.kinds_of((value,)))[0]
    except Exception as e:  # noqa: BLE001
        return type(e)


MLIR_VALUES = {**VALUES, **_mlir_values()} if INSTALLED else {}


@needs_mlir
@pytest.mark.parametrize("name", list(MLIR_VALUES) or ["(not installed)"])
def test_kbuild_types_an_argument_as_numba_cuda_mlir_s_dispatcher_does(name):
    value = MLIR_VALUES[name]
    assert _kbuild_mlir_type(value) == _mlir_dispatcher_type(value)


@needs_mlir
def test_arguments_of_equal_kinds_get_equal_numba_cuda_mlir_types():
    launching = _mlir_launching()
    typed = {name: _mlir_dispatcher_type(v) for name, v in MLIR_VALUES.items()}
    keyed = [(name, launching.kinds_of((v,))) for name, v in MLIR_VALUES.items()]
    keyed = [(name, k) for name, k in keyed if launching.cacheable(k)]
    clashes = [(a, b, typed[a], typed[b]) for (a, ka), (b, kb) in itertools.combinations(keyed, 2)
               if ka == kb and typed[a] != typed[b]]
    assert clashes == []


@needs_mlir
@pytest.mark.parametrize("name, declared, index", MISREAD)
def test_numba_cuda_mlir_s_contiguous_misreading_of_a_cai_array_is_found(name, declared, index):
    """numba-cuda-mlir's vendored CAI typing compares byte strides with the dtype's width
    in bits too (`_typeof_cuda_array_interface_cached`): the same arrays are refused."""
    from numba_cuda_mlir.numba_cuda import types
    from numba_cuda_mlir.numba_cuda.core import sigutils

    launching = _mlir_launching()
    args, _ = sigutils.normalize_signature(f"void({declared}, {declared})")
    value = MLIR_VALUES[name]
    if index is not None:  # numba-cuda-mlir's own reading: contiguous
        assert _mlir_dispatcher_type(value).layout != "A"
    assert launching.misread(launching.kinds_of((1, value)), (args[0], args[1])) == \
        (None if index is None else index + 1)
    assert launching.misread(launching.kinds_of(((1, value),)),
                             (types.Tuple((args[0], args[1])),)) == \
        (None if index is None else 0)
