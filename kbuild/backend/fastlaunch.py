"""numba's kernel object, launched by kbuild's own launcher where it can be.

A kernel `kbuild.enable()` hands to a dispatcher is numba-cuda's `_Kernel`, rebuilt from
the store (`loader.rebuild_kernel`), so everything numba does with it stays numba's:
typing and overload choice, launch-configuration specialisation, pre-launch callbacks,
`max_cooperative_grid_blocks`, `regs_per_thread`. Only its `launch` changes: numba packs
every argument on every launch in Python (`_prepare_args`); kbuild's launcher
(`launcher`, `packing`) makes a packer once per argument kinds and then only packs and
calls `cuda.core.launch` (README: 4 µs against numba's 34 µs, host side, for saxpy's 4
arguments). Kernels whose launch numba must do itself keep numba's: argument
`extensions`, `debug=True` (device-side exceptions), and arguments of kinds kbuild does
not type once (`kinds.cacheable`).
"""

from __future__ import annotations

from . import launcher


def serve_fast(kernel, blob: str, cubin: bytes, cc: tuple, options: dict):
    """`kernel` (a rebuilt `_Kernel`) launching through kbuild's launcher from now on,
    when its options allow; returns it."""
    if launcher.needs_numba_kernel(options):
        return kernel
    kernel.__class__ = _fast_class()
    kernel._kbuild = _Launch(blob, cubin, cc, kernel)
    return kernel


class _Launch:
    """What kbuild's launch of one kernel needs, made on its first launch."""

    def __init__(self, blob, cubin, cc, kernel):
        self.blob, self.cubin, self.cc = blob, cubin, tuple(cc)
        self.entry, self.cooperative = kernel.entry_name, bool(kernel.cooperative)
        self.argtypes = tuple(kernel.signature.args)
        self.stored = None
        self.bound: dict = {}  # argument kinds -> launch, or None: numba launches them

    def bind(self, kinds):
        if self.stored is None:
            loaded = launcher.load(self.blob, self.cubin, "cubin", self.entry,
                                   self.cooperative, self.cc)
            self.stored = launcher.StoredKernel(loaded, self.argtypes, self.cooperative)
        try:
            return self.stored.bind(kinds)
        except Exception:  # noqa: BLE001 - kinds the packer does not take: numba's launch
            return None


_made: dict = {}


def _fast_class():
    cls = _made.get("class")
    if cls is None:
        from numba.cuda.dispatcher import _Kernel

        class FastKernel(_Kernel):
            """numba's `_Kernel`, launched by kbuild's launcher (see the module)."""

            def launch(self, args, griddim, blockdim, stream=0, sharedmem=0):
                fast = self._kbuild
                kinds = launcher.kinds_of(args)
                try:
                    bound = fast.bound[kinds]
                except KeyError:
                    bound = fast.bind(kinds) if launcher.cacheable(kinds) else None
                    if len(fast.bound) < 1024:
                        fast.bound[kinds] = bound
                except TypeError:  # unhashable kinds
                    bound = None
                if bound is None:
                    return _Kernel.launch(self, args, griddim, blockdim, stream, sharedmem)
                bound(args, (griddim, blockdim, stream, sharedmem))

        cls = _made["class"] = FastKernel
    return cls
