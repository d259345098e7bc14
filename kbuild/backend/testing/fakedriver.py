"""A fake CUDA driver: the launch path runs for real down to the calls that need a GPU.

`installed(cc)` swaps the driver calls of `backend.driver` (and those of numba-cuda
that `Project.install()`'s dispatchers and debug kernels reach: the current device,
loading a module, `cuda.core.launch`, reading a debug kernel's error code, and the
device query of numba's `cache=True` index) for
fakes that check what they are handed the way the real calls would, and record it:

- the stream must be a cuda.core Stream (or GraphBuilder), as `cuda.core.launch`
  demands ("Stream or GraphBuilder expected, got int" is the bug this catches);
- the config a cuda.core LaunchConfig with 3-tuples of positive ints, cooperative
  exactly when the kernel's code synchronises the grid;
- the parameters accepted by cuda.core's own ParamHolder, as many as the kernel's
  `.entry` declares, each as large as its `.param` (read from the stored PTX, the
  compiler's word on the kernel's ABI, not from kbuild's packer);
- for a numba-cuda-mlir kernel (its PTX declares `__numba_cuda_mlir_error_code`), every
  array it is handed as that ABI's memref descriptor: allocated and aligned pointers the
  data of an array the fake handed out or was given (a host array's "device" copy, a
  `device_array`, `CudaArray` or `DLPackArray` here), offset 0, its shape, and its
  strides counted in elements; a numba-cuda kernel never gets one.

"Device" memory is host memory: a host array's copy to the device is the array
itself, and its copy back is recorded. Its only door is `kbuild.testing` (a fake
device for users' tests, and for kbuild's own tests and benchmarks:
tests/test_architecture.py keeps them on it); never used by the product itself.
"""

from __future__ import annotations

import contextlib
import os
import ctypes
import re
import time
from dataclasses import dataclass, field

import numpy as np

from .. import driver
from ...artifacts import ptx_unresolved

NUMBA_ABI, MLIR_ABI = "numba-cuda", "numba-cuda-mlir"
_MLIR_MARK = "__numba_cuda_mlir_error_code"  # every numba-cuda-mlir module declares it
_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\(([^)]*)\)", re.S)
_TYPE = re.compile(r"\.[bsuf](\d+)$")  # .u64, .f32, .b8 ... (not .align / .ptr)
_COUNT = re.compile(r"\[(\d+)\]$")


def ptx_entries(ptx: str) -> dict:
    """entry name -> the byte size of each of its parameters, from PTX text."""
    return {name: [_param_size(p) for p in params.split(",") if p.strip()]
            for name, params in _ENTRY.findall(ptx)}


def _param_size(param: str) -> int:
    # `.param .u64 .ptr .align 1 name`, `.param .align 8 .b8 name[16]`, `.param .f32 name`
    tokens = param.split()
    bits = next(int(m.group(1)) for t in tokens if (m := _TYPE.match(t)))
    count = _COUNT.search(tokens[-1])
    return bits // 8 * (int(count.group(1)) if count else 1)


@dataclass
class FakeKernel:
    """What the fake driver loaded: the entry, its parameter sizes, and how it came."""

    entry: str
    params: list
    kind: str  # "cubin" or "ptx" (as handed to the driver)
    ptx_target: str | None  # `.target` of loaded PTX
    cooperative: bool  # the code calls cudadevrt's grid sync
    abi: str = NUMBA_ABI  # whose kernel ABI its parameters follow (MLIR_ABI: memrefs)
    binary: bytes = field(default=b"", repr=False)  # as handed to the driver


@dataclass
class Launch:
    """One recorded launch."""

    kernel: FakeKernel
    grid: tuple
    block: tuple
    shmem: int
    cooperative: bool
    stream_handle: int
    args: tuple


@dataclass
class FakeDriver:
    """The fakes' state: the device's compute capability, the ABI of every kernel
    the store holds (entry -> parameter sizes), and what was loaded and launched."""

    cc: tuple = (8, 0)
    abi: dict = field(default_factory=dict)
    cooperative_entries: set = field(default_factory=set)
    mlir_entries: set = field(default_factory=set)  # entries of numba-cuda-mlir's ABI
    loads: list = field(default_factory=list)
    launches: list = field(default_factory=list)
    copies_back: int = 0
    device_error: int = 0  # the code a debug kernel's launch reports (0: no exception)
    synced_streams: list = field(default_factory=list)
    record: bool = True  # False (timing): a launch only packs as cuda.core would, and counts
    launched: int = 0
    first_launch_at: float | None = None  # time.perf_counter() of the first launch
    # () -> a store to learn from when a kernel of unknown ABI is loaded (one compiled
    # after the fake was installed), or None; see kbuild.testing
    store_for_unseen: object = None

    def learn_store(self, store) -> None:
        """Read every stored PTX's entries: the ABI the fake launch checks against."""
        for _, manifest in store.entries():
            ptx = manifest.get("artifacts", {}).get("ptx")
            if ptx:
                text = store.read_blob(ptx).decode()
                self.abi.update(ptx_entries(text))
                if _synchronises_grid(text):
                    self.cooperative_entries.update(ptx_entries(text))
                if _MLIR_MARK in text:
                    self.mlir_entries.update(ptx_entries(text))

    # -- the fakes -------------------------------------------------------------------

    def current_device(self) -> int:
        return 0

    def device_cc(self, device_id: int) -> tuple:
        assert device_id == 0, f"the fake driver has one device, asked for {device_id}"
        return self.cc

    def load_kernel(self, binary, kind: str, entry: str) -> FakeKernel:
        if isinstance(binary, str):
            # cuda.core's ObjectCode reads a str as the path of a file holding the code
            # (cuModuleLoad): code held in memory must be bytes.
            assert os.path.isfile(binary), ("CUDA_ERROR_FILE_NOT_FOUND: ObjectCode names a "
                                            f"file {binary[:40]!r}...; pass the code as bytes")
            with open(binary, "rb") as fh:
                binary = fh.read()
        data = bytes(binary)
        if entry not in self.abi and self.store_for_unseen is not None:
            store = self.store_for_unseen()
            if store is not None:
                self.learn_store(store)
        if kind == "cubin":
            assert data[:4] == b"\x7fELF", "a cubin must be an ELF image"
            assert entry.encode() in data, f"the cubin has no symbol {entry}"
            target = None
        else:
            assert kind == "ptx", kind
            text = data.decode()
            assert entry in ptx_entries(text), f"the PTX has no .entry {entry}"
            # The driver's PTX JIT links nothing: a call into code that is not there
            # fails to load ("Unresolved extern function").
            missing = ptx_unresolved(data)
            assert not missing, f"ptxas: unresolved extern function {sorted(missing)[0]}"
            target = re.search(r"\.target\s+(\w+)", text).group(1)
        assert entry in self.abi or not self.record, (
            f"no stored PTX declares .entry {entry} (kbuild.testing.fake_device: pass "
            f"store=, the store that holds the kernel)")
        kernel = FakeKernel(entry, self.abi.get(entry), kind, target,
                            entry in self.cooperative_entries,
                            MLIR_ABI if entry in self.mlir_entries else NUMBA_ABI, data)
        self.loads.append(kernel)
        return kernel

    def launch_config(self, grid, block, shmem, cooperative):
        # The real one asks the device whether it can launch cooperatively.
        config = _real["LaunchConfig"](grid=grid, block=block, shmem_size=shmem)
        config.is_cooperative = bool(cooperative)
        return config

    def launch(self, stream, config, kernel, *args) -> None:
        if self.first_launch_at is None:
            self.first_launch_at = time.perf_counter()
        if not self.record:
            _param_holder()(args)  # the host work cuda.core.launch does before the driver
            self.launched += 1
            return
        if not isinstance(stream, (_real["Stream"], _real["GraphBuilder"])):
            raise TypeError(f"Stream or GraphBuilder expected, got {type(stream).__name__}")
        assert isinstance(config, _real["LaunchConfig"]), f"not a LaunchConfig: {config!r}"
        for dims in (config.grid, config.block):
            assert len(dims) == 3 and all(type(d) is int and d > 0 for d in dims), dims
        assert type(config.shmem_size) is int and config.shmem_size >= 0, config.shmem_size
        assert isinstance(kernel, FakeKernel), f"not a loaded kernel: {kernel!r}"
        assert bool(config.is_cooperative) == kernel.cooperative, \
            f"{kernel.entry}: cooperative launch {config.is_cooperative}, kernel needs {kernel.cooperative}"
        self._check_params(kernel, args)
        self.launches.append(Launch(kernel, config.grid, config.block, config.shmem_size,
                                    bool(config.is_cooperative),
                                    int(stream.__cuda_stream__()[1]), args))

    def _check_params(self, kernel, args) -> None:
        _param_holder()(args)  # cuda.core's own packing accepts every value
        sizes = [packed_size(a) for a in args]
        assert sizes == kernel.params, \
            f"{kernel.entry}: parameters of {sizes} bytes, the kernel takes {kernel.params}"
        found = memrefs(args)
        if kernel.abi == MLIR_ABI:
            for at, array in found:
                expected = memref_of(array)
                got = tuple(int(a) for a in args[at:at + len(expected)])
                assert got == expected, (f"{kernel.entry}: parameters {at}.. are {got}, the "
                                         f"memref descriptor of its array is {expected}")
        else:
            assert not found, f"{kernel.entry}: a numba-cuda kernel handed a memref at {found[0][0]}"

    def to_device(self, value, stream, retr):
        from numba.cuda.args import ArgHint

        host = np.asanyarray(value.value if isinstance(value, ArgHint) else value)
        retr.append(lambda: self._copied_back(host))
        return HostView(_known(host))

    def _copied_back(self, host):
        self.copies_back += 1

    def array_view(self, obj, stream):
        return HostView(_known(np.from_dlpack(obj)))

    def sync_stream(self, handle) -> None:
        self.synced_streams.append(handle)

    # numba-cuda's side (install()'s dispatchers, debug kernels)
    def get_cufunc(self, library):
        # numba's CUDACodeLibrary.get_cufunc without the context: loaded once per library
        cufunc = library._cufunc_cache.get(0)
        if cufunc is None:
            code = next(iter(library._cubin_cache.values()), None) or library.get_cubin()
            cufunc = library._cufunc_cache[0] = _FakeCufunc(
                self.load_kernel(code.code, code.code_type, library._entry_name), self)
        return cufunc


def _param_holder():
    global _ParamHolder
    if _ParamHolder is None:
        from cuda.core._kernel_arg_handler import ParamHolder as _ParamHolder
    return _ParamHolder


_ParamHolder = None


# Arrays whose memory a fake launch may be handed, by data pointer (kept alive here).
_arrays: dict = {}
_ARRAYS_LIMIT = 4096


def _known(host: np.ndarray) -> np.ndarray:
    if host.ndim and host.size:
        if len(_arrays) >= _ARRAYS_LIMIT:
            _arrays.clear()
        _arrays[host.ctypes.data] = host
    return host


def memref_of(array: np.ndarray) -> tuple:
    """numba-cuda-mlir's memref descriptor of an array: allocated and aligned pointers,
    offset, sizes, strides in elements."""
    item = array.itemsize
    return (array.ctypes.data, array.ctypes.data, 0, *array.shape,
            *(s // item for s in array.strides))


def memrefs(args) -> list:
    """(index, array) for each place in `args` where a memref descriptor of a known array
    starts: two equal pointers to its data, then offset 0."""
    found = []
    for i in range(len(args) - 2):
        a, b, c = args[i:i + 3]
        if type(a) is int and type(b) is int and type(c) is int and a == b and c == 0 \
                and a in _arrays:
            found.append((i, _arrays[a]))
    return found


def _synchronises_grid(ptx: str) -> bool:
    return "cudaCGSynchronizeGrid" in ptx or "cudaCGGetIntrinsicHandle" in ptx


def packed_size(value) -> int:
    """Bytes cuda.core's ParamHolder lays out for a value (a Python int is a pointer)."""
    if isinstance(value, (int, float)):  # bool too: ParamHolder tests int first
        return 8
    if isinstance(value, complex):
        return 16
    if isinstance(value, np.generic):
        return value.dtype.itemsize
    if isinstance(value, ctypes._SimpleCData):
        return ctypes.sizeof(value)
    raise TypeError(f"no parameter size for {type(value).__name__}")


class _Layout:
    def __init__(self, a):
        self.strides_in_bytes = a.strides
        self.is_contiguous_c = a.flags.c_contiguous
        self.is_contiguous_f = a.flags.f_contiguous


class HostView:
    """What `to_device` gives back (numba: a StridedMemoryView of device memory)."""

    def __init__(self, a):
        self.array, self.ptr, self.shape = a, a.ctypes.data, a.shape
        self.size, self.dtype, self._layout = a.size, a.dtype, _Layout(a)


class _FakeDevice:
    def __init__(self, cc):
        self.id, self.compute_capability = 0, tuple(cc)


class _FakeCufunc:
    """numba's loaded function: the kernel, and the module holding a debug kernel's
    exception globals (the error code the fake device reports, 0: none)."""

    def __init__(self, kernel, fake):
        self.kernel, self.name, self.module = kernel, kernel.entry, _FakeModule(fake)


class _FakeModule:
    def __init__(self, fake):
        self.fake = fake

    def get_global_symbol(self, name):
        value = self.fake.device_error if name.endswith("__errcode__") else 0
        return _FakeGlobal(value), ctypes.sizeof(ctypes.c_int)


class _FakeGlobal:
    def __init__(self, value):
        self.value = value

    def memset(self, byte, count=None, stream=0):
        if stream and not isinstance(stream, _real["Stream"]):
            raise TypeError(f"memset on stream {type(stream).__name__}: a Stream expected")


def _device_to_host(dst, src, size, stream=0):
    ctypes.memmove(dst, ctypes.byref(ctypes.c_int(src.value)), size)


_real: dict = {"LaunchConfig": driver.LaunchConfig, "Stream": driver.Stream,
               "GraphBuilder": driver.GraphBuilder}
_FAKED = ("current_device", "device_cc", "load_kernel", "launch_config", "launch",
          "to_device", "array_view", "sync_stream")


@contextlib.contextmanager
def installed(cc=(8, 0), store=None, record=True):
    """Within this block every driver call of a launch goes to a FakeDriver (yielded).
    `store`: learn its kernels' ABI (needed to check parameters when `record`)."""
    import numba.cuda
    from numba.cuda import codegen, dispatcher
    from numba.cuda.cudadrv import driver as numba_driver

    from .. import launcher

    fake = FakeDriver(cc=tuple(cc), record=record)
    if store is not None:
        fake.learn_store(store)
    saved = {name: getattr(driver, name) for name in _FAKED}
    saved_numba = (dispatcher.launch, dispatcher.LaunchConfig, codegen.CUDACodeLibrary.get_cufunc,
                   numba_driver.device_to_host, numba.cuda.get_current_device,
                   codegen.JITCUDACodegen.magic_tuple)
    try:
        for name in _FAKED:
            setattr(driver, name, getattr(fake, name))
        dispatcher.launch = fake.launch
        dispatcher.LaunchConfig = lambda grid, block, shmem_size, is_cooperative: \
            fake.launch_config(grid, block, shmem_size, is_cooperative)
        codegen.CUDACodeLibrary.get_cufunc = lambda library: fake.get_cufunc(library)
        numba_driver.device_to_host = _device_to_host
        numba.cuda.get_current_device = lambda: _FakeDevice(fake.cc)
        # numba's cache=True index asks the context for the device's cc
        codegen.JITCUDACodegen.magic_tuple = lambda self: ("fake driver", fake.cc)
        launcher.forget_loaded()
        yield fake
    finally:
        for name, value in saved.items():
            setattr(driver, name, value)
        (dispatcher.launch, dispatcher.LaunchConfig, codegen.CUDACodeLibrary.get_cufunc,
         numba_driver.device_to_host, numba.cuda.get_current_device,
         codegen.JITCUDACodegen.magic_tuple) = saved_numba
        launcher.forget_loaded()


def device_array(host: np.ndarray):
    """A numba DeviceNDArray whose "device" memory is `host` (kept alive by it)."""
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    return DeviceNDArray(host.shape, host.strides, host.dtype,
                         gpu_data=_HostMemory(_known(host)))


class _HostMemory:
    def __init__(self, host):
        self.host = host
        self.device_ctypes_pointer = ctypes.c_void_p(host.ctypes.data)


class CudaArray:
    """A foreign device array (as CuPy's or PyTorch's) over host memory:
    only `__cuda_array_interface__`."""

    def __init__(self, host: np.ndarray, stream: int | None = None):
        self.host, self.stream = _known(host), stream

    @property
    def __cuda_array_interface__(self):
        a = self.host
        contiguous = a.flags.c_contiguous
        return {"shape": a.shape, "strides": None if contiguous else a.strides,
                "typestr": a.dtype.str, "data": (a.ctypes.data, False), "version": 3,
                "stream": self.stream}


class DLPackArray:
    """A foreign array that only speaks DLPack."""

    def __init__(self, host: np.ndarray):
        self.host = _known(host)

    def __dlpack__(self, *args, **kwargs):
        return self.host.__dlpack__()

    def __dlpack_device__(self):
        return self.host.__dlpack_device__()
