"""Device functions called by place, by name, with a default omitted, and by another."""

from numba import cuda


@cuda.jit(device=True)
def lin(a, b):
    return a * 2.0 + b


@cuda.jit(device=True)
def pos(u, v):
    return u - v * 0.5


@cuda.jit(device=True)
def off(a, d=1.0):
    return a + d


@cuda.jit(device=True)
def mid(a):
    return lin(b=a, a=1.0)


def make_scaled(factor):
    @cuda.jit(device=True)
    def scaled(v, w):
        return v * factor + w

    return scaled


def make_offset(delta):
    @cuda.jit(device=True)
    def offset(u):
        return u + delta

    return offset


scaled2 = make_scaled(2.0)
offset3 = make_offset(3.0)


@cuda.jit(device=True, inline="always")
def lin_inline(a, b):
    return a * 2.0 + b
