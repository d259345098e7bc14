"""The classic single-precision a*x + y."""

from numba import cuda


@cuda.jit
def saxpy(a, x, y, out):
    """out[i] = a * x[i] + y[i]."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def reference_saxpy(a, x, y):
    return (a * x + y).astype(x.dtype)
