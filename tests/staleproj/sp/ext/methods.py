"""An @overload_method for the project's own type: its template registers lowering of its
own when numba first uses it."""

from numba.cuda.extending import overload_method

from sp.ext.types import SpanType


@overload_method(SpanType, "mid", target="cuda")
def ol_mid(span):
    def impl(span):
        return (span.lo + span.hi) * 0.5

    return impl
