"""A stand-in GPU for tests: your own launch path, ABI-checked, on a machine with no GPU.

    import numpy as np
    from kbuild import testing

    with testing.fake_device("sm_80", store="build/kbuild-store") as device:
        x = device.array(np.zeros(64, np.float32))
        my_kernel[2, 32](x)        # served by kbuild.enable(), or a Project.load() kernel
        (launch,) = device.launches
        assert (launch.grid, launch.block) == ((2, 1, 1), (32, 1, 1))

Within the block the program runs as it would on a GPU of that architecture, down to the
calls that would reach the CUDA driver: kernels compile for `arch` without asking a driver,
the store's binaries are chosen, loaded, their arguments typed and packed, the stream
converted, and the launch is handed over. Only the driver calls are stand-ins
(`kbuild/backend/testing/fakedriver.py`), and they check what they are given as the driver and
cuda.core would: a cuda.core Stream and LaunchConfig, and parameters exactly as many and
as large as the kernel's PTX `.entry` declares (its ABI, read from the stored PTX: the
compiler's word, not kbuild's packer's). A launch records what was launched; nothing runs
on a device, and device memory is host memory (a kernel's writes do not happen).

The ABI of a kernel is read from the store holding it: `store` (a folder or an open
`Store`), else the store of the `kbuild.enable()` session, read again whenever a kernel
the fake has not seen is loaded (a kernel compiled inside the block). One fake device at a
time per process; not thread-safe.

Two knobs, for programs that only need a device to be there: `record=False` checks and
keeps nothing per launch (a launch is packed as cuda.core would, then only counted:
`device.launch_count`; no ABI is read, so code the store does not hold launches too), and
`compilers` names the compilers pinned to `arch` within the block (default numba-cuda;
add "numba-cuda-mlir" for its kernels, or `()` to leave them unpinned).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .artifacts import arch_cc
from .errors import ConfigError

__all__ = ["FakeDevice", "Launched", "Loaded", "device_array", "fake_device", "memref_of"]


@dataclass(frozen=True)
class Launched:
    """One launch the fake device was handed."""

    entry: str  # the kernel's symbol (its PTX `.entry`)
    kind: str  # how its code was loaded: "cubin", or "ptx" (the driver would JIT it)
    grid: tuple  # (x, y, z)
    block: tuple  # (x, y, z)
    shared_memory: int  # dynamic shared memory, bytes
    cooperative: bool  # a cooperative launch (the kernel synchronises the grid)
    stream: int  # the CUstream handle (0: the default stream)
    args: tuple  # the packed parameters, as cuda.core would pass them to the driver
    abi: str = "numba-cuda"  # whose kernel ABI: "numba-cuda" or "numba-cuda-mlir" (memrefs)


@dataclass(frozen=True)
class Loaded:
    """One kernel the fake device loaded (once per module load)."""

    entry: str  # the kernel's symbol (its PTX `.entry`)
    kind: str  # "cubin", or "ptx" (the driver would JIT it)
    ptx_target: str | None  # a loaded PTX's `.target` ("sm_80"); None for a cubin
    binary: bytes  # the code as handed to the driver


class FakeDevice:
    """The device `fake_device` stands in for: make device arrays, see what was launched."""

    def __init__(self, arch: str, fake):
        self.arch = arch
        self._fake = fake

    @property
    def launches(self) -> list[Launched]:
        """Every launch so far, oldest first."""
        return [Launched(k.kernel.entry, k.kernel.kind, tuple(k.grid), tuple(k.block),
                         k.shmem, k.cooperative, k.stream_handle, tuple(k.args), k.kernel.abi)
                for k in self._fake.launches]

    @property
    def launch_count(self) -> int:
        """How many launches so far, recorded or not (with `record=False`, the only count)."""
        return len(self._fake.launches) if self._fake.record else self._fake.launched

    @property
    def first_launch_at(self) -> float | None:
        """`time.perf_counter()` when the first launch reached the driver (None before):
        where a benchmark's time to the first launch ends, since nothing runs after it."""
        return self._fake.first_launch_at

    @property
    def loaded(self) -> list[str]:
        """The entry of every kernel loaded so far (once per module load), oldest first."""
        return [kernel.entry for kernel in self._fake.loads]

    @property
    def loads(self) -> list[Loaded]:
        """Every kernel loaded so far, with how it came and its code, oldest first."""
        return [Loaded(k.entry, k.kind, k.ptx_target, k.binary) for k in self._fake.loads]

    @property
    def copies_back(self) -> int:
        """How many host arrays were copied back after a launch (numba's `to_device`)."""
        return self._fake.copies_back

    def array(self, host: np.ndarray):
        """A numba device array whose "device" memory is `host` (as `cuda.to_device`)."""
        return device_array(host)

    def foreign_array(self, host: np.ndarray, stream: int | None = None):
        """A device array of another library (CuPy's, PyTorch's): only
        `__cuda_array_interface__`, over `host`."""
        from .backend.testing import fakedriver

        return fakedriver.CudaArray(host, stream)

    def dlpack_array(self, host: np.ndarray):
        """An array of another library that only speaks DLPack, over `host`."""
        from .backend.testing import fakedriver

        return fakedriver.DLPackArray(host)

    def raise_in_kernel(self, code: int = 1) -> None:
        """Make a `debug=True` kernel's next launches report a device-side exception."""
        self._fake.device_error = code


def device_array(host: np.ndarray):
    """A numba device array whose "device" memory is `host`; made without a fake device
    (a module-level table), launched within one."""
    from .backend.testing import fakedriver

    return fakedriver.device_array(host)


def memref_of(host: np.ndarray) -> tuple:
    """The memref descriptor numba-cuda-mlir's ABI packs for an array over `host`
    (allocated and aligned pointers, offset, sizes, strides in elements)."""
    from .backend.testing import fakedriver

    return fakedriver.memref_of(host)


@contextlib.contextmanager
def fake_device(arch: str = "sm_80", store=None, *, record: bool = True,
                compilers=("numba-cuda",)):
    """Stand in for one GPU of `arch` (`"sm_80"`) within the block; yields a `FakeDevice`.
    `store`: the store holding the kernels launched (a folder or a `Store`), for their ABI;
    default: the store of the `kbuild.enable()` session. `record=False`: launches are
    packed and counted only (no ABI check, no store read). `compilers`: the compilers
    (by kbuild's backend names) that compile for `arch` within the block without asking
    a driver; one that is not installed is skipped."""
    from .backend import backends
    from .backend.testing import fakedriver

    try:
        cc = arch_cc(arch)[:2]
    except (AttributeError, TypeError):
        raise ConfigError(f"fake_device: {arch!r} is not an architecture; "
                          f"name one as kbuild.toml does, e.g. 'sm_80'") from None
    unknown = sorted(set(compilers) - set(backends.KNOWN))
    if unknown:
        raise ConfigError(f"fake_device: no compiler named {unknown[0]!r}; name one of "
                          f"{', '.join(sorted(backends.KNOWN))}")
    with fakedriver.installed(cc, record=record) as fake, \
            backends.targeting(compilers, cc, binds=True):
        if record:  # unrecorded launches check no ABI: nothing to read
            fake.store_for_unseen = lambda: _store(store)
        yield FakeDevice(arch, fake)


def _store(store):
    """The store whose kernels' ABI the fake device checks launches against, or None."""
    from .store.local import Store

    if isinstance(store, (str, Path)):
        return Store(store, read_only=True)
    if store is not None:
        return store
    from . import zeroconf

    session = zeroconf.current()
    return session.store if session is not None else None
