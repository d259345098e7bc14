"""Elementwise kernels using imported device functions, constants and an enum."""

import numpy as np
from numba import cuda

from examples import consts, mathx
from examples.consts import COEFFS, Mode
from examples.mathx import shift, sq


@cuda.jit
def square_shift(x, out):
    """out[i] = x[i]**2 + 1, via mathx.shift's default delta."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = shift(sq(x[i]))


@cuda.jit
def scaled_poly(x, out):
    """out[i] = consts.SCALE * polyval(COEFFS, x[i]) (Horner's rule)."""
    i = cuda.grid(1)
    if i < out.size:
        v = x[i]
        acc = 0.0
        for k in range(COEFFS.size):
            acc = acc * v + COEFFS[k]
        out[i] = consts.SCALE * acc


@cuda.jit
def mode_select(x, flag, out):
    """FAST: out[i] = x[i] * SCALE; otherwise out[i] = x[i]**2 (mathx.sq)."""
    i = cuda.grid(1)
    if i < out.size:
        if flag == Mode.FAST:
            out[i] = x[i] * consts.SCALE
        else:
            out[i] = mathx.sq(x[i])


def reference_square_shift(x):
    return (x * x + 1).astype(x.dtype)


def reference_scaled_poly(x):
    return (consts.SCALE * np.polyval(COEFFS, x)).astype(x.dtype)


def reference_mode_select(x, flag):
    if flag == Mode.FAST:
        return (x * consts.SCALE).astype(x.dtype)
    return (x * x).astype(x.dtype)
