"""A function's typing and lowering, each in a module of its own, away from the stub."""

from numba.cuda import types
from numba.cuda.cudadecl import registry as cuda_typing
from numba.cuda.typing.templates import AbstractTemplate, signature

from sp.ext.types import SpanType, span_sum


@cuda_typing.register_global(span_sum)
class SpanSum(AbstractTemplate):
    def generic(self, args, kws):
        (span,) = args
        if isinstance(span, SpanType):
            return signature(types.float32, span)
