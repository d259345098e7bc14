"""Kernels over an array of aligned 3-D point records."""

import numba
import numpy as np
from numba import cuda

from examples import vecmath

POINT_DTYPE = np.dtype(
    [("x", np.float32), ("y", np.float32), ("z", np.float32)], align=True
)
Point = numba.from_dtype(POINT_DTYPE)


@cuda.jit
def point_norms(points, out):
    """out[i] = |points[i]|; the norm goes kernel -> vecmath.norm3 -> mathx.sq."""
    i = cuda.grid(1)
    if i < out.size and i < points.size:
        p = points[i]
        out[i] = vecmath.norm3(p.x, p.y, p.z)


def reference_point_norms(points):
    return vecmath.reference_norm3(points["x"], points["y"], points["z"]).astype(
        np.float32
    )
