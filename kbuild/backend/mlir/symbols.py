"""numba-cuda-mlir's module-level symbols named by content, for the length of a compile.

numba-cuda-mlir 0.6.0 names three kinds of module-level symbols from per-process
counters, and the PTX keeps the names, so a kernel's bytes depended on what the
process had lowered before it (compiling `a`, then `b`, then `a` gave `a` other PTX):
- a static shared array `static_shared_memory_<n>` (`lowering/cuda.py`, `shmem_id`);
- a string constant `__numba_cuda_mlir_str_<n>` (`lowering_utilities/string.py`);
- an array constant `constant_array_<n>` (`mlir_lowering.py`, `constant_array_id`).

Resetting the counters at each compile would not be safe, although each symbol is
private or internal to its module: a device function's compiled MLIR is kept (per
argument types) across compiles and cloned into each caller's module, and the clone
skips every symbol whose name the caller's module already holds
(`_compile_device_callee`). A callee compiled earlier with `static_shared_memory_0`
would then share its caller's `static_shared_memory_0`, or read its caller's string.
So each name is made of what the symbol *is*, and one name always means one thing:
- a shared array: a digest of the symbol of the function it is lowered in and its
  place among the module's shared arrays (the same array of the same function when
  two names meet, as kbuild's numba-cuda patch `reproducible.shared_memory_names`);
- a string or array constant: a digest of its bytes (and element type) and its place
  among the module's constants of that kind (two that meet hold the same bytes).
The names stay numbers (`<prefix><int>`), as upstream writes them.
"""

from __future__ import annotations

import contextlib
import sys

_SHARED = "static_shared_memory_"
_STRING = "__numba_cuda_mlir_str_"
_ARRAY = "constant_array_"


def _number(*parts) -> int:
    from ...keying.encode import digest_of

    return int(digest_of(parts)[:15], 16)


def _place(gpu_module, prefix: str) -> int:
    """How many symbols named `prefix...` the module holds already."""
    from numba_cuda_mlir.lowering_utilities.link import _get_op_sym_name

    return sum(1 for op in gpu_module.bodyRegion.blocks[0]
               if (_get_op_sym_name(op) or "").startswith(prefix))


def _function_symbol(lower) -> str:
    op = getattr(lower, "mlir_funcOp", None)
    try:
        return op.attributes["sym_name"].value
    except (AttributeError, KeyError):
        return lower.fndesc.qualname


class _StringNumbers:
    """Stands for `string._counter`: the next number is the digest of the string being
    materialized (its caller's `databytes`) and its place in the module."""

    def __iter__(self):
        return self

    def __next__(self) -> int:
        caller = sys._getframe(1).f_locals
        data = bytes(caller["databytes"])
        return _number("string constant", data, _place(caller["gpu_module"], _STRING))


@contextlib.contextmanager
def content_names():
    """Within the block, shared arrays, string and array constants are named by content
    (see the module's docstring); upstream's counters are put back afterwards."""
    from numba_cuda_mlir import mlir_lowering
    from numba_cuda_mlir.lowering import cuda as lowering_cuda
    from numba_cuda_mlir.lowering_utilities import string

    static_shared = lowering_cuda.cuda_static_shared_memory
    array_literal = mlir_lowering.MLIRLower.lower_array_literal

    def cuda_static_shared_memory(lower, *args, **kwargs):
        # Upstream spells `static_shared_memory_{shmem_id}`, then counts on: set it first.
        lowering_cuda.shmem_id = _number("shared array", _function_symbol(lower),
                                         _place(lower.mlir_gpu_module, _SHARED))
        return static_shared(lower, *args, **kwargs)

    def lower_array_literal(self, value, numba_type):
        import numpy as np

        array = np.ascontiguousarray(value)
        mlir_lowering.constant_array_id = _number(
            "array constant", array.dtype.str, array.tobytes(),
            _place(self.mlir_gpu_module, _ARRAY))
        return array_literal(self, value, numba_type)

    saved = (string._counter, lowering_cuda.shmem_id, mlir_lowering.constant_array_id)
    string._counter = _StringNumbers()
    lowering_cuda.cuda_static_shared_memory = cuda_static_shared_memory
    mlir_lowering.MLIRLower.lower_array_literal = lower_array_literal
    try:
        yield
    finally:
        string._counter, lowering_cuda.shmem_id, mlir_lowering.constant_array_id = saved
        lowering_cuda.cuda_static_shared_memory = static_shared
        mlir_lowering.MLIRLower.lower_array_literal = array_literal
