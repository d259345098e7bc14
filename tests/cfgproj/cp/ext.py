"""@overloads that read the configuration objects of cp.settings while numba types (one
logs, takes a lock and calls an `lru_cache`d helper as it does; one reads a file beside
a `Path`; one reads numpy's `finfo`; one fills a memo dict as it runs)."""

import logging
import threading

from numba.cuda.extending import overload

from cp import settings

log = logging.getLogger(__name__)
_lock = threading.Lock()
_MEMO = {}  # filled while numba compiles: a fresh process starts with it empty


def scaled(x):
    pass


def gained(x):
    pass


def factored(x):
    pass


def biased(x):
    pass


def quadrupled(x):
    pass


def logged(x):
    pass


def from_file(x):
    pass


def nudged(x):
    pass


def memoized(x):
    pass


@overload(scaled)
def ol_scaled(x):
    s = settings.SCALING.scale

    def impl(x):
        return x * s
    return impl


@overload(gained)
def ol_gained(x):
    g = settings.OUTER.inner.gain

    def impl(x):
        return x * g
    return impl


@overload(factored)
def ol_factored(x):
    f = settings.SETTINGS.factor

    def impl(x):
        return x * f
    return impl


@overload(biased)
def ol_biased(x):
    b = settings.NAMESPACE.bias

    def impl(x):
        return x + b
    return impl


@overload(quadrupled)
def ol_quadrupled(x):
    q = settings.TIMES_FOUR(1.0)

    def impl(x):
        return x * q
    return impl


@overload(logged)
def ol_logged(x):
    log.debug("typing logged(%s)", x)
    with _lock:
        g = settings.cached_gain(4)

    def impl(x):
        return x * g
    return impl


@overload(from_file)
def ol_from_file(x):
    w = float((settings.HERE / "weight.txt").read_text())

    def impl(x):
        return x * w
    return impl


@overload(nudged)
def ol_nudged(x):
    eps = settings.FLOAT32.eps

    def impl(x):
        return x + eps
    return impl


@overload(memoized)
def ol_memoized(x):
    if str(x) not in _MEMO:
        _MEMO[str(x)] = 0.125
    m = _MEMO[str(x)]

    def impl(x):
        return x + m
    return impl
