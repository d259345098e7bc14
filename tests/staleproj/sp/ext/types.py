"""The Python class, its numba type and its typing."""

from numba.cuda import types
from numba.cuda.extending import type_callable, typeof_impl
from numba.cuda.typeconv import Conversion


class Span:
    def __init__(self, lo, hi):
        self.lo = lo
        self.hi = hi


class SpanType(types.Type):
    def __init__(self):
        super().__init__(name="Span")

    def can_convert_to(self, typingctx, other):
        if other == types.float32:  # lowered by @lower_cast
            return Conversion.unsafe


span_type = SpanType()


def span_sum(span):
    """Typed in sp.ext.typer, lowered in sp.ext.lowering."""


@typeof_impl.register(Span)
def typeof_span(val, c):
    return span_type


@type_callable(Span)
def type_span(context):
    def typer(lo, hi):
        if isinstance(lo, types.Float) and isinstance(hi, types.Float):
            return span_type

    return typer

