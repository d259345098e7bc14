"""Kernels whose symbol names numba once made from a process's history: closures over
device functions and values, fastmath as a flag, a set and on a device function only, and
helpers numba compiles for a lowering (`x ** n` is `int_power`) under the caller's flags."""

import math

import numba
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


# numba names shared arrays `_cudapy_smem_<n>` from a per-process count, which the PTX
# keeps: the order in which a worker lowered them once changed these kernels' bytes.
@cuda.jit(device=True)
def staged(x, i):
    s = cuda.shared.array(32, numba.float32)
    s[cuda.threadIdx.x] = x[i]
    cuda.syncthreads()
    return s[(cuda.threadIdx.x + 1) % 32]


@cuda.jit
def k_smem_a(x, n):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = staged(x, i) * n


@cuda.jit
def k_smem_b(x, n):
    t = cuda.shared.array(64, numba.float32)
    i = cuda.grid(1)
    if i < x.size:
        t[cuda.threadIdx.x] = x[i]
    cuda.syncthreads()
    if i < x.size:
        x[i] = t[(cuda.threadIdx.x + 3) % 64] + n
