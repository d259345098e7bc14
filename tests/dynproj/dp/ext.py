"""Extensions whose Python reads constants dynamically while numba types and lowers."""

import importlib

from numba.core import types
from numba.cuda.extending import intrinsic, overload, overload_attribute, overload_method

from dp import dconsts, helpers
from dp.dconsts import TWIST

GAIN = 1.5


def by_getattr(x):
    pass


@overload(by_getattr, target="cuda")
def ol_by_getattr(x):
    s = getattr(dconsts, "SC" + "ALE")

    def impl(x):
        return x * s

    return impl


def by_globals(x):
    pass


@overload(by_globals, target="cuda")
def ol_by_globals(x):
    g = globals()["GA" + "IN"]

    def impl(x):
        return x * g

    return impl


def by_import_module(x):
    pass


@overload(by_import_module, target="cuda")
def ol_by_import_module(x):
    o = importlib.import_module("dp.dconsts").OFFSET

    def impl(x):
        return x + o

    return impl


def by_helper(x):
    pass


@overload(by_helper, target="cuda")
def ol_by_helper(x):
    h = helpers.helper_value()

    def impl(x):
        return x + h

    return impl


@intrinsic
def offset_const(typingctx, x):
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):
        value = getattr(dconsts, "OFF" + "SET")
        return builder.fadd(args[0], context.get_constant(types.float32, value))

    return sig, codegen


@overload_method(types.Float, "twice", target="cuda")
def ol_twice(x):
    t = TWIST

    def impl(x):
        return x * 2 + t

    return impl


@overload_attribute(types.Array, "halfsize", target="cuda")
def ol_halfsize(arr):
    def impl(arr):
        return arr.size // 2

    return impl
