"""A stored entry's binary as zero-config hands it to a dispatcher, for either backend.

The bytes to load on the current device and the name they are loaded under in this
process (`launcher.load` keeps one module per name): the stored cubin (of the device's
arch, or of its arch-specific target: `artifacts.cubin_runs_on`); for a target
built for another arch (NUMBA_FORCE_CUDA_CC), its PTX assembled for the device; a debug
or lineinfo binary with the program's own folders put back (`debugpaths`), under a name
of its own, so that two checkouts in one process load their own.
"""

from __future__ import annotations

from . import debugpaths


def stored_binary(manifest: dict, read_blob, device_arch: str, device_cc: tuple,
                  source_roots) -> tuple[bytes, str]:
    """(binary, loaded-as name) of entry `manifest` for a device of `device_arch`: its
    cubin when that runs on the device (built for the device's arch or for its
    arch-specific target, 'sm_90a' on an sm_90, as numba-cuda's JIT builds it)."""
    from ..artifacts import cubin_runs_on

    blob = manifest["artifacts"]["cubin"]
    if cubin_runs_on(manifest["arch"], device_arch):
        stored = read_blob(blob)
    else:  # NUMBA_FORCE_CUDA_CC: built for another arch; its PTX assembled for this one
        from .launcher import device_binary

        blob = manifest["artifacts"]["ptx"]
        stored = device_binary(manifest, read_blob(blob), device_cc)
        blob = f"{blob}@{device_arch}"
    binary, located = debugpaths.located(stored, source_roots)
    return binary, f"{blob}@{located}" if located else blob
