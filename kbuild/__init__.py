"""kbuild: a content-addressed, make-like build system for numba-cuda kernels."""

__version__ = "0.1.0"

__all__ = ["Project", "__version__", "disable", "enable"]


def enable(*args, **kwargs):
    """Zero-config caching: every numba-cuda kernel this process compiles comes from
    kbuild's store from now on (see `kbuild.zeroconf.enable`)."""
    from .zeroconf import enable as _enable

    return _enable(*args, **kwargs)


def disable():
    """numba compiles on its own again (see `kbuild.zeroconf.disable`)."""
    from .zeroconf import disable as _disable

    _disable()


def load_ipython_extension(ipython):
    """`%load_ext kbuild` in IPython or a Jupyter notebook: `enable()` for its kernel, unless
    kbuild is enabled there already (by `kbuild run` or KBUILD_ENABLE, whose settings stay).
    Kernels written in cells are keyed from each cell's text (see `kbuild.cells`)."""
    from .zeroconf import current

    if current() is None:
        enable()


def __getattr__(name):
    # Lazy: `import kbuild` stays cheap; the project API pulls in numba only when used.
    if name == "Project":
        from .project import Project

        return Project
    raise AttributeError(name)
