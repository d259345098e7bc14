import os

from numba import cuda

from ob import consts, ext
from obext import jitables

_GAIN_CU = os.path.join(os.path.dirname(__file__), "lib", "gain.cu")
link_gain = cuda.declare_device("ob_link_gain", "float32(float32)", link=[_GAIN_CU])


# numba prunes a branch on a global's value before typing: `trace` is never compiled.
DEBUG = False


@cuda.jit(device=True)
def trace(x):
    return x * 2.0


@cuda.jit("float32(float32)", device=True)
def eager_third(x):
    # A division: in float64 it rounds differently from float32 (a doubling would not).
    return x / 3


@cuda.jit
def k_overload(x):
    x[0] = ext.scale_it(x[0])


@cuda.jit
def k_method(x):
    x[0] = x.ob_gained(1)


@cuda.jit
def k_attr(x):
    x[0] = x.ob_bias


@cuda.jit
def k_jitable(x):
    x[0] = jitables.triple(x[0])


@cuda.jit
def k_fast(x):
    x[0] = ext.divide(x[0], x[1])


@cuda.jit
def k_lazy(x):
    x[0] = ext.lazy_k(x[0])


@cuda.jit
def k_factory(x):
    x[0] = ext.read_factor(x[0])


@cuda.jit
def k_link(x):
    x[0] = link_gain(x[0])


@cuda.jit
def k_eager(x):
    x[0] = eager_third(x[0])


@cuda.jit
def k_builtin(x):
    x[0] = x[0] * OB_GAIN  # noqa: F821 - injected into builtins by ob/__init__.py


@cuda.jit
def k_const(x):
    x[0] = x[0] * consts.SCALE


@cuda.jit
def k_debug(x):
    if DEBUG:
        x[0] = trace(x[0])
    x[0] = x[0] + 1.0


@cuda.jit
def k_pick(x):
    x[0] = ext.pick(x[0])
    x[1] = ext.choose(x[1])


@cuda.jit
def k_calc(x):
    x[0] = ext.calc(x[0])
