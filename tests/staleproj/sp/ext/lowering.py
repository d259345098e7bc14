"""Lowering of the type, away from the type and its model."""

from numba.cuda import cgutils, types
from numba.cuda.cudaimpl import lower_attr
from numba.cuda.extending import lower_builtin, lower_cast
from numba.cuda.cudadecl import registry as cuda_typing
from numba.cuda.typing.templates import AttributeTemplate

from sp.ext.types import Span, SpanType, span_sum


@lower_builtin(Span, types.Float, types.Float)
def make_span(context, builder, sig, args):
    lo, hi = args
    span = cgutils.create_struct_proxy(sig.return_type)(context, builder)
    span.lo = context.cast(builder, lo, sig.args[0], types.float32)
    span.hi = context.cast(builder, hi, sig.args[1], types.float32)
    return span._getvalue()


@cuda_typing.register_attr
class SpanAttrs(AttributeTemplate):
    key = SpanType

    def resolve_width(self, span):
        return types.float32

    def resolve_top(self, span):  # lowered in sp.ext.raw
        return types.float32


@lower_attr(SpanType, "width")
def span_width(context, builder, sig, arg):
    lo = builder.extract_value(arg, 0)
    hi = builder.extract_value(arg, 1)
    return builder.fsub(hi, lo)


@lower_cast(SpanType, types.float32)
def span_to_float(context, builder, fromty, toty, val):
    lo = builder.extract_value(val, 0)
    hi = builder.extract_value(val, 1)
    return builder.fadd(lo, hi)


@lower_builtin(span_sum, SpanType)
def lower_span_sum(context, builder, sig, args):
    lo = builder.extract_value(args[0], 0)
    hi = builder.extract_value(args[0], 1)
    return context.cast(builder, builder.fadd(lo, hi), types.float32, sig.return_type)
