"""numba-cuda as a `base.Backend`: the modules of `backend/` behind one object.

The compiler adapter (`compiler`, `targeting`, `reproducible`, `lto`), the
observation hooks (`observe`), the object model (`objectmodel`), the toolchain
facts (`toolchain`) and the launcher (`launcher`, `kinds`, `packing`, `loader`)
are numba-cuda's; this names them as the interface the build, the launcher and
keying ask.
"""

from __future__ import annotations

from .backends import NUMBA_CUDA_NAME
from .base import Backend, Features, TypeNamespace, eval_signature, type_namespace
from .dispatch import NumbaDispatchers


class NumbaCuda(NumbaDispatchers, Backend):
    """numba-cuda: its front end, NVVM, nvJitLink; separately compiled device functions."""

    name = NUMBA_CUDA_NAME
    features = Features(
        separate_compilation="device functions as LTO-IR objects of their own, relinked "
                             "on edit (README: Separate compilation)",
        debug=True, cooperative_launch=True, simulator=True)

    @property
    def objects(self):
        from .objectmodel import NUMBA_CUDA

        return NUMBA_CUDA

    def owns(self, obj) -> bool:
        fn = self.objects.function_of(obj)
        return fn is not None and type(obj).__module__.partition(".")[0] == "numba"

    def toolchain(self) -> dict:
        from .toolchain import toolchain

        return toolchain()

    def codegen_config(self) -> dict:
        from .toolchain import codegen_config

        return codegen_config()

    def process_config(self) -> dict:
        from .compiletime import process_config

        return process_config()

    def targeting(self, cc: tuple, binds: bool = False):
        from .targeting import targeting

        return targeting(cc, binds)

    def parse_signature(self, text: str, module) -> tuple:
        from numba import from_dtype
        from numba.core import sigutils, types

        # Read name by name: the same namespace as `signature_namespace(module)`.
        names = TypeNamespace(module, types, from_dtype)
        sig = eval_signature(text, names)
        argtypes, restype = sigutils.normalize_signature(sig)
        return tuple(argtypes), None if restype in (None, types.void, types.none) else restype

    def signature_namespace(self, module) -> dict:
        from numba import from_dtype
        from numba.core import types

        return type_namespace(module, types, from_dtype)

    def compile(self, kernel, argtypes, cc: tuple, *, device_functions=(), stable_ids=None,
                apart=None, observer=None, outputs=None, source_roots=()):
        from .compiler import compile_kernel

        return compile_kernel(kernel, argtypes, cc, device_functions, stable_ids, apart,
                              observer, outputs, source_roots)

    def relink(self, ltoirs, cc: tuple, *, max_registers=None, outputs=None, entry: str = "",
               flags=(), lto: bool = False):
        from .lto import link

        return link(ltoirs, cc, max_registers=max_registers, outputs=outputs, entry=entry,
                    flags=flags, lto=lto)

    def typing_registries(self) -> list:
        from .registry import registries

        return registries()

    def entry_expectation(self, kernel) -> dict:
        from .binaries import kernel_entry_prefix

        prefix = kernel_entry_prefix(kernel)
        return {"entry_prefix": prefix} if prefix else {}

    def launcher(self):
        from . import launcher

        return launcher

    def dispatcher_kernel(self, request, manifest: dict, read_blob, device_arch: str,
                          device_cc: tuple, source_roots, for_launch: bool):
        # numba-cuda's own `_Kernel`, rebuilt from the store, launching through kbuild's
        # launcher (`launcher.serve_fast`).
        from .dispatch import mark_sensitive
        from .launcher import serve_fast
        from .loader import rebuild_kernel
        from .served import stored_binary

        binary, blob = stored_binary(manifest, read_blob, device_arch, device_cc, source_roots)
        kernel = rebuild_kernel(manifest, request.argtypes, binary, "cubin", device_cc,
                                request.options, py_func=request.py_func)
        kernel = serve_fast(kernel, blob, binary, device_cc, request.options)
        if for_launch:
            mark_sensitive(kernel)
        return kernel

    def rebuilt_kernel(self, manifest: dict, argtypes, binary: bytes, binary_kind: str,
                       device_cc: tuple, options: dict, py_func=None, links=()):
        # numba-cuda's own `_Kernel`: debug kernels launch through it.
        from .loader import rebuild_kernel

        return rebuild_kernel(manifest, argtypes, binary, binary_kind, device_cc, options,
                              py_func=py_func, links=links)

    def serve(self, resolver) -> None:
        from .dispatch import install

        install(resolver)

    def stop_serving(self) -> None:
        from .dispatch import uninstall, uninstall_recorder

        uninstall()
        uninstall_recorder()

    def record_launches(self, record) -> None:
        from .dispatch import install_recorder

        install_recorder(record)

    def compile_arch(self, device_arch: str) -> str:
        from .launcher import compile_arch

        return compile_arch(device_arch)

    def current_arch(self) -> str:
        from .launcher import current_device, device_arch

        return device_arch(current_device())

    def prepare(self) -> None:
        from .compiler import prepare

        prepare()

    def forget_compiled(self, device_functions=(), objects=None) -> None:
        from . import lto

        lto.forget(lto.made_keys() if objects is None else objects)
        for disp in device_functions:
            self.forget_code(disp)

    def simulating(self) -> bool:
        from .targeting import simulating

        return simulating()


BACKEND = NumbaCuda()
