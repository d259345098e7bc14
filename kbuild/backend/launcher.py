"""kbuild's own launcher: a stored cubin or PTX, loaded and launched through cuda.core.

numba's dispatcher types every argument on every launch (then looks the types
up among its overloads). A kernel launched from the store has declared
signatures, so arguments are typed once per kind (`kinds`), which picks the
signature and makes a packer (`packing`); afterwards a launch reads the kinds,
finds the packer in a dict, packs, and calls `cuda.core.launch` with a
LaunchConfig made once per (grid, block, shared memory) and the stream
converted to the cuda.core Stream it needs. Every driver call goes through
`backend.driver`, the boundary a test replaces with fakes.

Kernels built with `debug=True` (device-side exceptions) or with argument
`extensions` launch through numba's own `_Kernel` rebuilt by `loader`, with
the stream converted here.
"""

from __future__ import annotations

import numbers

from . import driver
from .kinds import argument_types, cacheable, compatible, kinds_of, misread
from .packing import make_packer

__all__ = ["argument_types", "cacheable", "compatible", "kinds_of", "misread", "core_stream",
           "load",
           "StoredKernel", "NumbaKernel", "needs_numba_kernel", "device_arch", "current_device",
           "install"]

_CACHE_LIMIT = 1024  # distinct launch configurations / streams remembered per process


# -- launch configuration and streams ----------------------------------------------

def normalize_dims(griddim, blockdim) -> tuple:
    """(grid, block) as 3-tuples of ints; numba's rules and messages."""
    if griddim is None or blockdim is None:
        raise ValueError("must specify launch configuration")
    return _dim3(griddim, "griddim"), _dim3(blockdim, "blockdim")


def _dim3(dim, name) -> tuple:
    dims = list(dim) if isinstance(dim, (tuple, list)) else [dim]
    if len(dims) > 3:
        raise ValueError(f"{name} must be a sequence of 1, 2 or 3 integers, got {dims!r}")
    if not all(isinstance(v, numbers.Integral) for v in dims):
        raise TypeError(f"{name} must be a sequence of integers, got {dims!r}")
    return tuple(int(v) for v in dims) + (1,) * (3 - len(dims))


_streams: dict = {}  # CUstream handle -> cuda.core Stream borrowing it


def core_stream(stream):
    """The cuda.core Stream (or GraphBuilder) `cuda.core.launch` needs, from any
    stream form a user passes: 0 / None (the default stream, as numba), a numba
    Stream, a cuda.core Stream, or any object with `__cuda_stream__` (CuPy, PyTorch)."""
    if isinstance(stream, driver.Stream):
        return stream
    if stream is None or (type(stream) is int and stream == 0):
        return _borrowed(0)
    if isinstance(stream, driver.GraphBuilder):
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is None and isinstance(stream, numbers.Integral) and stream == 0:
        return _borrowed(0)  # False, numpy's 0: numba takes any false value
    if protocol is None:
        raise TypeError(f"stream must be 0, None, a numba or cuda.core Stream, or an object "
                        f"with __cuda_stream__; got {type(stream).__name__} {stream!r}")
    version, handle = protocol() if callable(protocol) else protocol
    if version != 0:
        raise TypeError(f"{type(stream).__name__}.__cuda_stream__ gave protocol version "
                        f"{version!r}; only version 0 is known")
    return _borrowed(int(handle))


def _borrowed(handle: int):
    stream = _streams.get(handle)
    if stream is None:
        if len(_streams) >= _CACHE_LIMIT:
            _streams.clear()
        stream = _streams[handle] = driver.stream_from_handle(handle)
    return stream


class _Configs:
    """LaunchConfig objects by (grid, block, shared memory): made once, reused."""

    def __init__(self, cooperative: bool):
        self.cooperative = cooperative
        self._made: dict = {}

    def get(self, griddim, blockdim, sharedmem):
        try:
            return self._made[(griddim, blockdim, sharedmem)]
        except (KeyError, TypeError):  # new, or a list (unhashable) given as a dimension
            grid, block = normalize_dims(griddim, blockdim)
            made = driver.launch_config(grid, block, int(sharedmem or 0), self.cooperative)
            if len(self._made) >= _CACHE_LIMIT:
                self._made.clear()
            try:
                self._made[(griddim, blockdim, sharedmem)] = made
            except TypeError:
                pass
            return made


def split_config(config: tuple):
    """(griddim, blockdim, stream, sharedmem) from `kernel[...]`'s 2, 3 or 4 items."""
    n = len(config)
    return (config[0], config[1], config[2] if n > 2 else 0, config[3] if n > 3 else 0)


# -- loading and launching --------------------------------------------------------------

_loaded: dict = {}  # (blob id, binary kind, entry, device cc) -> cuda.core Kernel


def load(blob_id: str, binary: bytes, kind: str, entry: str, cooperative: bool, cc: tuple,
         links=()):
    """The kernel in a stored binary, loaded once per process. PTX that calls code its
    cubin was linked with (cudadevrt for a grid sync, `links` files), or that is several
    modules, is linked for the device first, as numba links it; plain PTX is JIT-compiled
    by the driver."""
    key = (blob_id, kind, entry, tuple(cc), tuple(links))
    kernel = _loaded.get(key)
    if kernel is None:
        from .loader import link_ptx, needs_link

        if kind == "ptx" and needs_link(binary, cooperative, links):
            binary, kind = link_ptx(binary, cc, links, cooperative), "cubin"
        kernel = _loaded[key] = driver.load_kernel(binary, kind, entry)
    return kernel


class StoredKernel:
    """One stored (kernel, signature) loaded for one device: `bind(kinds)` gives the launch.
    `field_maker`: how one argument is laid out (None: numba-cuda's ABI, see `packing`)."""

    def __init__(self, kernel, argtypes, cooperative: bool, field_maker=None):
        self.kernel = kernel
        self.argtypes = tuple(argtypes)
        self.cooperative = cooperative
        self.configs = _Configs(cooperative)
        self.field_maker = field_maker

    def bind(self, kinds):
        return _Bound(self, make_packer(self.argtypes, kinds, self.field_maker))


class _Bound:
    """The launch of one stored kernel for one kind of arguments: the hot path."""

    __slots__ = ("configs", "kernel", "pack")

    def __init__(self, stored, pack):
        self.configs, self.kernel, self.pack = stored.configs, stored.kernel, pack

    def __call__(self, args, config):
        griddim, blockdim, stream, sharedmem = split_config(config)
        launch_config = self.configs.get(griddim, blockdim, sharedmem)
        stream = core_stream(stream)
        retr = []
        driver.launch(stream, launch_config, self.kernel, *self.pack(args, stream, retr))
        for writeback in retr:
            writeback()


class NumbaKernel:
    """A stored kernel rebuilt as numba's `_Kernel` (debug kernels, argument extensions):
    numba packs and reports device-side exceptions; the stream is converted here."""

    def __init__(self, kernel):
        self.kernel = kernel

    def bind(self, kinds):
        return self.launch

    def launch(self, args, config):
        griddim, blockdim, stream, sharedmem = split_config(config)
        grid, block = normalize_dims(griddim, blockdim)
        self.kernel.launch(args, grid, block, core_stream(stream), sharedmem)


def install(dispatcher, found, argtypes, device_cc: tuple, options: dict) -> None:
    """Hand a stored kernel (`found`: launch.Found) to the user's numba-cuda dispatcher as
    a compiled overload (`Project.install()`): numba then types and chooses it as its own,
    and a cubin's launches go through kbuild's packer (`serve_fast`: on an H100, numba's
    own launch of a rebuilt kernel cost 16-158 us against kbuild's 8-22 us)."""
    from .loader import rebuild_kernel

    kernel = rebuild_kernel(found.manifest, argtypes, found.binary, found.kind, device_cc,
                            options, py_func=getattr(dispatcher, "py_func", None),
                            links=found.links)
    if found.kind == "cubin":
        kernel = serve_fast(kernel, found.manifest["artifacts"]["cubin"], found.binary,
                            device_cc, options)
    dispatcher.add_overload(kernel, tuple(argtypes))


def needs_numba_kernel(options: dict) -> bool:
    """Whether a kernel with these decorator options must launch through numba's `_Kernel`."""
    return bool(options.get("debug") or options.get("extensions"))


_archs: dict = {}  # device id -> "sm_XY"


def device_arch(device_id: int) -> str:
    """The arch name of a device (asked once per device per process)."""
    arch = _archs.get(device_id)
    if arch is None:
        major, minor = driver.device_cc(device_id)[:2]
        arch = _archs[device_id] = f"sm_{major}{minor}"
    return arch


def compile_arch(device_arch: str) -> str:
    """The arch numba-cuda's JIT compiles for on a device of `device_arch`: the one
    NUMBA_FORCE_CUDA_CC names when it is set (numba gives NVVM that arch and assembles its
    PTX for the device: see `device_binary`), else the device's arch-specific target from
    9.0 on ('sm_90' -> 'sm_90a', see `targeting.jit_cc`), else the device's own."""
    from numba.cuda import config

    from ..artifacts import arch_cc
    from .targeting import jit_cc

    forced = config.FORCE_CUDA_CC
    cc = tuple(forced) if forced else jit_cc(arch_cc(device_arch)[:2])
    return f"sm_{cc[0]}{cc[1]}{cc[2] if len(cc) > 2 else ''}"


def device_binary(manifest: dict, ptx: bytes, device_cc: tuple) -> bytes:
    """A cubin for the device of a target built for another arch (NUMBA_FORCE_CUDA_CC):
    its PTX assembled for `device_cc` as numba assembles it (`_Linker` for the device's
    cc, cudadevrt for a grid sync). A PTX that calls code of linked files cannot be
    assembled alone (LaunchError: numba compiles it)."""
    from ..artifacts import ptx_unresolved
    from ..errors import KbuildError
    from .loader import link_ptx

    cooperative = bool(manifest.get("cooperative"))
    if ptx_unresolved(ptx) and not cooperative:  # a grid sync's calls are cudadevrt's
        raise KbuildError("it links files, and NUMBA_FORCE_CUDA_CC asks for another arch's "
                          "PTX than the device's")
    return link_ptx(ptx, device_cc, (), cooperative)



def current_device() -> int:
    """The current device's id (numba's primary context is made current if none is)."""
    return driver.current_device()


def forget_loaded() -> None:
    """Drop what this process loaded and learned of its devices (tests switch fake devices)."""
    _loaded.clear()
    _archs.clear()


# -- numba's kernel object, launched by kbuild's launcher ------------------------------
# A kernel `kbuild.enable()` hands to a dispatcher is numba-cuda's `_Kernel`, rebuilt from
# the store (`loader.rebuild_kernel`), so everything numba does with it stays numba's:
# typing and overload choice, launch-configuration specialisation, pre-launch callbacks,
# `max_cooperative_grid_blocks`, `regs_per_thread`. Only its `launch` changes: numba packs
# every argument on every launch in Python (`_prepare_args`); kbuild's launcher
# (this module, `packing`) makes a packer once per argument kinds and then only packs and
# calls `cuda.core.launch` (README: 4 µs against numba's 34 µs, host side, for saxpy's 4
# arguments). Kernels whose launch numba must do itself keep numba's: argument
# `extensions`, `debug=True` (device-side exceptions), and arguments of kinds kbuild does
# not type once (`kinds.cacheable`). `install()` serves stored cubins the same way.

def serve_fast(kernel, blob: str, cubin: bytes, cc: tuple, options: dict):
    """`kernel` (a rebuilt `_Kernel`) launching through kbuild's launcher from now on,
    when its options allow; returns it."""
    if needs_numba_kernel(options):
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
            loaded = load(self.blob, self.cubin, "cubin", self.entry,
                                   self.cooperative, self.cc)
            self.stored = StoredKernel(loaded, self.argtypes, self.cooperative)
        try:
            return self.stored.bind(kinds)
        except Exception:  # noqa: BLE001 - kinds the packer does not take: numba's launch
            return None


_made: dict = {}


def _fast_class():
    cls = _made.get("class")
    if cls is None:
        from numba.cuda.dispatcher import _Kernel

        from .loader import stored_classes

        class FastKernel(stored_classes()[1]):
            """numba's `_Kernel` loaded from the store, launched by kbuild's launcher (see
            the module)."""

            def launch(self, args, griddim, blockdim, stream=0, sharedmem=0):
                fast = self._kbuild
                kinds = kinds_of(args)
                try:
                    bound = fast.bound[kinds]
                except KeyError:
                    bound = fast.bind(kinds) if cacheable(kinds) else None
                    if len(fast.bound) < 1024:
                        fast.bound[kinds] = bound
                except TypeError:  # unhashable kinds
                    bound = None
                if bound is None:
                    return _Kernel.launch(self, args, griddim, blockdim, stream, sharedmem)
                bound(args, (griddim, blockdim, stream, sharedmem))

        cls = _made["class"] = FastKernel
    return cls
