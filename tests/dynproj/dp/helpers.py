"""A helper an overload calls, which imports what it reads."""


def helper_value():
    from dp import hconsts

    return hconsts.H
