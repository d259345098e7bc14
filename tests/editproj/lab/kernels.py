"""Kernels that each reach a different subset of the lab package.

    k_sq      mathx.sq (imported by name)       k_cube    mathx.cube (module attribute)
    k_chain   vec.axpy2 -> mathx.twice          k_shift   mathx.shift, default delta omitted
    k_scale   consts.SCALE                      k_table   consts.TABLE (numpy array)
    k_mode    consts.Mode.FAST (IntEnum)        k_fast    fastmath=True, math.sqrt
    k_double  closures.double (a closure)       k_plain   nothing shared (two signatures)
    k_pair    sq and cube under other names     k_inner   SCALE, hidden in a nested function
    records.k_points / k_origin: the Point record (argument / global), mathx.sq
    lines.k_lines: lineinfo=True;  coop.k_coop: grid sync
"""

import math

from numba import cuda

from lab import consts, mathx
from lab.closures import double
from lab.consts import SCALE, TABLE, Mode
from lab.mathx import cube as second, sq as first
from lab.mathx import shift, sq
from lab.vec import axpy2


@cuda.jit
def k_sq(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = sq(x[i])


@cuda.jit
def k_cube(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = mathx.cube(x[i])


@cuda.jit
def k_chain(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = axpy2(x[i], out[i])


@cuda.jit
def k_shift(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = shift(x[i])


@cuda.jit
def k_scale(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] * consts.SCALE


@cuda.jit
def k_table(x, out):
    i = cuda.grid(1)
    if i < out.size:
        acc = 0.0
        for k in range(TABLE.size):
            acc = acc * x[i] + TABLE[k]
        out[i] = acc


@cuda.jit
def k_mode(x, flag, out):
    i = cuda.grid(1)
    if i < out.size:
        if flag == Mode.FAST:
            out[i] = x[i] + 1.0
        else:
            out[i] = x[i] - 1.0


@cuda.jit(fastmath=True)
def k_fast(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = math.sqrt(x[i]) / 3.0


@cuda.jit
def k_double(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = double(x[i])


@cuda.jit
def k_plain(x, out):
    i = cuda.grid(1)
    if i < out.size:
        total = x[i]
        total = total * 0.5
        out[i] = total


@cuda.jit
def k_pair(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = first(x[i]) - second(x[i])


@cuda.jit
def k_inner(x, out):
    def bump(v):
        SCALE = 0.5  # local to bump: the kernel below still reads consts.SCALE
        return v + SCALE

    i = cuda.grid(1)
    if i < out.size:
        out[i] = bump(x[i]) * SCALE
