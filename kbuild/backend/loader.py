"""The loader adapter: turn stored artifacts into a numba-cuda kernel ready to launch.

A stored cubin (or PTX, which the driver JITs) becomes numba-cuda's own
`_Kernel`, rebuilt the way numba's cache rebuilds one, but from kbuild's
verified blobs and JSON manifest instead of a pickle. Its code library holds
the binary in its per-architecture cache, so loading it does no typing,
lowering or NVVM compile; numba-cuda's driver layer loads the module into the
current context once per device and launches it (cooperatively when the
manifest says so). `Project.install()` hands these to the user's dispatchers;
kbuild's own launcher (`launcher`) uses them only for debug kernels.

What the store does not hold a program may still ask of a kernel object: its LLVM IR,
its PTX for an arch (`inspect_llvm`, `inspect_asm`, `inspect_lto_ptx`), its typed IR
(`inspect_types`), a debug kernel's exception table. numba compiles the kernel (same
source and options: the key says so) the first time one is asked, and answers from that
compile (`_Recompiled`); what runs is still the stored binary, whose SASS
`inspect_sass` shows.

A cooperative kernel's grid sync calls into cudadevrt, and a kernel with `link=`
files calls into them; numba links both into the cubin, and its stored PTX lacks
them, so such PTX is linked for the device (nvJitLink) before it is loaded.
"""

from __future__ import annotations

from .targeting import library_cc


def rebuild_kernel(manifest: dict, argtypes, binary: bytes, binary_kind: str, device_cc: tuple,
                   options: dict, py_func=None, links=()):
    """A numba-cuda `_Kernel` for one stored target, backed by `binary` (cubin or ptx).

    `options` are the live dispatcher's: launch-time behaviour (argument
    extensions, shared-memory carveout) comes from the user's decorator, which
    cannot be stored as JSON and is keyed anyway. `py_func` (the kernel's Python
    function) is needed for `debug=True` kernels only: see `_ExceptionTable`. `links`:
    the files a PTX must be linked with (see `link_ptx`).
    """
    from cuda.core import ObjectCode
    from numba.core import types
    from numba.core.typing.templates import Signature

    library_class, kernel_class = stored_classes()
    entry = manifest["entry"]
    cooperative = bool(manifest.get("cooperative"))
    if binary_kind == "ptx" and needs_link(binary, cooperative, links):
        binary, binary_kind = link_ptx(binary, device_cc, links, cooperative), "cubin"
    # Bytes, never str: cuda.core reads a str as the path of a file holding the code.
    data = binary if isinstance(binary, bytes) else binary.encode()
    code = ObjectCode.from_cubin(data) if binary_kind == "cubin" else ObjectCode.from_ptx(data)
    library = library_class._rebuild(
        codegen=None, name=entry, entry_name=entry, llvm_strs=None,
        ptx_cache={}, cubin_cache={library_cc(device_cc): code}, linkerinfo_cache={},
        max_registers=None, nvvm_options={}, needs_cudadevrt=cooperative, nrt=False,
        use_cooperative=cooperative, lto=False)
    recompiled = library.recompiled = _Recompiled(py_func, tuple(argtypes), options, device_cc)
    signature = Signature(types.void, tuple(argtypes), recvr=None)
    debug = bool(options.get("debug"))
    from numba.cuda.dispatcher import _Kernel

    kernel = _Kernel._rebuild(  # numba's (its `_rebuild` cannot make a subclass)
        cooperative=cooperative, name=entry, signature=signature, codelibrary=library,
        debug=debug, lineinfo=bool(options.get("lineinfo")),
        call_helper=_ExceptionTable(recompiled) if debug else None,
        extensions=list(options.get("extensions") or []),
        shared_memory_carveout=None, launch_config_sensitive=False)
    kernel.__class__ = kernel_class
    # What numba's constructor sets and its `_rebuild` does not (the dispatcher reads
    # `objectmode` of every overload when it converts arguments).
    kernel.objectmode, kernel.py_func, kernel.argtypes = False, py_func, tuple(argtypes)
    kernel.launch_bounds = options.get("launch_bounds")
    carveout = options.get("shared_memory_carveout")
    if carveout is not None:
        kernel.shared_memory_carveout = kernel._parse_carveout(carveout)
    return kernel


_classes: dict = {}


def stored_classes():
    """(code library, kernel) classes of numba-cuda's, for a kernel loaded from the store:
    what a program inspects comes from numba's own compile, made when first asked."""
    if not _classes:
        from numba.cuda.codegen import CUDACodeLibrary
        from numba.cuda.dispatcher import _Kernel

        class StoredCodeLibrary(CUDACodeLibrary):
            """The stored binary for the device; IR, PTX, LTO-IR and other archs'
            binaries from numba's compile of the kernel (`_Recompiled`)."""

            recompiled = None

            def _numba(self):
                return self.recompiled.kernel().library

            @property
            def llvm_strs(self):
                return self._numba().llvm_strs

            def get_asm_strs(self, cc=None):
                return self._numba().get_asm_strs(cc=cc)

            def get_lto_ptx(self, cc=None):
                return self._numba().get_lto_ptx(cc=cc)

            def get_ltoir(self, cc=None):
                return self._numba().get_ltoir(cc=cc)

            def get_cubin(self, cc=None):
                stored = self._cubin_cache.get(self._ensure_cc(cc))
                return stored if stored else self._numba().get_cubin(cc=cc)

            def get_linkerinfo(self, cc):
                try:
                    return super().get_linkerinfo(cc)
                except KeyError:
                    return self._numba().get_linkerinfo(cc)

        class StoredKernel(_Kernel):
            """numba's `_Kernel` loaded from kbuild's store (see the module)."""

            @property
            def type_annotation(self):
                if self._type_annotation is None:
                    self._type_annotation = self._codelibrary.recompiled.kernel() \
                        .type_annotation
                return self._type_annotation

            def inspect_types(self, file=None):
                self.type_annotation  # noqa: B018 - made when first asked
                return super().inspect_types(file=file)

        _classes.update(library=StoredCodeLibrary, kernel=StoredKernel)
    return _classes["library"], _classes["kernel"]


def needs_link(ptx, cooperative: bool, links=()) -> bool:
    """Whether a stored PTX must be linked before it loads: a grid sync (cudadevrt), link
    files, or several modules (a debug compile's, one per function)."""
    from ..artifacts import ptx_modules

    return bool(cooperative or links) or len(ptx_modules(_bytes(ptx))) > 1


def link_ptx(ptx: bytes, device_cc: tuple, files=(), cudadevrt: bool = False) -> bytes:
    """A cubin for `device_cc` of a stored PTX and what its cubin was linked with: the
    kernel's link files (`link=`, declare_device) and, for a grid sync, cudadevrt. numba's
    PTX lacks both; they are linked as numba links them (nvJitLink, else the driver's
    linker), .cu files compiled for the device by NVRTC. Each module of the PTX is added
    alone, as numba adds a debug compile's."""
    from numba.cuda.cudadrv.driver import _Linker
    from numba.cuda.cudadrv.libs import get_cudalib

    from ..artifacts import ptx_modules

    # With link-time optimisation NVRTC makes LTO-IR of a .cu file, which needs no
    # driver; its PTX output asks the driver for its version first.
    linker = _Linker(max_registers=None, cc=tuple(device_cc[:2]), lto=bool(files))
    for module in ptx_modules(_bytes(ptx)):
        linker.add_ptx(module)
    for path in files:
        linker.add_file_guess_ext(path)
    if cudadevrt:
        linker.add_file_guess_ext(get_cudalib("cudadevrt", static=True))
    cubin = linker.complete()
    return bytes(getattr(cubin, "code", cubin))


def _bytes(code) -> bytes:
    return code if isinstance(code, bytes) else code.encode()


class _Recompiled:
    """numba's own compile of a stored kernel (same source, the key says so; same
    options), made the first time a program asks what the store does not hold."""

    def __init__(self, py_func, argtypes, options, cc):
        self.py_func, self.argtypes, self.options, self.cc = py_func, argtypes, dict(options), cc
        self._kernel = None

    def kernel(self):
        if self._kernel is None:
            if self.py_func is None:
                raise RuntimeError("this kernel was loaded from kbuild's store without its "
                                   "Python function: numba cannot compile it to answer")
            from numba.cuda.dispatcher import _Kernel

            from .targeting import targeting

            with targeting(tuple(self.cc[:2])):
                self._kernel = _Kernel(self.py_func, self.argtypes, **self.options)
        return self._kernel


class _ExceptionTable:
    """numba's call helper for a debug kernel, made when a device-side exception needs it.

    A debug kernel reports an exception as a code; the code's class, arguments and
    source location live in the compiling process's call helper, which holds Python
    classes and cannot be stored as JSON. numba's table of its own compile of the kernel
    (`_Recompiled`, made only when a launch raised), whose codes are numbered in the same
    order, names the exception.
    """

    def __init__(self, recompiled: _Recompiled):
        self.recompiled = recompiled

    def get_exception(self, code):
        return self.recompiled.kernel().call_helper.get_exception(code)
