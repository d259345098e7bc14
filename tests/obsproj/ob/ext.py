"""numba extensions whose Python runs at typing time."""

import os

from numba.core import types
from numba.cuda.extending import overload, overload_attribute, overload_method

from ob import consts
from ob.cfg import Cfg


def scale_it(x):
    pass


@overload(scale_it, target="cuda")
def ol_scale_it(x):
    s = consts.SCALE

    def impl(x):
        return x * s

    return impl


@overload_method(types.Array, "ob_gained", target="cuda")
def ol_gained(arr, i):
    g = Cfg.GAIN + Cfg.OWN

    def impl(arr, i):
        return arr[i] * g

    return impl


@overload_attribute(types.Array, "ob_bias", target="cuda")
def ol_bias(arr):
    b = Cfg.DERIVED + float(os.environ.get("OB_BIAS", "0"))

    def impl(arr):
        return b

    return impl


def divide(a, b):
    pass


@overload(divide, target="cuda", jit_options={"fastmath": False})
def ol_divide(a, b):
    def impl(a, b):
        return a / b

    return impl


def lazy_k(x):
    pass


@overload(lazy_k, target="cuda")
def ol_lazy_k(x):
    from ob import lazyconsts

    k = lazyconsts.K

    def impl(x):
        return x + k

    return impl


def read_factor(x):
    pass


def make_reader(mod):
    def ol_read_factor(x):
        f = mod.FACTOR

        def impl(x):
            return x * f

        return impl

    return ol_read_factor


from ob import factors  # noqa: E402

overload(read_factor, target="cuda")(make_reader(factors))


def pick(x):
    pass


@overload(pick, target="cuda")
def ol_pick(x):
    # numba compiles the implementation this returns: for float32, impl_float only.
    if isinstance(x, types.Float):
        def impl_float(x):
            return x * 2.0

        return impl_float

    def impl_int(x):
        return x + 1

    return impl_int


def calc(x):
    pass


@overload(calc, target="cuda")
def ol_calc(x):
    # A nested helper the selector calls while typing: its body decides `f`.
    def factor():
        return 2.0

    f = factor()

    def impl(x):
        return x * f

    return impl


def choose(x):
    pass


def choose_literal(x):
    return x + 7


def choose_float(x):
    return x * 3.0


# Two registrations of one function, tried in order: for float32 the first returns
# nothing, and only the second one's implementation is compiled.
@overload(choose, target="cuda", prefer_literal=True)
def ol_choose_literal(x):
    if isinstance(x, types.IntegerLiteral):
        return choose_literal


@overload(choose, target="cuda")
def ol_choose(x):
    if isinstance(x, types.Float):
        return choose_float
