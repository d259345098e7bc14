"""One kernel per launch feature: scalar kinds and records, dynamic shared memory,
a grid sync, 2-d strided arrays, and a debug kernel that raises on the device."""

import numba
import numpy as np
from numba import cuda

REC_DTYPE = np.dtype([("a", np.float32), ("b", np.int16)], align=True)
Rec = numba.from_dtype(REC_DTYPE)


@cuda.jit
def mixed(flag, i8, u16, h, c64, c128, rec, zero_d, out):
    """Every scalar kind lands in `out`; the 0-d array is read and written."""
    if cuda.grid(1) == 0:
        out[0] = 1.0 if flag else -1.0
        out[1] = i8
        out[2] = u16
        out[3] = numba.float32(h)
        out[4] = c64.real + c64.imag
        out[5] = c128.real - c128.imag
        out[6] = rec.a + rec.b
        out[7] = zero_d[()]
        zero_d[()] = 42.0


@cuda.jit
def block_sums(x, out):
    """out[block] = sum of the block's x, through dynamic shared memory."""
    buf = cuda.shared.array(0, numba.float32)
    i = cuda.grid(1)
    t = cuda.threadIdx.x
    buf[t] = x[i] if i < x.size else 0.0
    cuda.syncthreads()
    if t == 0:
        s = numba.float32(0.0)
        for j in range(cuda.blockDim.x):
            s += buf[j]
        out[cuda.blockIdx.x] = s


@cuda.jit
def grid_reverse(x, tmp, out):
    """out = x reversed, across blocks: needs the grid-wide sync of a cooperative launch."""
    n = x.size
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, n, stride):
        tmp[i] = x[i] * 2.0
    cuda.cg.this_grid().sync()
    for i in range(start, n, stride):
        out[i] = tmp[n - 1 - i]


@cuda.jit
def transpose_add(a, out):
    """out[i, j] += a[j, i] for a strided (any layout) a."""
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] += a[j, i]


@cuda.jit(debug=True, opt=False)
def checked_store(x, i):
    """x[i] = 1, or an IndexError raised on the device for an out-of-range i."""
    if i < 0 or i >= x.size:
        raise IndexError("checked_store: index out of range")
    x[i] = 1.0
