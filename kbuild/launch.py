"""Launchers: numba's `kernel[grid, block](...)` syntax, served from the store.

Before the first launch of a target in a process its key is recomputed from
the current sources (once per process, through the project's plan) and the
store must hold exactly that key; otherwise `on_miss` decides: "build" (build
it now, into the store), "error" (raise, naming what changed) or "jit"
(numba's own compile, not stored). Among the declared archs whose entry for
the current key the store holds, the launcher takes the cubin for the
device's exact arch, else the PTX of the highest arch below it (the driver
JITs it). Loading, argument packing and the launch itself are the backend's
(`backend/launcher.py`): arguments are typed once per kind, not per launch.
Under numba's simulator the same selection and key checks run and the
simulator executes the kernel.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from .artifacts import arch_cc, cubin_runs_on
from .discover import Target
from .errors import LaunchError
from .model import RowStatus
from .store.local import CorruptBlob

ON_MISS = ("build", "error", "jit")
_BOUND_LIMIT = 1024  # (device, argument kinds) launches remembered per kernel


class Found(NamedTuple):
    """A stored artifact chosen for a device: which arch, cubin or ptx, its bytes, and
    the files a PTX must be linked with before it loads (see `_ptx_links`)."""

    arch: str
    kind: str
    manifest: dict
    binary: bytes
    links: tuple = ()
    located: str = ""  # the folders a debug binary's source paths were put back to

    @property
    def loaded_as(self) -> str:
        """What the binary loaded for this is known by in this process: its blob, and for a
        debug binary the folders put into it (two checkouts in one process load their own)."""
        blob = self.manifest["artifacts"][self.kind]
        return f"{blob}@{self.located}" if self.located else blob


class KernelLauncher:
    """One declared kernel of a project; index it with a launch configuration."""

    def __init__(self, project, resolved, on_miss: str = "build"):
        if on_miss not in ON_MISS:
            raise ValueError(f"on_miss must be one of {ON_MISS}, not {on_miss!r}")
        self.project = project
        self.resolved = resolved
        self.name = resolved.spec.name
        self.on_miss = on_miss
        self._ready: dict = {}  # (signature, device arch) -> what launches it
        self._bound: dict = {}  # (device id, argument kinds) -> launch(args, config)
        self._simulated = resolved.backend.simulating()
        self._launching = None  # the backend's launcher module, imported on first use
        if getattr(resolved.spec, "launches", ()):
            raise LaunchError(
                f"kernel '{self.name}' is declared for launch configurations (launch = "
                "[...]): launch it through its own dispatcher after kbuild.enable(), which "
                "takes the build made for each launch configuration")

    def __getitem__(self, config):
        if type(config) is not tuple or not 2 <= len(config) <= 4:
            raise ValueError("launch with kernel[griddim, blockdim] "
                             "or kernel[griddim, blockdim, stream, sharedmem]")
        return _Configured(self, config)

    def __repr__(self):
        return f"<kbuild kernel {self.name}>"

    def launch(self, config: tuple, args: tuple) -> None:
        """Launch with `config` = (griddim, blockdim[, stream[, sharedmem]]): after the
        first launch with arguments of these kinds, a dict look-up and the packing."""
        backend = self._launching or self._backend()
        key = (None if self._simulated else backend.current_device(), backend.kinds_of(args))
        bound = self._bound.get(key)
        if bound is None:
            bound = self._first_launch(key, args)
        bound(args, config)

    def _backend(self):
        """The launcher module of the kernel's backend (`backend.launcher` for numba-cuda),
        imported on first use (it imports cuda.core)."""
        if self._launching is None:
            self._launching = self.resolved.backend.launcher()
        return self._launching

    def _first_launch(self, key, args):
        backend = self._backend()
        device, kinds = key
        signature = self.signature_for(args, kinds)
        device_arch = current_arch(self.resolved.spec.archs, device)
        bound = self.prepare(signature, device_arch).bind(kinds)
        if backend.cacheable(kinds):
            if len(self._bound) >= _BOUND_LIMIT:
                self._bound.clear()
            self._bound[key] = bound
        return bound

    # -- selection --------------------------------------------------------------

    def signature_for(self, args, kinds=None) -> str:
        """The declared signature matching the arguments' numba types."""
        backend = self._backend()
        kinds = kinds or backend.kinds_of(args)
        actual = backend.argument_types(args, kinds)
        declared = self.resolved.argtypes
        chosen = next((text for text, types_ in declared.items() if tuple(types_) == actual),
                      None) or next((text for text, types_ in declared.items()
                                     if len(types_) == len(actual)
                                     and all(map(backend.compatible, actual, types_))), None)
        if chosen is not None:
            self._refuse_misread(kinds, chosen)
            return chosen
        raise LaunchError(
            f"no declared signature of '{self.name}' matches the arguments "
            f"({', '.join(str(t) for t in actual)}); declared: {', '.join(declared)}")

    def _refuse_misread(self, kinds, signature: str) -> None:
        """numba types a `__cuda_array_interface__` array with byte strides equal to its
        dtype's width in bits as contiguous (a numba-cuda bug, vendored by numba-cuda-mlir
        too): the kernel it would launch reads the wrong elements, so kbuild refuses that
        launch."""
        i = self._backend().misread(kinds, self.resolved.argtypes[signature])
        if i is not None:
            raise LaunchError(
                f"argument {i} of '{self.name}' is a __cuda_array_interface__ array that "
                f"{self.resolved.backend.name} types as contiguous although it is strided "
                f"(numba compares its byte strides with the dtype's width in bits), so "
                f"signature '{signature}' would read the wrong elements; pass a contiguous "
                f"copy, or declare the argument with layout 'A' (e.g. float32[:])")

    def prepare(self, signature: str, device_arch: str | None = None):
        """What launches `signature` on the device, loaded once per process."""
        device_arch = device_arch or current_arch(self.resolved.spec.archs)
        ready = self._ready.get((signature, device_arch))
        if ready is None:
            found = self.artifact(signature, device_arch)
            ready = self._ready[(signature, device_arch)] = \
                _JitLaunch(self.resolved.kernel) if found is None or self._simulated \
                else self._launchable(found, signature, device_arch)
        return ready

    def artifact(self, signature: str, device_arch: str, built: bool = False) -> Found | None:
        """The stored artifact to launch on `device_arch`, after the key check;
        None when on_miss='jit' compiles with numba instead."""
        stored = self.stored_entries(signature)
        arch, kind = choose_artifact(tuple(stored), device_arch)
        wanted, _ = choose_artifact(self.resolved.spec.archs, device_arch)
        target = Target(self.name, signature, wanted) if wanted else None
        if arch is not None:
            try:
                stored_binary = self.project.store.read_blob(stored[arch]["artifacts"][kind])
                # A debug binary names its source files against placeholders: this
                # checkout's folders go back in before anything loads it.
                binary, located = self.project.located(stored_binary)
                links = self._ptx_links(stored[arch], binary, signature, device_arch) \
                    if kind == "ptx" else ()
                return Found(arch, kind, stored[arch], binary, links, located)
            except CorruptBlob as exc:
                why = str(exc)
        elif target is None:
            why = (f"nothing is declared for {device_arch} or below "
                   f"(declared archs: {', '.join(self.resolved.spec.archs)})")
        else:
            why = self._why_stale(target)
        if built:  # just built, yet still unusable: never loop
            raise LaunchError(f"kernel '{self.name}' {signature}: built into store "
                              f"{self.project.store.root} but still unusable: {why}")
        return self._miss(signature, target, device_arch, why)

    def stored_entries(self, signature: str) -> dict:
        """arch -> manifest, for the declared archs the store holds at the current key."""
        stored = {}
        for arch in self.resolved.spec.archs:
            manifest = self._fresh_manifest(Target(self.name, signature, arch))
            if manifest is not None:
                stored[arch] = manifest
        return stored

    def _ptx_links(self, manifest: dict, ptx: bytes, signature: str, device_arch: str):
        """What a stored PTX must be linked with for `device_arch`: the files (and code
        objects) its compile linked into the cubin (`link=`, declare_device), when the PTX
        calls into them. The entry is fresh, so they hold the bytes it was built with."""
        from .artifacts import ptx_unresolved
        from .builder import observed_record
        from .keying.observed import Kind

        needed = ptx_unresolved(ptx)
        if manifest.get("cooperative"):  # cudadevrt's, linked by the loader
            needed = {name for name in needed if not name.startswith("cuda")}
        if not needed:
            return ()
        record = observed_record(self.project.store, manifest)
        names = [o.name for o in (record.sets[0].observations if record and record.sets else ())
                 if o.kind is Kind.LINK]
        files = tuple(os.path.join(self.project.config.root, n) for n in names)
        # Code given as objects (cuda.CUSource) is keyed by content, so the live
        # kernel's are the ones it was built with; the compile records only paths.
        code = tuple(item for item in self._options().get("link") or ()
                     if not isinstance(item, (str, os.PathLike)))
        if not files + code or not all(os.path.isfile(f) for f in files):
            raise LaunchError(
                f"kernel '{self.name}' {signature}: its {manifest['arch']} PTX calls "
                f"{', '.join(sorted(needed))}, code its cubin was linked with, and kbuild "
                f"cannot link it for device {device_arch} here; add {device_arch} to the "
                "kernel's archs and build")
        return files + code

    def _fresh_manifest(self, target):
        # The launcher's own plan (every declared arch, keyed once per process).
        the_plan = self.project.plan([self.name])
        if target in the_plan.failed:
            raise the_plan.failed[target]
        # Two levels (static key, then what the compile observed): see builder.fresh_entry.
        return self.project.fresh_entry(the_plan, target)

    def _why_stale(self, target) -> str:
        rows = self.project.status([self.name], [target.arch])
        row = next(r for r in rows if r["signature"] == target.signature)
        return f"{row['status']}: {'; '.join(row['reasons'])}"

    def _miss(self, signature, target, device_arch, why):
        if self.on_miss == "error" or (self.on_miss == "build" and target is None):
            raise LaunchError(f"kernel '{self.name}' {signature} has no usable artifact "
                              f"for device {device_arch}: {why}")
        if self.on_miss == "jit":
            return None
        if self._simulated:
            self._build_in_subprocess(target)
        else:
            rows = self.project.build([self.name], [target.arch])
            failed = [r for r in rows if r.signature == signature and r.status == RowStatus.FAILED]
            if failed:
                raise LaunchError(
                    f"kernel '{self.name}' {signature} failed to build: {failed[0].error}")
        return self.artifact(signature, device_arch, built=True)

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

    # -- loading ----------------------------------------------------------------

    def _launchable(self, found: Found, signature: str, device_arch: str):
        backend = self._backend()
        if backend.needs_numba_kernel(self._options()):
            return backend.NumbaKernel(self._numba_kernel(found, signature, device_arch))
        cooperative = bool(found.manifest.get("cooperative"))
        kernel = backend.load(found.loaded_as, found.binary, found.kind,
                              found.manifest["entry"], cooperative, arch_cc(device_arch),
                              found.links)
        return backend.StoredKernel(kernel, self.resolved.argtypes[signature], cooperative)

    def install(self, signature: str) -> bool:
        """Hand the stored kernel of `signature` to the project's own dispatcher (what
        `Project.install()` does per signature); False when the dispatcher compiles it
        itself (the simulator, on_miss="jit")."""
        device_arch = current_arch(self.resolved.spec.archs)
        found = self.artifact(signature, device_arch)
        if found is None or self._simulated:
            return False
        self._backend().install(self.resolved.kernel, found, self.resolved.argtypes[signature],
                                arch_cc(device_arch), self._options())
        return True

    def numba_kernel(self, signature: str):
        """numba-cuda's own `_Kernel` for a declared signature, from the store (what
        `Project.install()` hands to dispatchers); None when numba compiles it instead."""
        device_arch = current_arch(self.resolved.spec.archs)
        found = self.artifact(signature, device_arch)
        if found is None or self._simulated:
            return None
        return self._numba_kernel(found, signature, device_arch)

    def _numba_kernel(self, found: Found, signature: str, device_arch: str):
        return self.resolved.backend.rebuilt_kernel(
            found.manifest, self.resolved.argtypes[signature], found.binary, found.kind,
            arch_cc(device_arch), self._options(),
            py_func=self.resolved.backend.python_function(self.resolved.kernel),
            links=found.links)

    def _options(self) -> dict:
        return self.resolved.backend.target_options(self.resolved.kernel)


class _Configured:
    """`kernel[griddim, blockdim, stream, sharedmem]`, ready to be called."""

    __slots__ = ("launcher", "config")

    def __init__(self, launcher, config):
        self.launcher = launcher
        self.config = config

    def __call__(self, *args):
        self.launcher.launch(self.config, args)


class _JitLaunch:
    """numba's own dispatcher (the simulator, or on_miss='jit')."""

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher

    def bind(self, kinds):
        return self.launch

    def launch(self, args, config):
        self.dispatcher[config](*args)


def choose_artifact(built_archs, device_arch: str):
    """(arch, 'cubin' | 'ptx') for a device: its exact arch, else its arch-specific
    target's cubin ('sm_90a' on an sm_90), else the best PTX below it."""
    if device_arch in built_archs:
        return device_arch, "cubin"
    own = sorted(a for a in built_archs if cubin_runs_on(a, device_arch))
    if own:
        return own[0], "cubin"
    device = arch_cc(device_arch)[:2]
    below = [a for a in built_archs if arch_cc(a)[:2] <= device and len(arch_cc(a)) == 2]
    if below:
        return max(below, key=lambda a: arch_cc(a)), "ptx"
    return None, None


def current_arch(declared_archs, device: int | None = None) -> str:
    """The arch of a device (default: the current one); under the simulator, the highest
    declared arch."""
    if _simulating():
        return max(declared_archs, key=arch_cc)
    backend = _driver_side()
    return backend.device_arch(backend.current_device() if device is None else device)


def _simulating() -> bool:
    from .backend.backends import DEFAULT, get

    return get(DEFAULT).simulating()


def _driver_side():
    """backend/launcher.py (devices and their archs, whatever the backend), imported on
    first use (it imports cuda.core)."""
    from .backend.backends import DEFAULT, get

    return get(DEFAULT).launcher()
