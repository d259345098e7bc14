"""3-vector device functions, built on the scalar helpers in examples.mathx."""

import math

import numpy as np
from numba import cuda

from examples.mathx import sq


@cuda.jit(device=True)
def norm3(x, y, z):
    """Euclidean length of (x, y, z)."""
    return math.sqrt(sq(x) + sq(y) + sq(z))


def reference_norm3(x, y, z):
    return np.sqrt(x * x + y * y + z * z)
