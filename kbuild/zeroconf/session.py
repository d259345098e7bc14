"""What `kbuild.enable()` does each time numba is about to compile a kernel.

For a (kernel, argument types) on the current device, `Session.__call__`:

1. names the target as `kbuild build` would (`naming`) and spells its signature
   (the declared text when the project file declares these types, else `sigtext`);
2. keys it with kbuild's own Keyer and `builder.target_key`, the key a declared target
   of that name, signature and arch gets (a fresh Keyer per compile: the program may
   have changed a global since the last one, and the key must say what numba reads now);
3. looks the key up through the build service (`builder.service`: the store and the
   remote behind it, checking what the compile observed as a build does); for a
   launch-triggered compile, also under the key of the current launch configuration,
   where a kernel that depends on it is kept (see keying/launch.py);
4. on a miss (on_miss="build"), has the build service take the key's lock, look
   again (another process may have built it meanwhile), relink it from stored objects
   or compile it in this process, and commit it (`BuildService.ensure`); a compile
   marked launch-config sensitive is committed under the key of its launch
   configuration, and keeps no objects;
5. has the kernel's backend hand the stored cubin to its dispatcher
   (`Backend.dispatcher_kernel`: numba-cuda's own kernel object, bound to its key).

What stays here is zero-config's own: naming, the journal, numba's compiled device
functions kept in step with kbuild's compiles, the other archs asked for, fallbacks.

Before step 2, the program journal (`journal`) may answer: when the live digest of what
this compile's key rests on is one the journal holds from an earlier run, the key is the
journal's, and steps 2-3 are its look-up (checked as step 3 checks it); anything else is
keyed in full, and the journal keeps the new key at exit.

Whatever it cannot do falls back to numba's own compile, with one warning naming the
kernel and why: a kernel kbuild cannot key (a value it cannot hash by content), a store
it cannot write, a compile kbuild's backend fails (numba then raises its own error).
Never an entry keyed by identity.
"""

from __future__ import annotations

import random
import sys
import warnings
from collections import Counter

from ..errors import KbuildError, KeyingError, LaunchError
from ..sources import ProjectSources, note_source
from . import cellwatch


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
        from ..config import ProjectConfig
        from .background import setting

        self.settings = settings
        self.store = self._storage(settings)
        project = settings.config
        self.config = ProjectConfig(
            path=settings.root / "kbuild.toml", name=settings.name, paths=settings.roots,
            archs=settings.archs or ("sm_80",), store=settings.store, kernels=(),
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
        self._compiled: dict = {}  # device py_func -> its key digest when kbuild compiled it
        self._verify = _verify_share()  # KBUILD_VERIFY: the share of served kernels checked
        self._first_keyed: dict = {}  # device py_func -> its key digest when first keyed here
        self.journal = self._journal(journal)
        self._live = None  # (journal target id, live digest) of the compile being served
        self._background_jobs = setting(background)
        self.background = None  # the helper rebuilding the program's kernels (`background`)
        self._compiling = False  # the kernel being served was compiled (not relinked)
        self._named_compiles = 0  # compiles of kernels the helper would build too
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
        from ..store.remote import remote_settings
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
                sensitive = getattr(kernel, "launch_config_sensitive", False)
                self.recording.add(request.py_func, request.argtypes, name, text,
                                  self._device_arch_or_none(request),
                                  request.launch if sensitive else None)

    def _named(self, request):
        from . import naming, sigtext

        name = naming.target_name(request.py_func, self.declared)
        module = sys.modules.get(request.py_func.__module__)
        backend = _backend_of(request.dispatcher)
        text = self._declared_text(name, request.argtypes, module, backend) or \
            sigtext.checked_text(request.argtypes, module, backend) or \
            sigtext.text(request.argtypes) or \
            "void(" + ", ".join(str(t) for t in request.argtypes) + ")"
        return name, text

    def _declared_text(self, name, argtypes, module, backend):
        """The project file's own text for these types, if it declares them for `name`:
        the entry it builds names that text."""
        from .sigtext import matching_text

        spec = self.declared.get(name)
        return matching_text(spec.signatures, argtypes, module, backend) if spec else None

    def _serve(self, request, name: str, text: str):
        from ..builder import BuildService

        _check_source(request.py_func, request.options)
        device_arch = self._device_arch(request)
        arch = self._compile_arch(request, device_arch)
        answered = self._journaled(request, name, text, arch, device_arch)
        if answered is not None:
            return answered
        plan, targets = self._plan(request, name, text, arch)
        self._check_reused_callees(plan)
        service = BuildService(plan, self.store)
        manifest, served = self._lookup(service, targets[0], request)
        if manifest is None:
            if self.settings.on_miss == "error":
                raise LaunchError(f"kernel '{name}' {text} is not in store {self.store.root} "
                                  f"for {device_arch} (on_miss='error')")
            if self.settings.on_miss == "jit" or not self._writable():
                self.counts["fallback"] += 1
                return None
            manifest, served = self._build(service, targets, request)
            self._start_background(name, text, arch)
            if manifest is None:
                self.counts["fallback"] += 1
                return None  # kbuild's compile failed: numba compiles, and raises its error
        else:
            self.counts["hits"] += 1
            if self._verify and random.random() < self._verify:
                manifest, served = self._verified(service, served, manifest)
                if manifest is None:
                    self.counts["fallback"] += 1
                    return None  # a fresh build fails: numba compiles it, and says why
        self._remember(served, name, text, plan, manifest)
        kernel = self._load(manifest, served, request, device_arch,
                            plan.kernels[served.name].backend, plan.keys[served].digest)
        cellwatch.follow(request.dispatcher, plan.keyer)  # a notebook's: see cellwatch
        return kernel

    def _verified(self, service, served, manifest):
        """KBUILD_VERIFY: the entry `served` rebuilt from source here, reusing nothing
        this process or the store made, and compared byte for byte (see builder.verify):
        (the entry to load, its target), the fresh build's when the stored one differs,
        (None, None) when a fresh build fails. Checked before the launch, so a binary
        that differs is never launched."""
        for disp in service.plan.keyer.device_functions:
            self._compiled.pop(_function_of(disp), None)
        outcome, seconds = service.compile_fresh(served, manifest)
        self.counts["verified"] += 1
        label = f"{served.name} {served.signature} {served.arch}"
        with self.store.shared():
            differ, _ = service.compared(served, manifest, outcome, seconds,
                                         record_failure=False)
        if isinstance(differ, Exception):
            self.warn(f"kbuild: {label}: the store holds a binary a fresh build cannot make "
                      f"({str(outcome).splitlines()[0]}); entry removed, numba compiles it "
                      "(please report this)")
            return None, None
        if not differ:
            return manifest, served
        self.counts["differ"] += 1
        self.warn(f"kbuild: {label}: the cached binary differs from a fresh build; kbuild "
                  "keyed nothing that changed (please report this); the entry is replaced "
                  "and the fresh build launched")
        return service.fresh_as_stored(served)

    def _check_reused_callees(self, plan) -> None:
        """numba compiles a device function once per argument types in a process and
        reuses that code for every later kernel, with the values it read then. A device
        function whose key has changed since this process first keyed it (a global it
        reads set at run time), and whose earlier code numba holds, is reused by numba's
        compile of this kernel: kbuild's, typed again with today's values, would compute
        something else (KbuildError: numba compiles it)."""
        for disp in plan.keyer.device_functions:
            func = _function_of(disp)
            node = plan.keyer.nodes.get(func)
            if node is None:
                continue
            first = self._first_keyed.setdefault(func, node.digest)
            if first != node.digest and _backend_of(disp).holds_compiled(disp):
                raise KbuildError(
                    f"device function {func.__qualname__} changed since numba "
                    "compiled it in this process (a value it reads was set at run time); "
                    "numba reuses that code, so numba compiles this kernel")

    def _start_background(self, name: str, text: str, arch: str) -> None:
        """After the second compile (not a relink) of a kernel the program launched last
        time (the journal names it) or the project file declares: the other such kernels
        built in a helper process while the program goes on (`background`), once per
        process. Not after the first: an edit of a device function's body leaves its
        callers' objects as they were, and the program relinks them faster than a helper
        starts; a second compile says the kernels need compiling (a cold store, a
        changed kernel or signature), which workers do in parallel."""
        from .background import Background, targets
        from .journal import target_id

        compiled, self._compiling = self._compiling, False
        if self._background_jobs < 1 or self.background is not None or not compiled:
            return
        tid = target_id(name, text, arch)
        known = self.journal is not None and tid in self.journal.last_run()
        if not known and name not in self.declared:
            return
        self._named_compiles += 1
        if self._named_compiles < 2:
            return
        try:
            wanted = targets(self.journal, self.declared, arch, tid)
            self.background = Background.start(self.settings, wanted, self._background_jobs)
        except Exception as exc:  # noqa: BLE001 - the program compiles as it goes
            self.warn(f"kbuild: no background build ({type(exc).__name__}: {exc})")
        self._background_jobs = self._background_jobs if self.background else 0

    # -- the program journal ----------------------------------------------------------

    def _journaled(self, request, name: str, text: str, arch: str, device_arch: str):
        """The kernel served under the key the journal holds for what this compile's key
        rests on now (`journal.LiveDigest`), or None: keyed in full. `arch` is the one
        compiled for (`_compile_arch`), `device_arch` the device's. Under KBUILD_VERIFY
        every kernel is keyed in full, and so checked."""
        from ..builder import new_keyer
        from ..discover import Target
        from ..store.local import CorruptBlob
        from .journal import live_digest, target_id

        self._live = None
        # A notebook's kernels follow its cells (`cellwatch`), which the key tree tells.
        if self.journal is None or request.launch_sensitive or self._verify \
                or cellwatch.active():
            return None
        backend = _backend_of(request.dispatcher)
        keyer = new_keyer(self.config, sources=self.sources)
        live = live_digest(keyer, keyer.objects, request, text, arch, backend)
        if live is None:
            self.journal.counts["not vouched"] += 1
            return None
        tid = target_id(name, text, arch)
        self._live = (tid, live)
        held = self.journal.held_for(tid, live)
        if held is None:
            return None
        key, target = held.key, Target(name, text, arch)
        try:
            manifest = self._journal_entry(held, target, request, backend, keyer)
        except Exception:  # noqa: BLE001 - the full look-up meets it and says what it is
            manifest = None
        if manifest is None:
            self.journal.counts["missed"] += 1
            return None
        try:
            kernel = self._load(manifest, target, request, device_arch, backend, key)
        except CorruptBlob:  # its binary is gone or damaged (said once): the full look-up
            self.journal.counts["missed"] += 1  # finds the entry broken and rebuilds it
            return None
        self.counts["hits"] += 1
        self.journal.counts["answered"] += 1
        self.journal.launched(tid)
        return kernel

    def _journal_entry(self, held, target, request, backend, keyer):
        """The entry for a key the journal gave: the entry the journal checked before when
        it is the same (`journal.checked_entry`), else the build service's look-up (the
        entry verified, and the observation set of what its compile read matched against
        this process)."""
        from ..builder.entries import digests_now, expected
        from ..builder.service import fresh_at_key
        from .journal import checked_entry

        current = digests_now(keyer.sources, self.config.root)
        manifest = checked_entry(self.store, held, current,
                                 expected(target, request.dispatcher, backend))
        if manifest is not None:
            return manifest
        return fresh_at_key(self.store, held.key, target, request.dispatcher, backend,
                            keyer.sources, self.config.root)

    def _remember(self, served, name: str, text: str, plan, manifest) -> None:
        """A compile keyed in full and served from its static key: the journal keeps its
        key, and its entry's identity, for the live digest taken before keying."""
        from .journal import held_entry

        live, self._live = self._live, None
        if live is None or served.launch is not None or served.name != name \
                or served.signature != text or served not in plan.keys:
            return
        key = plan.keys[served].digest
        self.journal.remember(live[0], live[1], held_entry(self.store, key, manifest))
        self.journal.launched(live[0])

    def _plan(self, request, name: str, text: str, device_arch: str):
        from ..builder import Plan, new_keyer, target_key
        from ..config import KernelSpec
        from ..discover import ResolvedKernel, Target

        archs = (device_arch,) + tuple(a for a in self.settings.archs if a != device_arch)
        backend = _backend_of(request.dispatcher)
        spec = KernelSpec(name, (text,), archs, backend=backend.name)
        resolved = ResolvedKernel(spec, request.dispatcher, {text: tuple(request.argtypes)},
                                  backend=backend)
        keyer = new_keyer(self.config, sources=self.sources)
        targets = [Target(name, text, arch) for arch in archs]
        keys = {t: target_key(keyer, resolved, t) for t in targets}
        return Plan(self.config, {name: resolved}, list(targets), keys, keyer), targets

    # -- the store --------------------------------------------------------------------

    @staticmethod
    def _lookup(service, target, request):
        """(the fresh entry for `target`, the target it was found as), or (None, None):
        its static key, then (in a launch) the key of the current launch configuration
        (first, when numba already knows its kernels depend on their launch)."""
        return service.fresh_in_launch(target, request.launch, request.launch_sensitive)

    def _writable(self) -> bool:
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

    def _build(self, service, targets, request):
        """Build (relink or compile, and commit) the targets through the build service,
        the device's first; (its entry, the target it is stored as), or (None, None)
        when the compile failed."""
        first = targets[0]
        manifest, served = self._ensure(service, first, request,
                                        lambda t: self._lookup(service, t, request))
        if manifest is None:
            return None, None
        if len(targets) > 1:
            self._build_others(service, targets[1:], served, request)
        return manifest, served

    def _build_others(self, service, others, served, request):
        """The same kernel for the other archs asked for (`archs=`): a store for a fleet."""
        for other in others:
            if served.launch is not None:
                other = service.for_launch(other, served.launch)
            self._ensure(service, other, request)
        # Device functions now hold code for another arch: typed again when next needed.
        for disp in service.plan.keyer.device_functions:
            _backend_of(disp).forget_code(disp)
            self._compiled.pop(_function_of(disp), None)

    def _ensure(self, service, target, request, lookup=None):
        """`service.ensure` as zero-config builds: compiled in this process (numba's
        compiled device functions kept in step, `_compiled_now`), committed under the
        key of its launch configuration when the compile depends on it; a failure warns
        (numba compiles it). (entry, target as stored) or (None, None)."""
        marks, placed = [], []
        backend = _backend_of(request.dispatcher)

        def produce(target):
            with backend.watching(request.config) as watched:
                marks.append(watched)
                return service.produce(target, compile=lambda t: self._compiled_now(service, t))

        def place(target, outcome):
            placed.append(target)
            if (marks[-1].sensitive or request.launch_sensitive) and target.launch is None \
                    and request.launch is not None:
                self._forget_launch_specific(service.plan, target, outcome)
                return service.for_launch(target, request.launch)
            return target

        manifest, found = service.ensure(target, lookup=lookup, produce=produce, place=place)
        self.counts["built"] += len(placed)  # committed (found under the lock: not ours)
        if manifest is not None and not placed:
            self.counts["awaited"] += 1  # another process (the background build) made it
        if manifest is None and isinstance(found, Exception):
            self.warn(f"kbuild: {target.label}: {str(found).splitlines()[0]}; "
                      "numba compiles it")
            return None, None
        return manifest, found

    def _forget_launch_specific(self, plan, target, outcome) -> None:
        """What a compile marked launch-config sensitive made for its launch alone: its
        objects, and the device functions numba typed meanwhile (typed again for the next
        launch configuration, as a fresh process types them)."""
        made = [o.key for o in outcome.objects]
        plan.kernels[target.name].backend.forget_compiled(objects=made)
        for disp in plan.keyer.device_functions:
            _backend_of(disp).forget_code(disp)
            self._compiled.pop(_function_of(disp), None)

    def _compiled_now(self, service, target):
        """Compile in this process. A device function numba compiled earlier here holds
        the values it read then: it is typed again if its key has changed since."""
        keyer = service.plan.keyer
        for disp in keyer.device_functions:
            node = keyer.nodes.get(_function_of(disp))
            if _backend_of(disp).holds_compiled(disp) and node is not None \
                    and self._compiled.get(_function_of(disp)) != node.digest:
                _backend_of(disp).forget_code(disp)
        self._compiling = True  # a compile, not a relink (see `_start_background`)
        outcome = service.compile(target, early_cutoff=False)
        for disp in keyer.device_functions:
            node = keyer.nodes.get(_function_of(disp))
            if node is not None and _backend_of(disp).holds_compiled(disp):
                self._compiled[_function_of(disp)] = node.digest
        return outcome

    # -- loading ----------------------------------------------------------------------

    def _load(self, manifest, served, request, device_arch, backend, key: str):
        from ..config import arch_cc

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
        return _backend_of(request.dispatcher).compile_arch(device_arch)

    def _device_arch_or_none(self, request):
        try:
            return self._device_arch(request)
        except Exception:  # noqa: BLE001 - no driver: numba says so when it compiles
            return None

    @staticmethod
    def _device_arch(request) -> str:
        return _backend_of(request.dispatcher).current_arch()

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


def _verify_share() -> float:
    """KBUILD_VERIFY as a share of served kernels to check: `1` all, `10%` or `0.1` a
    random tenth, unset or `0` none (a value that does not parse checks all: asked for
    checking, a typo must not turn it off)."""
    import os

    text = os.environ.get("KBUILD_VERIFY", "").strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return 0.0
    if text in ("1", "true", "yes", "on"):
        return 1.0
    try:
        share = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        return 1.0
    return min(max(share, 0.0), 1.0)


def _check_source(py_func, options) -> None:
    """A kernel kbuild keys belongs to a module with a source file: its entry is bound to
    the module numba names in its symbols, and what it reads is the module's. Its own code
    may have been made by `exec` in that module's namespace (numba's `vectorize` and
    `guvectorize` make their kernels so): keying then takes its bytecode, which is what
    numba compiles. A notebook's namespace has no file but keeps each cell's text
    (`cells`): its kernels are keyed from that text. One typed at a plain prompt, or made
    by `exec` of a string whose text was not kept, has neither (KeyingError: numba
    compiles it)."""
    import os

    from .. import cells
    from ..sources import note_rerun_script

    if py_func.__module__ == "__main__":
        note_rerun_script(py_func.__code__)  # `%run script.py` again, after an edit
    module = sys.modules.get(py_func.__module__) if py_func.__module__ else None
    filename = getattr(module, "__file__", None)
    if module is not None and filename and os.path.isfile(filename) \
            and (py_func.__globals__ is vars(module) or _made_by_numba(py_func)):
        return
    if not cells.namespace_source(py_func):
        raise KeyingError(cells.unkeyable_reason(py_func))
    if (options.get("lineinfo") or options.get("debug")) \
            and cells.is_registered(py_func.__code__.co_filename):
        # Its binary would name the cell's file, which names this process (ipykernel's
        # /tmp/ipykernel_<pid>/...): not what another process's compile writes.
        raise KeyingError(f"a lineinfo or debug kernel names its cell's file "
                          f"({py_func.__code__.co_filename}) in its binary, and that name "
                          "is this process's; define it in a module to cache it")


def _made_by_numba(py_func) -> bool:
    """A kernel numba's ufunc builders made by `exec` over a copy of the user's module
    namespace (their core function and `cuda` added to it)."""
    return py_func.__code__.co_filename == "<string>" and \
        "__core__" in py_func.__globals__ and py_func.__name__.startswith(("__vectorized_",
                                                                           "__gufunc_"))


def _backend_of(dispatcher):
    """The backend whose dispatcher this is (numba-cuda's when it is no other's)."""
    from ..backend.backends import DEFAULT, get, of_object

    return of_object(dispatcher) or get(DEFAULT)


def _function_of(dispatcher):
    """The Python function a device function's dispatcher compiles (its backend says)."""
    return _backend_of(dispatcher).python_function(dispatcher)

