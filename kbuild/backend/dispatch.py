"""numba-cuda's dispatcher, served by kbuild: the one hook `kbuild.enable()` installs.

Every way numba-cuda compiles a kernel for new argument types goes through
`CUDADispatcher.compile(sig)`: the first launch of a lazy kernel
(`_compile_for_args`), an eager signature, `specialize()`, the dispatcher made
for another launch configuration of a launch-config-sensitive kernel, a
factory's or a closure's kernel. `install(resolver)` wraps that one method on
the class, so dispatchers made before and after `enable()` are served alike:
for a signature the dispatcher has not compiled yet, `resolver(request)` is
asked for a kernel (numba's own `_Kernel`, rebuilt from a stored binary by
`loader.rebuild_kernel`); the dispatcher then holds it as an overload, exactly
as numba's own compile or its `cache=True` would leave it, so typing,
`kernel[grid, block, stream, sharedmem]`, host and device arrays and
launch-config specialisation stay numba's. A resolver that answers None lets
numba compile as usual (and numba's own cache, if any, do its part).

Launch configurations: numba-cuda 0.30 lets an extension mark a launch-triggered
compile as depending on its launch configuration
(`dispatcher.mark_launch_config_sensitive()`, during typing or lowering); the
mark lands on the current launch configuration. `watching(config)` tells the
caller whether a compile made it, and `launched_as(dispatcher, launch)` makes a
stand-in launch configuration current for a compile with no launch (a declared
target built ahead of time for a launch configuration).

Under numba's simulator there is nothing to compile; `install_recorder` sees the
launches instead (argument types from numba's `typeof`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass

_state: dict = {"resolver": None, "compile": None, "sim_recorder": None, "sim_call": None,
                "get_config": None}
_local = threading.local()  # .busy: inside the resolver; .stub: a stand-in launch config


@dataclass
class Request:
    """One compile numba is about to do: a dispatcher, its argument types (numba types),
    and the launch configuration current while it compiles (numba's object, or None)."""

    dispatcher: object
    argtypes: tuple
    config: object = None

    @property
    def py_func(self):
        return self.dispatcher.py_func

    @property
    def options(self) -> dict:
        return dict(self.dispatcher.targetoptions)

    @property
    def launch(self):
        """The current launch configuration as ((grid x, y, z), (block x, y, z), shared
        memory bytes), numba's own specialisation key, or None."""
        return launch_of(self.config)

    @property
    def launch_sensitive(self) -> bool:
        """Whether numba already knows this dispatcher's kernels depend on their launch."""
        d = self.dispatcher
        return bool(getattr(d, "_launch_config_sensitive", False)
                    or getattr(d, "_launch_config_is_specialized", False))


def install(resolver) -> None:
    """From now on, numba's compile of a new (dispatcher, argument types) asks
    `resolver(Request)` first; replaces an earlier resolver."""
    from numba.cuda.dispatcher import CUDADispatcher

    if _state["compile"] is None:
        original = CUDADispatcher.compile

        @functools.wraps(original)
        def compile(self, sig):
            return _compile(self, sig, original)

        CUDADispatcher.compile = compile
        _state["compile"] = original
    _state["resolver"] = resolver


def uninstall() -> None:
    """numba compiles on its own again (kernels already handed over stay)."""
    from numba.cuda.dispatcher import CUDADispatcher

    if _state["compile"] is not None:
        CUDADispatcher.compile = _state["compile"]
        _state["compile"] = None
    _state["resolver"] = None


def installed() -> bool:
    return _state["resolver"] is not None


def _compile(dispatcher, sig, original):
    resolver = _state["resolver"]
    if resolver is None or getattr(_local, "busy", False) or dispatcher.specialized:
        return original(dispatcher, sig)
    from numba.core import sigutils
    from numba.cuda.core.compiler_lock import global_compiler_lock

    argtypes, _ = sigutils.normalize_signature(sig)
    if dispatcher.overloads.get(argtypes) is not None:
        return original(dispatcher, sig)  # numba returns what it holds
    with global_compiler_lock:
        _local.busy = True
        try:
            kernel = resolver(Request(dispatcher, tuple(argtypes), current_config()))
        finally:
            _local.busy = False
        if kernel is None:
            return original(dispatcher, sig)
        dispatcher.add_overload(kernel, tuple(argtypes))
        return kernel


# -- launch configurations ------------------------------------------------------------

def current_config():
    """numba's current launch configuration (set while a launch compiles), or None."""
    from numba.cuda import launchconfig

    return launchconfig.current_launch_config()


def launch_of(config):
    """numba's specialisation key of a launch configuration: (grid, block, shared memory)
    with 3-tuples of ints, or None."""
    if config is None:
        return None
    return (tuple(int(d) for d in config.griddim), tuple(int(d) for d in config.blockdim),
            int(config.sharedmem or 0))


class Marks:
    """Whether the compile watched by `watching` / `launched_as` was marked as depending
    on its launch configuration (`sensitive`, known when the block ends)."""

    sensitive = False


@contextlib.contextmanager
def watching(config):
    """Within the block, a compile's `mark_launch_config_sensitive()` is seen: yields a
    `Marks`. As numba's compile decides (its `_is_kernel_launch_config_sensitive()` when
    the compile ends), a mark on the launch configuration counts whether this compile set
    it or it was there before (the program marked the dispatcher first, or an earlier
    compile of this configuration did): when in doubt, the kernel is keyed by its launch."""
    marks = Marks()
    try:
        yield marks
    finally:
        marks.sensitive = config is not None and bool(config._kernel_launch_config_sensitive)


@contextlib.contextmanager
def launched_as(dispatcher, launch):
    """Within the block (this thread), numba's current launch configuration is a stand-in
    for `launch` = (grid, block, shared memory) on `dispatcher`, as during a launch: a
    target declared for a launch configuration compiles as its launch would compile it.
    Yields the `Marks` of the compile. With `launch` None, nothing changes."""
    if launch is None:
        yield Marks()
        return
    from numba.cuda.cext import _dispatcher
    from numba.cuda.dispatcher import _LaunchConfiguration

    stub = _LaunchConfiguration.__new__(_LaunchConfiguration)
    grid, block, shared = launch
    stub.__dict__.update(dispatcher=dispatcher, griddim=tuple(grid), blockdim=tuple(block),
                         stream=None, sharedmem=int(shared), pre_launch_callbacks=[],
                         _kernel_launch_config_sensitive=None)
    if _state["get_config"] is None:
        original = _state["get_config"] = _dispatcher.get_current_launch_config
        _dispatcher.get_current_launch_config = \
            lambda: getattr(_local, "stub", None) or original()
    saved, _local.stub = getattr(_local, "stub", None), stub
    try:
        with watching(stub) as marks:
            yield marks
    finally:
        _local.stub = saved


def mark_sensitive(kernel) -> None:
    """A kernel rebuilt from the store was compiled for one launch configuration: its
    dispatcher must compile (or fetch) another for other configurations, as numba does."""
    kernel.launch_config_sensitive = True


# -- the simulator ---------------------------------------------------------------------

def install_recorder(record) -> None:
    """Under numba's simulator (NUMBA_ENABLE_CUDASIM=1): `record(kernel, argtypes, launch)`
    is called for each kernel launch, with the arguments typed as numba types them."""
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    if _state["sim_call"] is None:
        original = FakeCUDAKernel.__call__

        @functools.wraps(original)
        def __call__(self, *args):
            recorder = _state["sim_recorder"]
            if recorder is not None and not self._device and not _simulated_context():
                recorder(self, simulator_types(args), _sim_launch(self))
            return original(self, *args)

        FakeCUDAKernel.__call__ = __call__
        _state["sim_call"] = original
    _state["sim_recorder"] = record


def uninstall_recorder() -> None:
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    if _state["sim_call"] is not None:
        FakeCUDAKernel.__call__ = _state["sim_call"]
        _state["sim_call"] = None
    _state["sim_recorder"] = None


def _simulated_context() -> bool:
    from numba.cuda.simulator import kernel

    return kernel._get_kernel_context() is not None


def _sim_launch(fake):
    grid, block = fake.grid_dim, fake.block_dim
    if grid is None or block is None:
        return None
    return (tuple(grid), tuple(block), int(fake.dynshared_size or 0))


def simulator_types(args) -> tuple:
    """The numba types a real launch would compile these arguments for (numba's `typeof`
    for arguments; a simulator device array types as the array it stands for)."""
    from numba import typeof
    from numba.core.typing.typeof import Purpose

    return tuple(typeof(value, Purpose.argument) for value in args)


# -- device functions compiled earlier in this process --------------------------------

def holds_compiled(dispatcher) -> bool:
    """Whether a (device function's) dispatcher holds code numba compiled earlier."""
    return bool(getattr(dispatcher, "overloads", None))


def forget_compiled(dispatcher) -> None:
    """Drop the code a device function's dispatcher holds, so the next compile that calls
    it types it again with the values it reads now (an eager one keeps its only code)."""
    if getattr(dispatcher, "_can_compile", False):
        dispatcher.overloads.clear()


def forget_kernel(dispatcher) -> None:
    """Drop every overload a lazy kernel's dispatcher holds (as numba's own `recompile`
    does first), so its next launch compiles it again: through kbuild's hook, keyed with
    the values it reads then. An eager kernel (compilation disabled) keeps its code."""
    if getattr(dispatcher, "_can_compile", False) and hasattr(dispatcher, "_reset_overloads"):
        dispatcher._reset_overloads()
        getattr(dispatcher, "_launch_config_specializations", {}).clear()


class NumbaDispatchers:
    """`Backend`'s dispatcher methods for numba's dispatchers: numba-cuda's, and the copy
    numba-cuda-mlir vendors (both backends inherit these; see `base.Backend`)."""

    def target_options(self, kernel) -> dict:
        return dict(getattr(kernel, "targetoptions", {}))

    def python_function(self, kernel):
        return getattr(kernel, "py_func", None)

    def holds_compiled(self, dispatcher) -> bool:
        return holds_compiled(dispatcher)

    def forget_code(self, dispatcher) -> None:
        forget_compiled(dispatcher)

    def forget_kernel(self, dispatcher) -> None:
        forget_kernel(dispatcher)

    def kernel_launch_sensitive(self, kernel) -> bool:
        return bool(getattr(kernel, "launch_config_sensitive", False))

    def launched_as(self, kernel, launch):
        return launched_as(kernel, launch)

    def watching(self, config):
        return watching(config)
