"""Functions registered with numba's typing, with options on the registration."""

from numba.core import types
from numba.cuda.extending import _intrinsic, overload, register_jitable


@register_jitable
def ratio(a, b):
    return a / b


def quotient(a, b):
    pass


@overload(quotient, target="cuda", jit_options={"fastmath": False})
def ol_quotient(a, b):
    def impl(a, b):
        return a / b

    return impl


def pick(n):
    pass


@overload(pick, target="cuda", prefer_literal=False)
def ol_pick(n):
    if isinstance(n, types.IntegerLiteral):
        value = n.literal_value * 10

        def impl(n):
            return value

        return impl

    def impl(n):
        return n + 1

    return impl


# numba-cuda's public `intrinsic` takes no options; `_intrinsic` is what it is made of.
@_intrinsic(target="cuda", prefer_literal=False)
def lit_or_not(typingctx, n):
    literal = isinstance(n, types.IntegerLiteral)
    sig = types.int64(n)

    def codegen(context, builder, signature, args):
        if literal:
            return context.get_constant(types.int64, 100)
        return builder.sext(args[0], context.get_value_type(types.int64)) \
            if args[0].type.width < 64 else args[0]

    return sig, codegen
