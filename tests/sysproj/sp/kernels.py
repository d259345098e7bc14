from numba import cuda

from .ext import aliased, counted, dev_eager, dev_scaled, flagged, gained, packaged, scaled, \
    scanned, shelled, spawned, tabled, threaded, weighted, asked


@cuda.jit
def k_flag(a):
    a[0] = flagged(a[0])


@cuda.jit
def k_table(a):
    a[0] = tabled(a[0])


@cuda.jit
def k_weights(a):
    a[0] = weighted(a[0])


@cuda.jit
def k_packaged(a):
    a[0] = packaged(a[0])


@cuda.jit
def k_plugins(a):
    a[0] = counted(a[0])


@cuda.jit
def k_scan(a):
    a[0] = scanned(a[0])


@cuda.jit
def k_alias(a):
    a[0] = aliased(a[0])


@cuda.jit
def k_gain_a(a):
    a[0] = gained(a[0])


@cuda.jit
def k_gain_b(a):
    a[0] = gained(a[0]) + 1.0


# Typed by numba when the module is imported, before any compile kbuild observes.
@cuda.jit("void(float32[::1])")
def k_eager(a):
    a[0] = scaled(a[0])


@cuda.jit("void(float32[::1])")
def k_eager_dev(a):
    a[0] = dev_scaled(a[0])


@cuda.jit
def k_shell(a):
    a[0] = shelled(a[0])


@cuda.jit
def k_threaded(a):
    a[0] = threaded(a[0])


@cuda.jit
def k_spawned(a):
    a[0] = spawned(a[0])


@cuda.jit
def k_socket(a):
    a[0] = asked(a[0])


@cuda.jit
def k_dev_eager(a):
    a[0] = dev_eager(a[0])
