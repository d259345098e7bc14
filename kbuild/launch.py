"""Launchers: numba's `kernel[grid, block](...)` syntax, served from the store.

Before the first launch of a target in a process its key is recomputed from
the current sources (once per process, through the project's plan) and the
store must hold exactly that key; otherwise `on_miss` decides: "build" (build
it now, into the store), "error" (raise, naming what changed) or "jit"
(numba's own compile, not stored). The artifact is the cubin for the device's
exact arch, else the PTX of the highest built arch not above it (the driver
JITs it). Under numba's simulator the same selection and key checks run and
the simulator executes the kernel.
"""

from __future__ import annotations

from .config import arch_cc
from .discover import Target
from .errors import LaunchError
from .store.local import CorruptBlob

ON_MISS = ("build", "error", "jit")


class KernelLauncher:
    """One declared kernel of a project; index it with a launch configuration."""

    def __init__(self, project, resolved, on_miss: str = "build"):
        if on_miss not in ON_MISS:
            raise ValueError(f"on_miss must be one of {ON_MISS}, not {on_miss!r}")
        self.project = project
        self.resolved = resolved
        self.name = resolved.spec.name
        self.on_miss = on_miss
        self._ready: dict = {}  # (signature, device arch) -> launchable

    def __getitem__(self, config):
        if not isinstance(config, tuple) or len(config) not in (2, 3, 4):
            raise ValueError("launch with kernel[griddim, blockdim] "
                             "or kernel[griddim, blockdim, stream, sharedmem]")
        return _Configured(self, *config)

    def __repr__(self):
        return f"<kbuild kernel {self.name}>"

    # -- selection --------------------------------------------------------------

    def signature_for(self, args) -> str:
        """The declared signature matching the arguments' numba types."""
        actual = tuple(_typeof(a) for a in args)
        declared = self.resolved.argtypes
        for text, types_ in declared.items():
            if tuple(types_) == actual:
                return text
        for text, types_ in declared.items():
            if len(types_) == len(actual) and all(map(_compatible, actual, types_)):
                return text
        raise LaunchError(
            f"no declared signature of '{self.name}' matches the arguments "
            f"({', '.join(str(t) for t in actual)}); declared: {', '.join(declared)}")

    def prepare(self, signature: str):
        """What launches `signature` on the current device, loaded once per process."""
        device_arch = current_arch(self.resolved.spec.archs)
        ready = self._ready.get((signature, device_arch))
        if ready is None:
            ready = self._ready[(signature, device_arch)] = self._load(signature, device_arch)
        return ready

    def _load(self, signature: str, device_arch: str, built: bool = False):
        arch, kind = choose_artifact(self.resolved.spec.archs, device_arch)
        if arch is None:
            return self._miss(signature, None, f"nothing is built for {device_arch} or below "
                              f"(built archs: {', '.join(self.resolved.spec.archs)})")
        target = Target(self.name, signature, arch)
        manifest = self._fresh_manifest(target)
        why = self._why_stale(target) if manifest is None else None
        if manifest is not None:
            try:
                binary = self.project.store.read_blob(manifest["artifacts"][kind])
            except CorruptBlob as exc:
                why = str(exc)
        if why is None:
            return self._launchable(manifest, signature, binary, kind, device_arch)
        if built:  # just built, yet still unusable: never loop
            raise LaunchError(f"kernel '{self.name}' {signature}: built into store "
                              f"{self.project.store.root} but still unusable: {why}")
        return self._miss(signature, target, why)

    def _fresh_manifest(self, target):
        # The launcher's own plan (every declared arch; `target.arch` is one of them).
        the_plan = self.project.plan([self.name])
        from .build import expected

        return self.project.store.lookup(the_plan.keys[target].digest,
                                         expected(target, self.resolved.kernel))

    def _why_stale(self, target) -> str:
        rows = self.project.status([self.name], [target.arch])
        row = next(r for r in rows if r["signature"] == target.signature)
        return f"{row['status']}: {'; '.join(row['reasons'])}"

    def _miss(self, signature, target, why):
        if self.on_miss == "error" or (self.on_miss == "build" and target is None):
            raise LaunchError(f"kernel '{self.name}' {signature} has no usable artifact "
                              f"for device {current_arch(self.resolved.spec.archs)}: {why}")
        if self.on_miss == "jit":
            return _JitLaunch(self.resolved.kernel)
        if _simulating():
            self._build_in_subprocess(target)
        else:
            rows = self.project.build([self.name], [target.arch])
            failed = [r for r in rows if r.signature == signature and r.status == "failed"]
            if failed:
                raise LaunchError(
                    f"kernel '{self.name}' {signature} failed to build: {failed[0].error}")
        return self._load(signature, current_arch(self.resolved.spec.archs), built=True)

    def _build_in_subprocess(self, target):
        """The simulator cannot compile: a real `kbuild build` process builds the target."""
        import os
        import subprocess
        import sys

        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
        done = subprocess.run(
            [sys.executable, "-m", "kbuild", "build", self.name, "--arch", target.arch,
             "--config", str(self.project.config.path), "--store", str(self.project.store.root)],
            env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise LaunchError(f"kernel '{self.name}' failed to build: "
                              f"{(done.stdout + done.stderr).strip()[-2000:]}")

    def _launchable(self, manifest, signature, binary, kind, device_arch):
        if _simulating():
            return _JitLaunch(self.resolved.kernel)  # the simulator runs the Python code
        from .backend.loader import rebuild_kernel

        return _StoredLaunch(rebuild_kernel(
            manifest, self.resolved.argtypes[signature], binary, kind, arch_cc(device_arch),
            dict(getattr(self.resolved.kernel, "targetoptions", {}))))


class _Configured:
    """`kernel[griddim, blockdim, stream, sharedmem]`, ready to be called."""

    def __init__(self, launcher, griddim, blockdim, stream=0, sharedmem=0):
        self.launcher = launcher
        self.config = (griddim, blockdim, stream, sharedmem)

    def __call__(self, *args):
        launcher = self.launcher
        launchable = launcher.prepare(launcher.signature_for(args))
        launchable.launch(args, *self.config)


class _StoredLaunch:
    """A numba-cuda kernel rebuilt from stored artifacts."""

    def __init__(self, kernel):
        self.kernel = kernel

    def launch(self, args, griddim, blockdim, stream, sharedmem):
        from numba.cuda.errors import normalize_kernel_dimensions

        griddim, blockdim = normalize_kernel_dimensions(griddim, blockdim)
        self.kernel.launch(args, griddim, blockdim, stream, sharedmem)


class _JitLaunch:
    """numba's own dispatcher (the simulator, or on_miss='jit')."""

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher

    def launch(self, args, griddim, blockdim, stream, sharedmem):
        self.dispatcher[griddim, blockdim, stream, sharedmem](*args)


def choose_artifact(built_archs, device_arch: str):
    """(arch, 'cubin' | 'ptx') for a device: its exact arch, else the best PTX below it."""
    if device_arch in built_archs:
        return device_arch, "cubin"
    device = arch_cc(device_arch)[:2]
    below = [a for a in built_archs if arch_cc(a)[:2] <= device and len(arch_cc(a)) == 2]
    if below:
        return max(below, key=lambda a: arch_cc(a)), "ptx"
    return None, None


def current_arch(declared_archs) -> str:
    """The current device's arch; under the simulator, the highest declared arch."""
    if _simulating():
        return max(declared_archs, key=arch_cc)
    from numba import cuda

    major, minor = cuda.get_current_device().compute_capability
    return f"sm_{major}{minor}"


def _simulating() -> bool:
    from .backend.compiler import simulating

    return simulating()


def _typeof(value):
    from numba import typeof

    try:
        from numba.cuda.typing.typeof import Purpose
        from numba.cuda.typing.typeof import typeof as cuda_typeof

        return cuda_typeof(value, Purpose.argument)
    except ImportError:
        return typeof(value)


def _compatible(actual, declared) -> bool:
    """Whether numba would pass `actual` where `declared` is expected, without a recompile."""
    from numba.core import types

    if actual == declared:
        return True
    if isinstance(actual, types.Number) and isinstance(declared, types.Number):
        return True
    if isinstance(actual, types.Boolean) and isinstance(declared, (types.Boolean, types.Integer)):
        return True
    if isinstance(actual, types.Array) and isinstance(declared, types.Array):
        return (actual.dtype == declared.dtype and actual.ndim == declared.ndim
                and declared.layout in ("A", actual.layout)
                and (actual.mutable or not declared.mutable))
    return False
