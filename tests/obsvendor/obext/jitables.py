from numba.cuda.extending import register_jitable


@register_jitable
def triple(x):
    return x * 3
