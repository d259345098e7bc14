"""Scalar device functions shared by the kernel modules."""

from numba import cuda


@cuda.jit(device=True)
def sq(x):
    """Return x * x."""
    return x * x


@cuda.jit(device=True)
def shift(x, delta=1.0):
    """Return x + delta (callers usually rely on the default delta)."""
    return x + delta


def reference_sq(x):
    return x * x


def reference_shift(x, delta=1.0):
    return x + delta
