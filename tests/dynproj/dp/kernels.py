import os

from numba import cuda

from dp import ext
from dp.shapes import P, Q

cwd_gain = cuda.declare_device(
    "dp_cwd_gain", "float32(float32)",
    link=[os.path.join(os.path.dirname(__file__), "lib", "cwd.cu")])


@cuda.jit
def k_getattr(x):
    x[0] = ext.by_getattr(x[0])


@cuda.jit
def k_globals(x):
    x[0] = ext.by_globals(x[0])


@cuda.jit
def k_import_module(x):
    x[0] = ext.by_import_module(x[0])


@cuda.jit
def k_helper_import(x):
    x[0] = ext.by_helper(x[0])


@cuda.jit
def k_intrinsic(x):
    x[0] = ext.offset_const(x[0])


@cuda.jit
def k_fields(x):
    p = P(x[0], x[1])
    x[0] = p.a


@cuda.jit
def k_env_fields(x):
    q = Q(x[0], x[1])
    x[0] = q.a


@cuda.jit
def k_cwd_header(x):
    x[0] = cwd_gain(x[0])


@cuda.jit
def k_methods(x):
    x[0] = x[0].twice() + x.halfsize


@cuda.jit
def k_plain(x):
    x[0] = x[0] + 1
