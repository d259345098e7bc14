"""Argument kinds: what decides an argument's numba type, read cheaply on every launch.

numba's dispatcher types every argument on every launch. A kernel from the store has
declared signatures, so kbuild types arguments once per *kind*: the Python type plus
what numba's typing reads (dtype, ndim, layout, writability, alignment). Equal kinds
type equally, so after the first launch with arguments of some kinds, a launch reads
their kinds and finds its packer in a dict. A numba device array's kind (its shape,
strides and memory never change) is kept in its own `__dict__`, as numba keeps its
memory-view shim there. Values of types kbuild does not know are typed by numba on
every launch (`UNTYPED`).

The type itself is always numba's (`typeof(value, Purpose.argument)`, on the first launch
of a kind), so a kind must hold everything that typing reads, in numba's order: a
`__cuda_array_interface__` array's layout as numba reads its strides (right or wrong, see
`_cai_kind`), DLPack before the CAI, a Python int's range. The same kinds key
numba-cuda-mlir's typing (`mlir/launching.py`), which reads a little more: what a copy to
the device makes of a host array with a zero stride (`_repeated`), a CAI record array's
own dtype (`_owner_dtype`). tests/test_argument_typing.py checks both backends over a
matrix of arguments.
"""

from __future__ import annotations

import enum

import numpy as np

_kind_of_type: dict = {}  # Python type -> function(value) -> kind, or None: the type is the kind


def kinds_of(args) -> tuple:
    """What decides an argument's numba type, per argument, cheaply: equal kinds type
    equally, so a launch with seen kinds needs no typing."""
    return tuple([_kind(a) for a in args])


def _kind(value):
    cls = type(value)
    try:
        how = _kind_of_type[cls]
    except KeyError:
        how = _kind_of_type[cls] = _classify(cls)
    return cls if how is None else how(value)


def _classify(cls):
    """How to read the kind of values of a type (decided once per type)."""
    from numba.cuda.args import ArgHint

    if issubclass(cls, np.ndarray):
        return _host_array_kind
    if issubclass(cls, (np.datetime64, np.timedelta64, np.flexible)):
        return lambda v: (cls, v.dtype)  # the unit, the length or the fields type it
    if issubclass(cls, int) and not issubclass(cls, (bool, enum.Enum)):
        return _int_kind
    if issubclass(cls, (bool, int, float, complex, np.generic, enum.Enum)):
        return None
    if issubclass(cls, tuple):
        return lambda v: (cls, kinds_of(v))
    if issubclass(cls, ArgHint):
        return _arg_hint_kind
    if getattr(cls, "__cuda_memory__", False) and hasattr(cls, "_strided_memory_view_shim"):
        return _device_array_kind
    if hasattr(cls, "__dlpack__"):  # numba's order: DLPack first, then the CAI
        return _dlpack_kind
    if hasattr(cls, "__cuda_array_interface__"):
        return _cai_kind
    return lambda v: (cls, UNTYPED)  # numba may type two such values differently


UNTYPED = "typed by numba on every launch"


def cacheable(kinds) -> bool:
    """Whether a launch with these kinds may reuse the typing of an earlier one."""
    return not any(isinstance(k, tuple) and k and k[-1] is UNTYPED for k in kinds)


def _arg_hint_kind(v):
    """cuda.In/Out/InOut: the kind of what it wraps. Wrapping a foreign device array, also
    the layout of the device array made over its CAI: numba-cuda-mlir types that array
    (`auto_device`), which reads the strides in bytes, not the CAI as `typeof` does."""
    inner = _kind(v.value)
    if type(inner) is tuple and inner and inner[0] in ("cai", "dlpack"):
        # A CPU tensor's property raises AttributeError (numba's `auto_device` asks with
        # getattr too): it has no device array to make.
        desc = getattr(v.value, "__cuda_array_interface__", None)
        if desc is not None:
            return (type(v), inner, _wrapped_layout(desc))
    return (type(v), inner)


def _wrapped_layout(desc) -> str:
    """The layout of a device array made over a CAI (a device array's `_numba_type_`)."""
    from numba.cuda.cudadrv import dummyarray

    strides = desc.get("strides")
    if strides is None:
        return "C"
    a = dummyarray.Array.from_desc(0, desc["shape"], strides, _itemsize(desc["typestr"]))
    flags = a.flags
    return "A" if 0 in a.strides and a.size != 0 else "C" if flags["C_CONTIGUOUS"] else \
        "F" if flags["F_CONTIGUOUS"] else "A"


def _int_kind(v):
    # numba types a Python int by its size: int64, uint64 from 2**63, an error from 2**64
    if -0x8000000000000000 <= v < 0x8000000000000000:
        return int
    return (int, "uint64") if 0 <= v < 0x10000000000000000 else (int, UNTYPED)


def _host_array_kind(a):
    flags = a.flags
    layout = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"
    repeated = _repeated(a) if 0 in a.strides else None
    return (type(a), a.dtype, a.ndim, layout, flags.writeable, flags.aligned, repeated)


def _repeated(a):
    """What a copy to the device makes of an array with a zero stride (numba-cuda-mlir
    types its copy, not the array): a broadcast array's copy is typed 'A' whatever numpy's
    flags say (`x[:, None]` is 'C' to numpy), and one whose repeated core is strided is
    not copied at all (`devicearray.sentry_contiguous`)."""
    if a.size == 0:
        return "empty"
    core = a[tuple(0 if s == 0 else slice(None) for s in a.strides)]
    flags = core.flags
    return "broadcast" if flags.c_contiguous or flags.f_contiguous else "strided broadcast"


def _device_array_kind(a):
    kind = a.__dict__.get("_kbuild_kind")
    if kind is None:
        # numba's DeviceNDArray._numba_type_: broadcast arrays are 'A'.
        flags = a.flags
        broadcast = 0 in a.strides and a.size != 0
        layout = "A" if broadcast else "C" if flags["C_CONTIGUOUS"] else \
            "F" if flags["F_CONTIGUOUS"] else "A"
        kind = a.__dict__["_kbuild_kind"] = ("device", type(a), a.dtype, a.ndim, layout)
    return kind


def _cai_kind(a):
    """numba's reading of a `__cuda_array_interface__`: its layout is numba's own (numba
    compares byte strides with the dtype's width in *bits*, so it calls explicit
    contiguous strides 'A' and some strided arrays 'C' or 'F'); the last item: numba's
    layout claims a contiguity the memory does not have (see `misread`). Should numba's
    function move, the argument is typed by numba on every launch (`UNTYPED`)."""
    desc = a.__cuda_array_interface__
    shape, strides, typestr = desc["shape"], desc.get("strides"), desc["typestr"]
    dtype = _owner_dtype(a, typestr) if "V" in typestr else typestr
    if strides is None:  # numba: 'C' without reading anything else (CuPy's, PyTorch's usual)
        return ("cai", type(a), dtype, len(shape), "C", bool(desc["data"][1]), False)
    try:
        layout = _numba_cai_type(desc).layout
    except Exception:  # noqa: BLE001 - numba's error, raised again by its typing on launch
        return (type(a), UNTYPED)
    wrong = layout != "A" and not _laid_out(shape, strides, _itemsize(typestr), layout)
    return ("cai", type(a), dtype, len(shape), layout, bool(desc["data"][1]), wrong)


def _owner_dtype(a, typestr):
    """A CAI array of records (typestr `|V<n>`) with the record's dtype as its own `dtype`
    (CuPy's): numba-cuda-mlir reads the fields from that dtype
    (`resolve_cuda_array_interface_dtype`), so two such arrays type alike only when their
    dtypes are equal."""
    owner = getattr(a, "dtype", None)
    try:
        return (typestr, None if owner is None else np.dtype(owner))
    except TypeError:  # numba-cuda-mlir then reads the typestr alone
        return (typestr, None)


_numba_cai: list = []


def _numba_cai_type(desc):
    if not _numba_cai:
        from numba.cuda.typing.typeof import _typeof_cuda_array_interface

        _numba_cai.append(_typeof_cuda_array_interface)
    return _numba_cai[0](desc, None)


def _laid_out(shape, strides, itemsize, order) -> bool:
    """Whether memory of `shape` and byte `strides` is contiguous in `order` ('C' or
    'F'), as a kernel compiled for that layout indexes it (extents of 1 aside)."""
    if 0 in shape:
        return True
    pairs = zip(shape, strides) if order == "F" else zip(reversed(shape), reversed(strides))
    step = itemsize
    for n, stride in pairs:
        if n != 1 and stride != step:
            return False
        step *= n
    return True


def contiguous_strides(shape, itemsize, order) -> tuple:
    dims = shape if order == "F" else tuple(reversed(shape))
    strides, step = [], itemsize
    for n in dims:
        strides.append(step)
        step *= n
    return tuple(strides) if order == "F" else tuple(reversed(strides))


_itemsizes: dict = {}


def _itemsize(typestr) -> int:
    size = _itemsizes.get(typestr)
    if size is None:
        size = _itemsizes[typestr] = np.dtype(typestr).itemsize
    return size


def _dlpack_kind(a):
    from cuda.core.utils import StridedMemoryView

    try:
        view = StridedMemoryView.from_dlpack(a, stream_ptr=-1)  # no synchronisation: typing only
    except BufferError:  # numba then reads the CAI, if any
        return _cai_kind(a) if hasattr(type(a), "__cuda_array_interface__") \
            else (type(a), UNTYPED)
    layout = view._layout
    order = "C" if layout.is_contiguous_c else "F" if layout.is_contiguous_f else "A"
    return ("dlpack", type(a), view.dtype, len(view.shape), order, bool(view.readonly))


def argument_types(args, kinds) -> tuple:
    """numba's types of the arguments, as numba's dispatcher would type them (once per kinds)."""
    return tuple(_argument_type(a, k) for a, k in zip(args, kinds))


def _argument_type(value, kind):
    from numba.cuda.typing.typeof import Purpose, typeof

    return typeof(value, Purpose.argument)  # numba's own typing; kinds only key its result


def misread(kinds, declared, *, in_hints: bool = True) -> int | None:
    """The index of the first argument that numba types as contiguous although its memory
    is not (see `_cai_kind`) and that `declared` takes as contiguous: a kernel numba
    would launch with it reads the wrong elements. None when there is none. `in_hints`:
    whether the type of a `cuda.In/Out/InOut` is its wrapped value's (numba-cuda's: the
    CAI's reading, while the array passed is made from its real strides)."""
    for i, (kind, ty) in enumerate(zip(kinds, declared)):
        if _misread(kind, ty, in_hints):
            return i
    return None


def _misread(kind, ty, in_hints: bool) -> bool:
    if type(kind) is not tuple or not kind:
        return False
    if kind[0] == "cai":
        return kind[6] and getattr(ty, "layout", "A") != "A"
    if isinstance(kind[0], type) and issubclass(kind[0], tuple) and len(kind) == 2:
        return any(_misread(k, t, in_hints) for k, t in zip(kind[1], ty))
    if in_hints and _kind_of_type.get(kind[0]) is _arg_hint_kind:
        return _misread(kind[1], ty, in_hints)
    return False


def compatible(actual, declared, types=None) -> bool:
    """Whether numba would pass `actual` where `declared` is expected, without a recompile.
    `types`: the module of their type classes (default numba's; a vendored copy's)."""
    if types is None:
        from numba.core import types

    if actual == declared:
        return True
    if isinstance(actual, types.Number) and isinstance(declared, types.Number):
        return True
    if isinstance(actual, types.Boolean) and isinstance(declared, (types.Boolean, types.Integer)):
        return True
    if isinstance(actual, types.Array) and isinstance(declared, types.Array):
        return (actual.dtype == declared.dtype and actual.ndim == declared.ndim
                and declared.layout in ("A", actual.layout)
                and (actual.mutable or not declared.mutable))
    return False
