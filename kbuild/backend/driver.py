"""The driver boundary: every call kbuild's launcher makes into the CUDA driver.

The launcher (`backend/launcher.py`) loads, packs and launches through the
names below and nothing else, so a test can swap exactly these for fakes
(`backend/testing/fakedriver.py`) and run the real launch path down to the call that
would reach the GPU. Each function is a thin veneer over cuda.core, or over
numba-cuda where numba owns the state (its primary context, its host<->device
copies), so that stored kernels and numba's own share one context and one
allocator.
"""

from __future__ import annotations

from cuda.bindings import driver as _cu
from cuda.core import LaunchConfig, ObjectCode, Stream
from cuda.core import launch as launch  # the one call that reaches the GPU

try:
    from cuda.core.graph import GraphBuilder  # cuda.core >= 1.0
except ImportError:  # pragma: no cover - older cuda.core
    from cuda.core import GraphBuilder

__all__ = ["GraphBuilder", "LaunchConfig", "Stream", "launch", "current_device", "device_cc",
           "load_kernel", "launch_config", "stream_from_handle", "to_device", "array_view",
           "sync_stream"]


_SUCCESS = _cu.CUresult.CUDA_SUCCESS


def current_device() -> int:
    """The id of the device whose context is current, making numba's primary
    context current first when none is (as numba's own first launch does)."""
    try:
        err, dev = _cu.cuCtxGetDevice()  # on every launch: no import here
    except Exception:  # noqa: BLE001 - no driver at all: numba says so in its words
        err = None
    if err != _SUCCESS:
        from numba.cuda.cudadrv import devices

        return devices.get_context().device.id
    return int(dev)


def device_cc(device_id: int) -> tuple:
    """(major, minor) compute capability of a device."""
    from cuda.core import Device

    return tuple(Device(device_id).compute_capability)


def load_kernel(binary: bytes, kind: str, entry: str):
    """A cuda.core Kernel for `entry` in a cubin or PTX (which the driver JITs).

    cuda.core loads it as a context-independent library; it is loaded once
    per process by the caller's cache."""
    if kind == "cubin":
        code = ObjectCode.from_cubin(binary)
    else:
        code = ObjectCode.from_ptx(binary if isinstance(binary, bytes) else binary.encode())
    return code.get_kernel(entry)


def launch_config(grid: tuple, block: tuple, shmem: int, cooperative: bool):
    """cuda.core's LaunchConfig (a cooperative one asks the device whether it can)."""
    return LaunchConfig(grid=grid, block=block, shmem_size=shmem, is_cooperative=cooperative)


def stream_from_handle(handle: int):
    """A cuda.core Stream borrowing a CUstream handle (0: the legacy default
    stream, exactly as numba's dispatcher converts 0)."""
    return Stream.from_handle(handle)


def to_device(value, stream, retr: list):
    """numba's own copy of a host array (or record, or cuda.In/Out/InOut hint) to
    the device on `stream`; the copy back is appended to `retr`. Returns a view
    with ptr, shape, size, dtype and _layout (a cuda.core StridedMemoryView)."""
    from numba.cuda.args import wrap_arg

    return wrap_arg(value).to_device(retr, stream)


def array_view(obj, stream):
    """A cuda.core StridedMemoryView of a DLPack producer, synchronised to `stream`."""
    from cuda.core.utils import StridedMemoryView

    return StridedMemoryView.from_dlpack(obj, stream_ptr=int(stream.handle))


def sync_stream(handle: int) -> None:
    """Wait for a foreign stream (a __cuda_array_interface__ producer's), as numba does."""
    (err,) = _cu.cuStreamSynchronize(_cu.CUstream(handle))
    if err != _SUCCESS:
        raise RuntimeError(f"cuStreamSynchronize failed: {err}")
