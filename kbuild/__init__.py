"""kbuild: a content-addressed, make-like build system for numba-cuda kernels."""

__version__ = "0.1.0"

__all__ = ["Project", "__version__"]


def __getattr__(name):
    # Lazy: `import kbuild` stays cheap; the project API pulls in numba only when used.
    if name == "Project":
        from .project import Project

        return Project
    raise AttributeError(name)
