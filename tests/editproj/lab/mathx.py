"""Device functions shared by several kernels."""

from numba import cuda


@cuda.jit(device=True)
def sq(x):
    return x * x


@cuda.jit(device=True)
def cube(x):
    return x * x * x


@cuda.jit(device=True)
def shift(x, delta=1.0):
    return x + delta


@cuda.jit(device=True)
def twice(x):
    return x + x


@cuda.jit(device=True)
def unused(x):
    return x - 1.0
