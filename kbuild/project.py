"""The project API: what the CLI and programs call. `Project.load()` is the entry point."""

from __future__ import annotations

from . import build as _build
from .config import ProjectConfig, default_store, load_config
from .keying.explain import diff
from .store import failures
from .store.local import Store, is_object


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
        from .store.remote import open_remote, remote_settings

        if on_miss not in ON_MISS:
            raise ValueError(f"on_miss must be one of {ON_MISS}, not {on_miss!r}")
        if package is not None:
            from .packaged import load_package

            return load_package(package, on_miss=on_miss, verify=verify)
        project = open_project(config, store, read_only)
        project.store.remote = open_remote(remote_settings(
            project.config, url=remote or None, no_remote=remote is False))
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
            launcher = self.kernel(spec.name)
            for signature, argtypes in launcher.resolved.argtypes.items():
                kernel = launcher.numba_kernel(signature)
                if kernel is not None:  # None: numba compiles it (simulator, on_miss="jit")
                    launcher.resolved.kernel.add_overload(kernel, tuple(argtypes))
                installed.append(f"{spec.name} {signature}")
        return installed

    # -- building -----------------------------------------------------------

    def fresh_entry(self, the_plan, target):
        """The entry a launch of `target` uses, or None (see `build.fresh_entry`; a
        packaged project answers from its bundle)."""
        # One digest memo per plan: a launcher asks once per declared arch and signature,
        # and the plan's keys, like these digests, are taken once per process.
        current = getattr(the_plan, "_launch_current", None)
        if current is None:
            current = the_plan._launch_current = _build.current_digests(the_plan)
        return _build.fresh_entry(the_plan, self.store, target, current)

    def plan(self, names=None, archs=None) -> _build.Plan:
        """Resolve and key the requested targets (cached per selection)."""
        cache_key = (tuple(names or ()), tuple(archs or ()))
        if cache_key not in self._plans:
            if "_keyer" not in self.__dict__:
                from .keying.keys import Keyer
                from .sources import ProjectSources

                # Read-only commands (status, keys) read the facts a build wrote, so they
                # compute the keys it computes; only a writable store gets new facts.
                facts = self.store.base / "facts"
                self._keyer = Keyer(ProjectSources(self.config.paths, facts_dir=facts))
            self._plans[cache_key] = _build.plan(self.config, names, archs, self._keyer)
            self._save_facts()
        return self._plans[cache_key]

    def build(self, names=None, archs=None, *, keep_going=False, jobs=1, progress=None,
              separate=True, executor=None, **options):
        """Build what is out of date; one `Row` per target. `separate=False` compiles each
        kernel with its device functions as one program, as numba does; `executor`,
        `progress` and `options` (`target_timeout`, `retry_failed`): see `build.build`."""
        the_plan = self.plan(names, archs)
        the_plan.separate = separate
        rows = _build.build(the_plan, self.store, keep_going=keep_going, jobs=jobs,
                            progress=progress, executor=executor, **options)
        self._save_facts()
        return rows

    def _save_facts(self) -> None:
        # Only into a store that exists: looking at a project creates no store.
        if not self.store.read_only and self.store.base.is_dir():
            self._keyer.sources.save_facts()

    def status(self, names=None, archs=None) -> list[dict]:
        """A dry run: up-to-date, stale or missing for every target, and why."""
        the_plan = self.plan(names, archs)
        previous = self._previous_entries()
        current = _build.current_digests(the_plan)
        rows = []
        for target in the_plan.targets:
            node = the_plan.keys[target]
            row = {"target": target.name, "signature": target.signature, "arch": target.arch,
                   "key": node.digest}
            if _build.fresh_entry(the_plan, self.store, target, current) is not None:
                row.update(status="up-to-date", reasons=[])
            elif self.store.lookup(node.digest) is not None:
                # The static key holds; something the compiler read has changed.
                reasons = _build.observation_changes(the_plan, self.store, target, current)
                row.update(status="stale", previous_key=node.digest, reasons=reasons,
                           changes=[{"path": [], "change": "observed", "old": None,
                                     "new": None, "message": r} for r in reasons])
            elif node.digest in self.store.damage:
                # Nothing changed, but what the store holds for this key is unusable.
                row.update(status="stale", previous_key=node.digest, changes=[], reasons=[
                    f"the store's {self.store.damage[node.digest]}; a build rebuilds it"])
            else:
                old = previous.get((target.name, target.signature, target.arch)) or \
                    self._replaced_signature(previous, the_plan, target)
                if old is None:
                    row.update(status="missing", reasons=["never built into this store"])
                else:
                    reasons = diff(old["inputs"], list(node.flatten()))
                    row.update(status="stale", previous_key=old["key"],
                               reasons=[r.message for r in reasons],
                               changes=[r.as_json() for r in reasons])
            rows.append(row)
        for target, exc in the_plan.unkeyable.items():
            rows.append({"target": target.name, "signature": target.signature,
                         "arch": target.arch, "key": None, "status": "unkeyable",
                         "reasons": [str(exc)]})
        return rows

    def _replaced_signature(self, previous: dict, the_plan, target):
        """The newest entry of this target and arch under a signature no longer declared."""
        declared = set(the_plan.kernels[target.name].argtypes)
        candidates = [m for (name, sig, arch), m in previous.items()
                      if name == target.name and arch == target.arch and sig not in declared]
        return max(candidates, key=lambda m: m.get("built_at", ""), default=None)

    def _previous_entries(self) -> dict:
        """The newest entry per (target, signature, arch) in the store."""
        newest: dict = {}
        for key, manifest in self.store.entries():
            if is_object(manifest):
                continue
            ident = (manifest.get("target"), manifest.get("signature"), manifest.get("arch"))
            if ident not in newest or manifest.get("built_at", "") >= newest[ident].get("built_at", ""):
                newest[ident] = manifest
        return newest

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
                else:
                    removed += 1
        blobs, freed = self.store.remove_orphan_blobs()
        failed = failures.remove_records(self.store, None if everything else self.config.name)
        return {"entries": removed, "objects": objects, "blobs": blobs, "bytes": freed,
                "failures": failed}

    def __repr__(self):
        return f"Project({self.config.name!r}, store={str(self.store.root)!r})"


def open_project(config_path, store, read_only: bool = False) -> Project:
    """A kbuild.toml (a path, or None for the nearest) and its store: what every CLI
    command and `Project.load` start with."""
    cfg = load_config(config_path)
    return Project(cfg, Store(default_store(cfg, store), read_only=read_only))
