from numba import cuda

from pp.dev import lin, lin_inline, mid, off, offset3, pos, scaled2
from pp.ol import helper


@cuda.jit
def k_pos(x):
    x[0] = lin(x[0], x[1]) + pos(x[0], x[1])


@cuda.jit
def k_kw(x):
    x[0] = lin(a=x[0], b=x[1])


@cuda.jit
def k_def(x):
    x[0] = off(x[0])


@cuda.jit
def k_mid(x):
    x[0] = mid(x[0])


@cuda.jit
def k_ol(x):
    x[0] = helper(x[0], x[1])


@cuda.jit
def k_fac_pos(x):
    x[0] = scaled2(x[0], x[1]) + offset3(x[1])


@cuda.jit
def k_fac_kw(x):
    x[0] = scaled2(w=x[0], v=x[1])


@cuda.jit
def k_inline(x):
    x[0] = lin_inline(a=x[0], b=x[1])
