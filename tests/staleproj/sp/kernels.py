import math
import os

from numba import cuda

_NATIVE = os.path.join(os.path.dirname(__file__), "native")

sp_gain = cuda.declare_device("sp_gain", "float32(float32)",
                              link=[os.path.join(_NATIVE, "gain.cu")])
sp_twice = cuda.declare_device("sp_twice", "float32(float32)")


@cuda.jit
def k_declared(x):
    x[0] = sp_gain(x[0])


@cuda.jit(link=[os.path.join(_NATIVE, "twice.cu")])
def k_linked(x):
    x[0] = sp_twice(x[0])


from sp import jit  # noqa: E402


@cuda.jit
def k_jitable(x):
    x[0] = jit.ratio(x[0], x[1])


@cuda.jit
def k_overload_options(x):
    x[0] = jit.quotient(x[0], x[1])


@cuda.jit
def k_prefer_literal(x):
    x[0] = jit.pick(3)


@cuda.jit
def k_intrinsic_literal(x):
    x[0] = jit.lit_or_not(3)


from sp.ext.types import Span, span_sum  # noqa: E402
import sp.ext  # noqa: E402,F401  (its model and lowering)


@cuda.jit
def k_span_make(x):
    s = Span(x[0], x[1])
    x[0] = s.lo - s.hi * 2


@cuda.jit
def k_span_width(x):
    x[0] = Span(x[0], x[1]).width


@cuda.jit
def k_span_cast(x):
    x[0] = Span(x[0], x[1])



@cuda.jit
def k_span_sum(x):
    x[0] = math.exp(span_sum(Span(x[0], x[1])))  # in the type span_sum is typed to return


@cuda.jit
def k_span_mid(x):
    x[0] = Span(x[0], x[1]).mid()


@cuda.jit
def k_span_top(x):
    x[0] = Span(x[0], x[1]).top
