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
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import arch_cc
from .errors import ConfigError

__all__ = ["FakeDevice", "Launched", "fake_device"]


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


class FakeDevice:
    """The device `fake_device` stands in for: make device arrays, see what was launched."""

    def __init__(self, arch: str, fake):
        self.arch = arch
        self._fake = fake

    @property
    def launches(self) -> list[Launched]:
        """Every launch so far, oldest first."""
        return [Launched(k.kernel.entry, k.kernel.kind, tuple(k.grid), tuple(k.block),
                         k.shmem, k.cooperative, k.stream_handle, tuple(k.args))
                for k in self._fake.launches]

    @property
    def loaded(self) -> list[str]:
        """The entry of every kernel loaded so far (once per module load), oldest first."""
        return [kernel.entry for kernel in self._fake.loads]

    @property
    def copies_back(self) -> int:
        """How many host arrays were copied back after a launch (numba's `to_device`)."""
        return self._fake.copies_back

    def array(self, host: np.ndarray):
        """A numba device array whose "device" memory is `host` (as `cuda.to_device`)."""
        from .backend.testing import fakedriver

        return fakedriver.device_array(host)

    def foreign_array(self, host: np.ndarray, stream: int | None = None):
        """A device array of another library (CuPy's, PyTorch's): only
        `__cuda_array_interface__`, over `host`."""
        from .backend.testing import fakedriver

        return fakedriver.CudaArray(host, stream)

    def raise_in_kernel(self, code: int = 1) -> None:
        """Make a `debug=True` kernel's next launches report a device-side exception."""
        self._fake.device_error = code


@contextlib.contextmanager
def fake_device(arch: str = "sm_80", store=None):
    """Stand in for one GPU of `arch` (`"sm_80"`) within the block; yields a `FakeDevice`.
    `store`: the store holding the kernels launched (a folder or a `Store`), for their ABI;
    default: the store of the `kbuild.enable()` session."""
    from .backend.testing import fakedriver
    from .backend.backends import DEFAULT, get

    try:
        cc = arch_cc(arch)[:2]
    except (AttributeError, TypeError):
        raise ConfigError(f"fake_device: {arch!r} is not an architecture; "
                          f"name one as kbuild.toml does, e.g. 'sm_80'") from None
    with fakedriver.installed(cc) as fake, get(DEFAULT).targeting(cc):
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
