"""numba-cuda-mlir as a `base.Backend`."""

from __future__ import annotations

from numba_cuda_mlir.descriptor import MLIRDispatcher
from numba_cuda_mlir.numba_cuda import types as mtypes

from ...keying.values import add_type_vocabulary
from ..backends import MLIR_NAME
from ..base import Backend, Features, TypeNamespace, eval_signature, type_namespace
from ..dispatch import NumbaDispatchers
from .objects import MLIR_OBJECTS, registries

add_type_vocabulary(mtypes)


class NumbaCudaMlir(NumbaDispatchers, Backend):
    """numba-cuda-mlir: numba's front end vendored, lowered through MLIR, NVVM, nvJitLink
    (its dispatchers are numba's, vendored: numba-cuda's dispatcher helpers serve them)."""

    name = MLIR_NAME
    features = Features(
        separate_compilation="none: device functions are compiled into their callers; "
                             "declare_device code is linked by each kernel's compile",
        debug=False, cooperative_launch=True, simulator=False)

    @property
    def objects(self):
        return MLIR_OBJECTS

    def owns(self, obj) -> bool:
        return isinstance(obj, MLIRDispatcher)

    def toolchain(self) -> dict:
        from .toolchain import toolchain

        return toolchain()

    def codegen_config(self) -> dict:
        from .toolchain import codegen_config

        return codegen_config()

    def targeting(self, cc: tuple, binds: bool = False):
        from .nodriver import pinned_target

        return pinned_target(cc)

    def parse_signature(self, text: str, module) -> tuple:
        from numba_cuda_mlir.numba_cuda.core import sigutils
        from numba_cuda_mlir.numba_cuda.np.numpy_support import from_dtype

        # Read name by name: the same namespace as `signature_namespace(module)`.
        names = TypeNamespace(module, mtypes, from_dtype)
        sig = eval_signature(text, names)
        argtypes, restype = sigutils.normalize_signature(sig)
        return tuple(argtypes), None if restype in (None, mtypes.void, mtypes.none) else restype

    def signature_namespace(self, module) -> dict:
        from numba_cuda_mlir.numba_cuda.np.numpy_support import from_dtype

        return type_namespace(module, mtypes, from_dtype)

    def compile(self, kernel, argtypes, cc: tuple, *, device_functions=(), stable_ids=None,
                apart=None, observer=None, outputs=None, source_roots=()):
        # `stable_ids` and `apart` are numba-cuda's separate compilation, `outputs` its
        # early cutoff of links and PTX-to-cubin steps, `source_roots` its relocatable
        # debug paths (debugpaths): not here.
        from .compiler import compile_kernel

        return compile_kernel(kernel, argtypes, cc, device_functions, observer)

    def typing_registries(self) -> list:
        return registries()

    def entry_expectation(self, kernel) -> dict:
        # Its entry symbols name no module (`_Z5saxpy...`): the entry records its backend.
        return {"backend": MLIR_NAME}

    def launcher(self):
        from . import launching

        return launching

    def dispatcher_kernel(self, request, manifest: dict, read_blob, device_arch: str,
                          device_cc: tuple, source_roots, for_launch: bool):
        # Its dispatcher loads the cubin itself, as its own cache's result.
        from ..served import stored_binary
        from .launching import cached_result

        binary, _ = stored_binary(manifest, read_blob, device_arch, device_cc, source_roots)
        return cached_result(request.dispatcher, request.argtypes, binary, manifest["entry"],
                             bool(manifest.get("cooperative")))

    def serve(self, resolver) -> None:
        from .dispatch import install

        install(resolver)

    def stop_serving(self) -> None:
        from .dispatch import uninstall

        uninstall()

    def current_arch(self) -> str:
        from .launching import current_device, device_arch

        return device_arch(current_device())

    def prepare(self) -> None:
        from .compiler import prepare

        prepare()

    def project_forgotten(self) -> None:
        from .compiler import set_up_again

        set_up_again()


BACKEND = NumbaCudaMlir()
