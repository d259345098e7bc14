"""One kernel per configuration object (cp.ext), and one that reads none of them."""

from numba import cuda

from cp.ext import biased, factored, from_file, gained, logged, memoized, nudged, quadrupled, \
    scaled


@cuda.jit
def k_dataclass(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = scaled(x[i])


@cuda.jit
def k_nested(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = gained(x[i])


@cuda.jit
def k_property(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = factored(x[i])


@cuda.jit
def k_namespace(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = biased(x[i])


@cuda.jit
def k_partial(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = quadrupled(x[i])


@cuda.jit
def k_logged(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = logged(x[i])


@cuda.jit
def k_path(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = from_file(x[i])


@cuda.jit
def k_finfo(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = nudged(x[i])


@cuda.jit
def k_memo(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = memoized(x[i])


@cuda.jit
def k_plain(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] + 1.0
