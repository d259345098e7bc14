"""Kernels whose symbol names numba once made from a process's history: closures over
device functions and values, fastmath as a flag, a set and on a device function only, and
helpers numba compiles for a lowering (`x ** n` is `int_power`) under the caller's flags."""

import math

from numba import cuda


def make_pow(p):
    @cuda.jit(device=True, fastmath=True)
    def powp(x):
        return x ** p

    return powp


pow3 = make_pow(3)
pow5 = make_pow(5)


def make_kernel(f, scale):
    @cuda.jit(fastmath=True)
    def k(x, n):
        i = cuda.grid(1)
        if i < x.size:
            x[i] = f(x[i]) * scale + n ** 2

    return k


k3 = make_kernel(pow3, 2.0)
k5 = make_kernel(pow5, 3.0)


@cuda.jit(fastmath=True)
def k_int(x, n):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] ** n + math.sqrt(x[i])


@cuda.jit
def k_plain(x, n):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = pow3(x[i]) + x[i] ** n


@cuda.jit(device=True, fastmath={"arcp", "nsz", "contract", "afn"})
def soft(x, n):
    return x ** n / (1.0 + x)


@cuda.jit(fastmath={"nsz", "reassoc", "contract"})
def k_flags(x, n):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = soft(x[i], n) + x[i] ** 3


@cuda.jit
def k_sync(x, n):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] ** n
    cuda.cg.this_grid().sync()
    if i < x.size:
        x[i] = pow5(x[i])


MODE = "a"


@cuda.jit
def k_text(x, n):
    # numba names a string literal's bytes `.bytes.<hash(bytes)>`, which the hash seed changed
    i = cuda.grid(1)
    if i < x.size and MODE in ("x", "y"):
        x[i] = x[i] * n
