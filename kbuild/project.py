"""The project API: what the CLI and programs call. `Project.load()` is the entry point."""

from __future__ import annotations

from . import builder as _build
from .config import ProjectConfig, default_store, load_config
from .errors import KeyingError, StoreError
from .keying.explain import source_diff
from .model import LinkMode, RowStatus, TargetState
from .packaged import FromBundle, load_package
from .store import failures, journal
from .store.history import History, RelinkReasons, explained
from .store.local import Store, is_object, is_target
from .store.storage import open_storage
from .targets import status_head


class Project:
    """A kbuild.toml and the store it builds into."""

    def __init__(self, config: ProjectConfig, store: Store):
        self.config = config
        self.store = store
        self._plans: dict = {}

    @classmethod
    def load(cls, config=None, *, store=None, on_miss: str = "build", read_only: bool = False,
             remote=None, package: str | None = None, verify: str = "sources"):
        """The project of `config` (default: the nearest kbuild.toml) with its store.

        `on_miss` says what a launch does when the store has no fresh artifact:
        "build" it now, raise an "error", or "jit" with numba (not stored).
        `remote` is the shared cache a local miss asks (and a build on a miss pushes to):
        a URL, False for none, or None for the one $KBUILD_REMOTE or the file's
        `[store] remote` names, as `kbuild build` finds it.
        `package`: an installed package's bundle instead of a kbuild.toml (see packaged.py;
        `verify="sources"` there: the installed modules' bytes against the bundle's).
        """
        from .launch import ON_MISS

        if on_miss not in ON_MISS:
            raise ValueError(f"on_miss must be one of {ON_MISS}, not {on_miss!r}")
        if package is not None:
            return load_package(package, PackagedProject, on_miss=on_miss, verify=verify)
        project = open_project(config, store, read_only,
                               remote={"url": remote or None, "no_remote": remote is False})
        project.on_miss = on_miss
        return project

    # -- launching ----------------------------------------------------------

    on_miss = "build"

    def kernel(self, name: str, *, on_miss: str | None = None):
        """A launcher for a declared kernel: `proj.kernel("pkg.mod:k")[grid, block](...)`."""
        from .launch import KernelLauncher

        launchers = self.__dict__.setdefault("_launchers", {})
        spec = _build.select_specs(self.config, [name])[0]
        mode = on_miss or self.on_miss
        if (spec.name, mode) not in launchers:
            resolved = self.plan([spec.name]).resolved(spec.name)
            launchers[(spec.name, mode)] = KernelLauncher(self, resolved, mode)
        return launchers[(spec.name, mode)]

    def __getitem__(self, name: str):
        return self.kernel(name)

    def install(self, names=None) -> list[str]:
        """Make the project's own `@cuda.jit` dispatchers launch from the store.

        Every declared signature is checked for freshness and loaded now, then
        handed to the dispatcher as a compiled overload, so application code
        keeps calling `saxpy[blocks, threads](...)` and numba finds it ready.
        Returns the installed targets.
        """
        installed = []
        for spec in _build.select_specs(self.config, names):
            if spec.launches:
                continue  # one build per launch configuration: kbuild.enable() serves them
            launcher = self.kernel(spec.name)
            for signature in launcher.resolved.argtypes:
                # False: the dispatcher compiles it itself (simulator, on_miss="jit")
                launcher.install(signature)
                installed.append(f"{spec.name} {signature}")
        return installed

    # -- building -----------------------------------------------------------

    def fresh_entry(self, the_plan, target):
        """The entry a launch of `target` uses, or None (see `builder.fresh_entry`; a
        packaged project answers from its bundle)."""
        return self.service(the_plan).fresh(target)

    def service(self, the_plan):
        """The build service (`builder.BuildService`) for `the_plan` against this project's
        store: what a launch looks up and a build builds through."""
        # One digest memo per plan: a launcher asks once per declared arch and signature,
        # and the plan's keys, like these digests, are taken once per process.
        if the_plan.launch_digests is None:
            the_plan.launch_digests = _build.current_digests(the_plan)
        return _build.BuildService(the_plan, self.store, the_plan.launch_digests)

    def located(self, binary: bytes) -> tuple[bytes, str]:
        """A stored binary as this checkout loads it: where a debug or lineinfo binary names
        its source files (written against placeholders, so that one store serves every
        checkout), this checkout's folders (`backend.debugpaths.located`); and what it was
        located to ("" for the stored bytes)."""
        from .backend import located

        return located(binary, self.source_roots())

    def source_roots(self) -> tuple:
        """The folders a debug binary's project paths are relative to: the import roots."""
        return tuple(self.config.paths)

    def plan(self, names=None, archs=None) -> _build.Plan:
        """Resolve and key the requested targets (cached per selection)."""
        cache_key = (tuple(names or ()), tuple(archs or ()))
        if cache_key not in self._plans:
            if "_keyer" not in self.__dict__:
                # Read-only commands (status, keys) read the facts a build wrote, so they
                # compute the keys it computes; only a writable store gets new facts.
                self._keyer = _build.new_keyer(self.config, facts_dir=self.store.base / "facts")
            self._plans[cache_key] = _build.plan(self.config, names, archs, self._keyer)
            self._save_facts()
        return self._plans[cache_key]

    def build(self, names=None, archs=None, *, keep_going=False, jobs=1, progress=None,
              separate=True, executor=None, last_entry=None, **options):
        """Build what is out of date; one `Row` per target. `separate=False` compiles each
        kernel with its device functions as one program, as numba does; `executor`,
        `progress` and `options` (`target_timeout`, `retry_failed`): see `builder.build`;
        `last_entry(target)`: the key of its last build's entry, what a relinked row's
        changes are told against (`RelinkReasons`)."""
        the_plan = self.plan(names, archs)
        the_plan.separate = separate
        relinked_for = RelinkReasons(self.store, the_plan.keys, last_entry)

        def with_reasons(row, done, total):
            # A relinked row names the device functions it was relinked for, before anyone
            # sees it (a terminal prints rows as they finish).
            if row.link == LinkMode.RELINK and row.status == RowStatus.BUILT:
                row.changed = relinked_for(row)
            if progress is not None:
                progress(row, done, total)

        # The build tells `progress.started(target)`, where it has one, as compiles start.
        with_reasons.started = getattr(progress, "started", None)
        rows = _build.build(the_plan, self.store, keep_going=keep_going, jobs=jobs,
                            progress=with_reasons, executor=executor, **options)
        self._save_facts()
        return rows

    def verify(self, rows, names=None, archs=None, *, sample=None, jobs=1,
               target_timeout=None):
        """`rows` of a build (`build`'s, same selection) with the targets the store served
        rebuilt from source in worker processes and compared byte for byte (see
        `builder.verify`): a target whose entry differs from a fresh build fails, and its
        entry is replaced. `sample` (`builder.parse_sample("10%")`) checks a random share."""
        from .builder.verify import Sample

        the_plan = self.plan(names, archs)
        limit = the_plan.config.target_timeout if target_timeout is None else target_timeout
        with self.store.shared():
            return _build.check_served(the_plan, self.store, rows, sample=sample or Sample(),
                                 jobs=jobs, timeout=limit or None)

    def _save_facts(self) -> None:
        # Only into a store that exists and is kbuild's: looking at a project creates no
        # store, and a folder of another program's gets nothing (a build says why).
        if self.store.read_only or not self.store.exists():
            return
        try:
            self.store.claim()
        except StoreError:
            return
        self._keyer.sources.save_facts()

    def status(self, names=None, archs=None, *, diffs: bool = False) -> list[dict]:
        """A dry run: up-to-date, stale or missing for every target, and why.

        A stale target is compared with the stored build of it whose inputs differ least
        (not the newest: after a revert that is the build of what was reverted). With
        `diffs`, each changed body comes with a diff of its source (see `explain`).
        """
        the_plan = self.plan(names, archs)
        history = History(self.store)
        service = _build.BuildService(the_plan, self.store)
        rows = [self._status_row(service, history, target, diffs)
                for target in the_plan.targets]
        return rows + [_failed_row(target, error) for target, error in the_plan.failed.items()]

    def _status_row(self, service, history, target, diffs: bool) -> dict:
        the_plan, current = service.plan, service.current
        node = the_plan.keys[target]
        row = status_head(target, node.digest)
        fresh = service.fresh(target)
        if fresh is not None:
            # Cached; when a later build was of other inputs (a revert), say which.
            newer = history.newer_than(target, fresh)
            row.update(status=TargetState.UP_TO_DATE, reasons=[], built_at=fresh.get("built_at"),
                       newest=newer and {"key": newer.key, "built_at": newer.built_at,
                                         **explained(newer.reasons)})
        elif self.store.lookup(node.digest) is not None:
            # The static key holds; something the compiler read has changed.
            reasons = _build.observation_changes(the_plan, self.store, target, current)
            row.update(status=TargetState.STALE, previous_key=node.digest, reasons=reasons,
                       changes=[{"path": [], "change": "observed", "old": None,
                                 "new": None, "message": r} for r in reasons])
        elif node.digest in self.store.damage:
            # Nothing changed, but what the store holds for this key is unusable.
            row.update(status=TargetState.STALE, previous_key=node.digest, changes=[], reasons=[
                f"the store's {self.store.damage[node.digest]}; a build rebuilds it"])
        elif (failed := self._recorded_failure(the_plan, target, current)) is not None:
            # A build would report this failure at once (until --retry-failed).
            row.update(status=TargetState.FAILED, recorded=True, reasons=[failed.error],
                       error=failed.error)
        else:
            row.update(self._compared(the_plan, history, target, diffs))
        return row

    def _recorded_failure(self, the_plan, target, current):
        limit = the_plan.config.target_timeout or None
        return _build.recorded_failure(the_plan, self.store, target, current, limit)

    def _compared(self, the_plan, history, target, diffs: bool) -> dict:
        """A target with no entry for its key, against its nearest stored build."""
        inputs = [[list(path), text, d] for path, text, d in the_plan.keys[target].flatten()]
        nearest = history.nearest(target, inputs) or history.nearest_replaced(
            target, set(the_plan.kernels[target.name].argtypes), inputs)
        if nearest is None:
            return {"status": TargetState.MISSING, "reasons": ["never built into this store"]}
        builds = history.builds(target)
        shown = explained(nearest.reasons)
        if diffs:
            for change, reason in zip(shown["changes"], nearest.reasons):
                if reason.is_body:
                    change.update(self._body_diff(reason, nearest.built_at))
        return {"status": TargetState.STALE, "previous_key": nearest.key,
                "previous_built_at": nearest.built_at,
                "previous_is_newest": not builds or builds[0] is nearest.manifest,
                **shown}

    def _body_diff(self, reason, built_at: str) -> dict:
        """{"diff": unified diff of a changed body's source} or {"diff": None, "diff_note":
        why not}: the earlier source is the one kept when it was keyed (display only)."""
        keyer = self._keyer
        kept = getattr(keyer.sources, "body_text", lambda _: None)
        old = kept(reason.old_digest) or keyer.body_text(reason.old_digest)
        new = keyer.body_text(reason.new_digest) or kept(reason.new_digest)
        if old is None or new is None:
            note = "the earlier source was not kept" if old is None else \
                "the current source could not be read"
            return {"diff": None, "diff_note": note}
        return {"diff": source_diff(old, new, reason.function, built_at)}

    def clean(self, everything: bool = False) -> dict:
        """Remove this project's entries (or all) and blobs no remaining entry uses."""
        with self.store.exclusive("clean"):  # never under a running build
            return self._clean(everything)

    def _clean(self, everything: bool) -> dict:
        removed = objects = 0
        for key, manifest in list(self.store.entries()):
            # By project name only: another project may declare a target of the same name.
            if everything or manifest.get("project") == self.config.name:
                self.store.remove_entry(key)
                if is_object(manifest):
                    objects += 1
                elif is_target(manifest):  # early-cutoff records go with them, uncounted
                    removed += 1
        blobs, freed = self.store.remove_orphan_blobs()
        failed = failures.remove_records(self.store, None if everything else self.config.name)
        if not self.store.read_only:  # what it names is gone: the next run keys in full
            journal.remove(self.store.root, journal.slot(self.config.name, self.config.path.name))
        return {"entries": removed, "objects": objects, "blobs": blobs, "bytes": freed,
                "failures": failed}

    def __repr__(self):
        return f"Project({self.config.name!r}, store={str(self.store.root)!r})"


class PackagedProject(FromBundle, Project):
    """A Project loaded from an installed package's bundle (see `packaged`): its keys come
    from the bundle's manifest while the installed sources match it."""


def _failed_row(target, error) -> dict:
    """The status row of a target that could not be imported ("failed") or keyed
    ("unkeyable"): it has no key."""
    row = dict(status_head(target, None), reasons=[str(error)])
    if isinstance(error, KeyingError):
        return dict(row, status=TargetState.UNKEYABLE)
    return dict(row, status=TargetState.FAILED, error=str(error))


def open_project(config_path, store, read_only: bool = False, *,
                 remote: dict | None = None) -> Project:
    """A kbuild.toml (a path, or None for the nearest) and its storage (`storage`): what
    every CLI command and `Project.load` start with. `remote`: how the remote is chosen
    (`remote_settings.remote_settings`'s options: url, no_remote...); None: no remote (a command
    that reads only the local store)."""
    from .store.remote_settings import remote_settings

    cfg = load_config(config_path)
    settings = None if remote is None else remote_settings(cfg, **remote)
    return Project(cfg, open_storage(default_store(cfg, store), read_only=read_only,
                                     remote=settings))
