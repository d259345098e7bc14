"""Device functions made by a factory: closures over a captured factor."""

from numba import cuda


def make_scaler(factor):
    """A device function computing x * factor."""

    @cuda.jit(device=True)
    def scale(x):
        return x * factor

    return scale


double = make_scaler(2.0)
