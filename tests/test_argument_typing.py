"""kbuild types launch arguments as numba does: over a matrix of argument values, the
type kbuild picks a signature with (`kinds` then `argument_types`) is numba's own
`typeof(value, Purpose.argument)`, and two values of equal kinds (the key a launch's
binding is cached under) always get equal numba types."""

from __future__ import annotations

import enum
import itertools

import numpy as np
import pytest


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
