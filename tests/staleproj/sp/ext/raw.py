"""Lowering that reads an llvmlite type made at import: keyed by its LLVM text, wherever
it was set from."""

from llvmlite import ir
from numba.cuda.cudaimpl import lower_attr

from sp.ext.types import SpanType

F32 = ir.FloatType()


@lower_attr(SpanType, "top")
def span_top(context, builder, sig, arg):
    lo = builder.extract_value(arg, 0)
    hi = builder.extract_value(arg, 1)
    return builder.fmul(hi, hi) if hi.type == F32 else lo
