"""The loader adapter: turn stored artifacts into a numba-cuda kernel ready to launch.

A stored cubin (or PTX, which the driver JITs) becomes numba-cuda's own
`_Kernel`, rebuilt the way numba's cache rebuilds one, but from kbuild's
verified blobs and JSON manifest instead of a pickle. Its code library holds
the binary in its per-architecture cache, so loading it does no typing,
lowering or NVVM compile; numba-cuda's driver layer loads the module into the
current context once per device and launches it (cooperatively when the
manifest says so).
"""

from __future__ import annotations


def library_cc(cc: tuple) -> tuple:
    """The key numba-cuda's code library uses for a device's binary cache."""
    cc = tuple(cc[:2])
    return cc + ("a" if cc >= (9, 0) else "",)


def rebuild_kernel(manifest: dict, argtypes, binary: bytes, binary_kind: str, device_cc: tuple,
                   options: dict):
    """A numba-cuda `_Kernel` for one stored target, backed by `binary` (cubin or ptx).

    `options` are the live dispatcher's: launch-time behaviour (argument
    extensions, shared-memory carveout) comes from the user's decorator, which
    cannot be stored as JSON and is keyed anyway.
    """
    from cuda.core import ObjectCode
    from numba.core import types
    from numba.core.typing.templates import Signature
    from numba.cuda.codegen import CUDACodeLibrary
    from numba.cuda.dispatcher import _Kernel

    entry = manifest["entry"]
    cooperative = bool(manifest.get("cooperative"))
    code = ObjectCode.from_cubin(binary) if binary_kind == "cubin" \
        else ObjectCode.from_ptx(binary.decode() if isinstance(binary, bytes) else binary)
    library = CUDACodeLibrary._rebuild(
        codegen=None, name=entry, entry_name=entry, llvm_strs=[],
        ptx_cache={}, cubin_cache={library_cc(device_cc): code}, linkerinfo_cache={},
        max_registers=None, nvvm_options={}, needs_cudadevrt=cooperative, nrt=False,
        use_cooperative=cooperative, lto=False)
    signature = Signature(types.void, tuple(argtypes), recvr=None)
    kernel = _Kernel._rebuild(
        cooperative=cooperative, name=entry, signature=signature, codelibrary=library,
        debug=False, lineinfo=bool(options.get("lineinfo")), call_helper=None,
        extensions=list(options.get("extensions") or []),
        shared_memory_carveout=None, launch_config_sensitive=False)
    carveout = options.get("shared_memory_carveout")
    if carveout is not None:
        kernel.shared_memory_carveout = kernel._parse_carveout(carveout)
    return kernel
