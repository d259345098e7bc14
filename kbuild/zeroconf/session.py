"""What `kbuild.enable()` does each time numba is about to compile a kernel.

For a (kernel, argument types) on the current device, `Session.__call__` tells the story
of a served kernel; each step is a module's:

1. names the target as `kbuild build` would (`naming`) and spells its signature
   (`sigtext.spelled`: the declared text when the project file declares these types);
   a kernel without a source kbuild can key is numba's (`keyable`);
2. asks the program journal (`answered`): when the live digest of what this compile's
   key rests on is one the journal holds from an earlier run, the key is the journal's
   and its entry is loaded, with no key tree;
3. else keys it in full, as a declared target of that name, signature and arch is keyed
   (`keyed.plan`), and has the build service (`builder.service.BuildService`) look it
   up, and on a miss (on_miss="build") lock, look again, relink or compile in this
   process and commit (`keyed.obtained`: numba's compiled device functions kept in step
   by `dispatchers.DeviceCode`, the other archs asked for, a launch-config-sensitive
   compile under its launch's key, KBUILD_VERIFY's fresh build); the journal keeps the
   key found (`answered.remember`), and a second named compile may start the background
   helper (`background.Starter`);
4. has the kernel's backend hand the stored cubin to its dispatcher (`Session.load`:
   `Backend.dispatcher_kernel`, numba-cuda's own kernel object, bound to its key).

Whatever it cannot do falls back to numba's own compile, with one warning naming the
kernel and why: a kernel kbuild cannot key (a value it cannot hash by content), a store
it cannot write, a compile kbuild's backend fails (numba then raises its own error).
Never an entry keyed by identity. The session holds what lives for the process: the
settings, the storage, the journal, the counts, the warnings said.
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter

from ..errors import KbuildError, KeyingError, LaunchError
from ..sources import ProjectSources, note_source
from . import answered, cellwatch, keyed
from .dispatchers import DeviceCode, backend_of
from .keyable import check_source


class ZeroConfigWarning(UserWarning):
    """A kernel compiled by numba instead of served by kbuild, and why."""


class _ProgramSources(ProjectSources):
    """The project's sources as the program imported them: keying facts are kept by the
    digest of each file as first keyed (see `sources.note_source`), so a warm process
    parses nothing."""

    def remembered(self, func, kind, compute):
        code = getattr(func, "__code__", None)
        if code is not None:
            note_source(code.co_filename)
        return super().remembered(func, kind, compute)


class Session:
    """The per-process state of zero-config caching (one per `enable()`)."""

    def __init__(self, settings, journal: bool | None = None, background=None):
        from ..config import DEFAULT_ARCHS, ProjectConfig
        from .background import Starter
        from .settings import verify_share

        self.settings = settings
        self.store = self._storage(settings)
        project = settings.config
        self.config = ProjectConfig(
            path=settings.root / "kbuild.toml", name=settings.name, paths=settings.roots,
            archs=settings.archs or DEFAULT_ARCHS, store=settings.store, kernels=(),
            remote_timeout=getattr(project, "remote_timeout", None))
        self.declared = {spec.name: spec for spec in getattr(project, "kernels", ())}
        self.sources = _ProgramSources(settings.roots, facts_dir=self.store.base / "facts")
        self.counts: Counter = Counter()  # served, built, fallback (for tests and reports)
        self.served: list = []  # (target name, signature, arch, key) of what was handed over
        self.recording = None
        if settings.record is not None:
            from .record import LaunchRecording

            self.recording = LaunchRecording(settings.record, self.declared)
        self._warned: set = set()
        self._unwritable: str | None = None
        self.device_code = DeviceCode()  # what numba's device functions hold, by key
        self.verify = verify_share()  # KBUILD_VERIFY: the share of served kernels checked
        self.journal = self._journal(journal)
        self.starter = Starter(background)  # when the background helper starts
        for message in settings.warnings:
            self.warn(message)
        import atexit

        atexit.register(self.log_counts)

    def log_counts(self) -> None:
        """Add what this process asked of the store to its stats log (`kbuild stats`), once,
        at exit: one small append, nothing on the way to a launch."""
        from ..store.statslog import ZEROCONF_SOURCE, record_build

        counts = {"cached": self.counts["hits"], "built": self.counts["built"],
                  "fallback": self.counts["fallback"]}
        if not any(counts.values()) or self.__dict__.get("_logged"):
            return
        self._logged = True
        try:
            if self.store.exists():
                self.store.trust()
                record_build(self.store, counts, project=self.settings.name,
                             source=ZEROCONF_SOURCE)
        except Exception:  # noqa: BLE001 - statistics never fail the program at its exit
            pass

    @property
    def background(self):
        """The helper rebuilding the program's kernels (`background`), once started."""
        return self.starter.background

    def _journal(self, wanted):
        """The program journal (`journal`), unless turned off; saved at exit."""
        import atexit

        from .journal import ProgramJournal, enabled_by_environment

        if wanted is False or wanted is None and not enabled_by_environment():
            return None
        found = ProgramJournal(self.store, self.settings)
        atexit.register(found.save)
        return found

    def _storage(self, settings):
        """The store and its remote (`storage`); a remote that cannot be opened is one
        warning at the first compile, and the store is used alone."""
        from ..store.remote_settings import remote_settings
        from ..store.storage import open_storage

        try:
            return open_storage(settings.store, remote=remote_settings(
                settings.config, url=settings.remote or None, no_remote=settings.remote is False))
        except KbuildError as exc:
            self.__dict__.setdefault("_pending", []).append(
                f"kbuild: no remote cache ({exc})")
            return open_storage(settings.store)

    # -- the hook -------------------------------------------------------------------

    def __call__(self, request):
        """The kernel to hand to the dispatcher for `request`, or None: numba compiles."""
        if request.options.get("device"):
            return None
        for message in self.__dict__.pop("_pending", ()):
            self.warn(message)
        try:
            name, text = self._named(request)
        except Exception as exc:  # noqa: BLE001 - naming must never stop a launch
            return self._fallback(request.py_func.__qualname__, f"{type(exc).__name__}: {exc}")
        kernel = None
        try:
            kernel = self._serve(request, name, text)
            return kernel
        except LaunchError:
            raise  # on_miss="error": the program asked for it
        except KeyingError as exc:
            return self._fallback(name, f"kbuild cannot key it: {exc}")
        except Exception as exc:  # noqa: BLE001 - numba's own compile still works
            if isinstance(exc, KbuildError):
                return self._fallback(name, str(exc))
            return self._fallback(name, f"{type(exc).__name__}: {exc}")
        finally:
            self._flush_store_warnings()
            self._save_facts()
            if self.recording is not None:
                self._record(request, name, text, kernel)

    def _named(self, request):
        """(target name, signature text) as `kbuild build` names and spells them."""
        from . import naming, sigtext

        name = naming.target_name(request.py_func, self.declared)
        spec = self.declared.get(name)
        return name, sigtext.spelled(request.argtypes,
                                     sys.modules.get(request.py_func.__module__),
                                     backend_of(request.dispatcher),
                                     spec.signatures if spec else ())

    def _serve(self, request, name: str, text: str):
        """The kernel `name` `text` loaded from the store: the journal's answer, else keyed
        in full, looked up and built; None: numba compiles it."""
        from ..builder import BuildService

        check_source(request.py_func, request.options)
        device_arch = self._device_arch(request)
        arch = self._compile_arch(request, device_arch)
        kernel, live = answered.answer(self, request, name, text, arch, device_arch)
        if kernel is not None:
            return kernel
        plan, targets = keyed.plan(self, request, name, text, arch)
        self.device_code.check_reused(plan.keyer)
        service = BuildService(plan, self.store, in_program=True)
        manifest, served = keyed.obtained(self, service, targets, request, device_arch)
        if manifest is None:
            self.counts["fallback"] += 1
            return None  # numba compiles it (and raises its own error, if it fails)
        answered.remember(self, live, served, name, text, plan, manifest)
        kernel = self.load(manifest, served, request, device_arch,
                           plan.kernels[served.name].backend, plan.keys[served].digest)
        cellwatch.follow(request.dispatcher, plan.keyer)  # a notebook's: see cellwatch
        return kernel

    def _record(self, request, name: str, text: str, kernel) -> None:
        """`kbuild run --record`: the kernel launched, with its launch configuration when
        it was compiled for that one alone."""
        sensitive = kernel is not None and \
            backend_of(request.dispatcher).kernel_launch_sensitive(kernel)
        self.recording.add(request.py_func, request.argtypes, name, text,
                           self._compile_arch_or_none(request),
                           request.launch if sensitive else None)

    def writable(self) -> bool:
        """Whether the store can be written (said once when not: numba compiles what it
        does not hold)."""
        if self._unwritable is None:
            try:
                self.store.check_root()
                self.store.ensure_writable()
                self._unwritable = ""
            except KbuildError as exc:
                self._unwritable = str(exc)
                self.warn(f"kbuild: {exc}; kernels it does not hold are compiled by numba "
                          "and not cached")
        return not self._unwritable

    # -- loading ----------------------------------------------------------------------

    def load(self, manifest, served, request, device_arch, backend, key: str):
        """The kernel `backend` hands the dispatcher for the stored entry `manifest` of
        `served` (its key digest `key`), counted as served."""
        from ..artifacts import arch_cc

        kernel = backend.dispatcher_kernel(request, manifest, self.store.read_blob, device_arch,
                                           arch_cc(device_arch), self.config.paths,
                                           for_launch=served.launch is not None)
        return self._handed_over(kernel, served, key)

    def _handed_over(self, kernel, served, key: str):
        self.counts["served"] += 1
        self.served.append((served.name, served.signature, served.arch, key))
        return kernel

    @staticmethod
    def _compile_arch(request, device_arch: str) -> str:
        """The arch the kernel's backend compiles it for on this device (NUMBA_FORCE_CUDA_CC
        may name another to numba-cuda)."""
        return backend_of(request.dispatcher).compile_arch(device_arch)

    def _compile_arch_or_none(self, request):
        """The arch served on this device (recorded: `kbuild build` then builds the
        targets a launch looks up, sm_90a on an sm_90), None without a driver."""
        try:
            return self._compile_arch(request, self._device_arch(request))
        except Exception:  # noqa: BLE001 - no driver: numba says so when it compiles
            return None

    @staticmethod
    def _device_arch(request) -> str:
        return backend_of(request.dispatcher).current_arch()

    # -- telling the user --------------------------------------------------------------

    def _fallback(self, name: str, why: str):
        self.counts["fallback"] += 1
        self.warn(f"kbuild: {name} is compiled by numba, not cached: {why}")
        return None

    def warn(self, message: str) -> None:
        """Each message once per process."""
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(message, ZeroConfigWarning, stacklevel=2)

    def _save_facts(self) -> None:
        # Only into a store that exists (looking a kernel up creates no store); a store
        # that cannot be written only makes the next process parse again.
        if self.store.base.is_dir():
            self.sources.save_facts()

    def _flush_store_warnings(self) -> None:
        while self.store.warnings:
            self.warn(f"kbuild: {self.store.warnings.pop(0)}")

