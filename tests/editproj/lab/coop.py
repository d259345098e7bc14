"""A cooperative (grid-sync) kernel: numba 0.59 broke caching these (#9432)."""

from numba import cuda


@cuda.jit
def k_coop(data):
    i = cuda.grid(1)
    if i < data.size:
        data[i] += 1
    cuda.cg.this_grid().sync()
    if i < data.size:
        data[i] *= 2
