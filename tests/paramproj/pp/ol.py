"""An @overload implementation that calls a device function naming its parameters."""

from numba.cuda.extending import overload

from pp.dev import lin


def helper(a, b):
    pass


@overload(helper, target="cuda")
def ol_helper(a, b):
    def impl(a, b):
        return lin(a=a, b=b)

    return impl
