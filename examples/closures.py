"""Device functions and kernels created by factories (closures over a factor)."""

from types import SimpleNamespace

from numba import cuda


def make_scaler(factor):
    """Return a device function computing x * factor."""

    @cuda.jit(device=True)
    def scale(x):
        return x * factor

    return scale


def make_scale_kernel(factor):
    """Return a kernel computing out[i] = x[i] * factor."""

    @cuda.jit
    def scale_kernel(x, out):
        """out[i] = x[i] * factor (factor captured from the factory)."""
        i = cuda.grid(1)
        if i < out.size:
            out[i] = x[i] * factor

    return scale_kernel


double = make_scaler(2.0)

# Reached by kbuild as the attribute path "examples.closures:scale3.func".
scale3 = SimpleNamespace(func=make_scale_kernel(3.0), factor=3.0)


@cuda.jit
def apply_double(x, out):
    """out[i] = 2 * x[i] via the closure-made device function `double`."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = double(x[i])


def reference_apply_double(x):
    return (x * 2.0).astype(x.dtype)


def reference_scale3(x):
    return (x * scale3.factor).astype(x.dtype)
