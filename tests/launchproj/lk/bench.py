"""The launch-overhead cases: 0 arguments, saxpy's 4, 16 scalars, 16 arrays."""

from numba import cuda


@cuda.jit
def noargs():
    pass


@cuda.jit
def saxpy(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


@cuda.jit
def scalars16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):
    pass


@cuda.jit
def arrays16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):
    i = cuda.grid(1)
    if i < a0.size:
        a0[i] = (a1[i] + a2[i] + a3[i] + a4[i] + a5[i] + a6[i] + a7[i] + a8[i] + a9[i]
                 + a10[i] + a11[i] + a12[i] + a13[i] + a14[i] + a15[i])
