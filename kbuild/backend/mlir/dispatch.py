"""numba-cuda-mlir's dispatcher served by kbuild: what `kbuild.enable()` installs for it.

numba-cuda-mlir's C++ launcher asks `MLIRDispatcher._compile_impl(args)` for a kernel it
does not hold. Before compiling, that method asks the dispatcher's cache
(`self._cache.load_overload(sig, ...)`, the seam its own `cache=True` uses) and publishes
a hit as the dispatcher's overload, whose cubin the launcher then loads. `install`
wraps `_compile_impl` on the class so that every dispatcher, made before or after, gets
`_Served` as its cache: the resolver (the zero-config session) is asked first, and its
answer - a stored cubin, as the `CachedCompileResult` numba-cuda-mlir's own cache gives
back - is what the dispatcher holds; None falls through to the dispatcher's own cache
(numba-cuda-mlir's `cache=True`, or none) and its own compile.

numba-cuda-mlir skips its cache, and so kbuild, for a compile that sees a launch
configuration (extensions that read it, whole-function planners): those compile as
before, not cached.
"""

from __future__ import annotations

import functools
import threading

_state: dict = {"resolver": None, "original": None}
_local = threading.local()  # .busy: inside the resolver (kbuild's own compile)


def install(resolver) -> None:
    """From now on, a numba-cuda-mlir kernel compile asks `resolver(Request)` first (a
    `backend.dispatch.Request`; its answer: a compiled result for the dispatcher, or
    None); replaces an earlier resolver."""
    from numba_cuda_mlir.descriptor import MLIRDispatcher

    if _state["original"] is None:
        original = MLIRDispatcher._compile_impl

        @functools.wraps(original)
        def _compile_impl(self, *args, **kwargs):
            if _state["resolver"] is not None and not isinstance(self._cache, _Served):
                self._cache = _Served(self, self._cache)
            return original(self, *args, **kwargs)

        MLIRDispatcher._compile_impl = _compile_impl
        _state["original"] = original
    _state["resolver"] = resolver


def uninstall() -> None:
    """numba-cuda-mlir compiles on its own again (kernels already handed over stay)."""
    if _state["original"] is not None:
        from numba_cuda_mlir.descriptor import MLIRDispatcher

        MLIRDispatcher._compile_impl = _state["original"]
        _state["original"] = None
    _state["resolver"] = None


class _Served:
    """A dispatcher's cache, answered by kbuild's store first."""

    def __init__(self, dispatcher, inner):
        self._dispatcher, self._inner = dispatcher, inner

    def load_overload(self, sig, target_context):
        resolver = _state["resolver"]
        if resolver is not None and not getattr(_local, "busy", False) \
                and not self._dispatcher.targetoptions.get("device"):
            from ..dispatch import Request

            _local.busy = True
            try:
                found = resolver(Request(self._dispatcher, tuple(sig.args)))
            finally:
                _local.busy = False
            if found is not None:
                return found
        return self._inner.load_overload(sig, target_context)

    def save_overload(self, sig, data):
        return self._inner.save_overload(sig, data)

    def __getattr__(self, name):
        return getattr(self._inner, name)


__all__ = ["install", "uninstall"]
