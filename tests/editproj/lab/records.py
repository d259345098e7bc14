"""Kernels over a record type: as an argument and as a global (a local array of records)."""

import numba
import numpy as np
from numba import cuda

from lab import mathx

POINT_DTYPE = np.dtype([("x", np.float32), ("y", np.float32), ("tag", np.uint8)], align=True)
Point = numba.from_dtype(POINT_DTYPE)


@cuda.jit
def k_points(points, out):
    i = cuda.grid(1)
    if i < out.size:
        p = points[i]
        out[i] = mathx.sq(p.x) + p.y


@cuda.jit
def k_origin(out):
    tmp = cuda.local.array(1, Point)
    tmp[0].x = 1.0
    tmp[0].y = 2.0
    tmp[0].tag = 3
    out[0] = tmp[0].x + tmp[0].y + tmp[0].tag
