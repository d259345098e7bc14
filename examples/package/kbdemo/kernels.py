"""Two kernels and a device function; the wheel carries their cubins and PTX."""

from numba import cuda


@cuda.jit(device=True)
def axpy(a, x, y):
    return a * x + y


@cuda.jit
def saxpy(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = axpy(a, x[i], y[i])


@cuda.jit
def scale(x, factor):
    i = cuda.grid(1)
    if i < x.size:
        x[i] *= factor
