"""A kernel built with lineinfo: its line numbers are in the binary, so they are in its key."""

from numba import cuda


@cuda.jit(lineinfo=True)
def k_lines(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + 1.0
