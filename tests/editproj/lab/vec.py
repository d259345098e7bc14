"""A device function calling a device function in another file (kernel -> axpy2 -> twice)."""

from numba import cuda

from lab.mathx import twice


@cuda.jit(device=True)
def axpy2(a, b):
    return twice(a) + b
