"""A grid-synchronised two-phase kernel and an atomic counter."""

import numpy as np
from numba import cuda

from examples.mathx import sq


@cuda.jit
def mirror_sum(x, tmp, out):
    """out[i] = x[i]**2 + x[n-1-i]**2, with a grid-wide sync between phases.

    Phase 2 reads values written by other blocks in phase 1, so this needs a
    cooperative launch (grid no larger than max_cooperative_grid_blocks);
    the grid-stride loops keep it correct for any such grid size.
    """
    n = min(x.size, tmp.size, out.size)
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, n, stride):
        tmp[i] = sq(x[i])
    g = cuda.cg.this_grid()
    g.sync()
    for i in range(start, n, stride):
        out[i] = tmp[i] + tmp[n - 1 - i]


@cuda.jit
def count_nonzero(counter, values):
    """Atomically add the number of nonzero values to the 0-d counter."""
    i = cuda.grid(1)
    if i < values.size and values[i] != 0:
        # numba-cuda atomics reject 0-d arrays, so add through a 1-element
        # view (unlike reshape, this needs no linked helper functions).
        cuda.atomic.add(counter[..., np.newaxis], 0, 1)


def reference_mirror_sum(x):
    t = x * x
    return (t + t[::-1]).astype(x.dtype)


def reference_count_nonzero(values, start=0):
    return start + int((values != 0).sum())
