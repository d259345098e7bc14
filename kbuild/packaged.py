"""A project loaded from an installed package's bundle (`Project.load(package=...)`).

No kbuild.toml, no writable store, no compiler: the package's `_kbuild/bundle.json`
says what was built and the bundle's read-only store holds it. Before trusting the
bundled keys, the installed kernel modules' bytes are digested and compared with the
manifest (`verify="sources"`: one file read per module, no re-keying). Full re-keying
(`verify="keys"`) is refused for now: keying treats site-packages as outside the project,
so every installed target would read as stale. A module that differs
follows `on_miss`: "error" raises naming it, "jit" lets numba compile its kernels,
"build" builds them into the user's cache store (a compiler is needed then).

At launch the launcher picks, among the archs the bundle holds, the cubin for the
device's exact arch, else for its arch-specific target (`sm_90a` on an sm_90), else the
PTX of the highest plain arch below it (the driver JITs it once per process), else
`on_miss` (`launch.choose_artifact`). `describe()` says which, per target.

This module sits below the project API: `FromBundle` is what a project answers from
its bundle, and `project.PackagedProject` mixes it into a `Project`, handing
`load_package` the class to make.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

from . import builder as _build
from .bundle import MANIFEST_NAME, STORE_DIR, module_sources, read_manifest
from .config import KernelSpec, ProjectConfig, default_store
from .errors import ConfigError, LaunchError
from .model import TargetState
from .store.local import Store

BUNDLE_DIR = "_kbuild"
VERIFY = ("sources",)


class _BundledKey:
    """What `plan.keys[target]` offers the launcher: the key the bundle was built at."""

    __slots__ = ("digest",)

    def __init__(self, digest: str):
        self.digest = digest


def bundle_dir(package: str) -> Path:
    """`package/_kbuild`, found through importlib.resources (the package is not imported
    beyond its __init__)."""
    try:
        root = importlib.resources.files(package) / BUNDLE_DIR
    except ModuleNotFoundError:
        raise ConfigError(f"package '{package}' is not installed; "
                          "pip install it or fix the name") from None
    path = Path(str(root))
    if not (path / MANIFEST_NAME).is_file():
        raise ConfigError(f"package '{package}' ships no kbuild bundle ({path / MANIFEST_NAME} "
                          "is missing); build its wheel with kbuild's build hook")
    return path


def load_package(package: str, make_project, *, on_miss: str = "error",
                 verify: str = "sources"):
    """The project of an installed package's bundle: `make_project(config, store, manifest)`,
    a `FromBundle` project (`project.PackagedProject`)."""
    if verify == "keys":
        raise ValueError("verify='keys' is not supported for an installed package yet (its "
                         "modules are outside any kbuild.toml's paths); use verify='sources'")
    if verify not in VERIFY:
        raise ValueError(f"verify must be one of {VERIFY}, not {verify!r}")
    where = bundle_dir(package)
    manifest = read_manifest(where / MANIFEST_NAME)
    if manifest.get("format") != 1:
        raise ConfigError(f"{where / MANIFEST_NAME}: bundle format {manifest.get('format')!r} "
                          "is not one this kbuild reads; upgrade kbuild")
    config = _config(where, manifest)
    project = make_project(config, Store(where / STORE_DIR, read_only=True), manifest)
    project.on_miss = on_miss
    project.verify = verify
    edited = project.edited_modules()
    if edited and on_miss == "error":
        raise LaunchError(f"package '{package}': installed module(s) {', '.join(edited)} "
                          f"differ from the ones bundled in {where}; reinstall the package, "
                          "or load it with on_miss='jit' or 'build'")
    if edited and on_miss == "build":
        project.store = Store(default_store(None, None))
    if edited or verify == "keys":
        project.bundled = False  # keys recomputed from the installed sources
    return project


def _config(where: Path, manifest: dict) -> ProjectConfig:
    kernels = tuple(KernelSpec(k["name"], tuple(k["signatures"]), tuple(k["archs"]))
                    for k in manifest["kernels"])
    return ProjectConfig(path=where / MANIFEST_NAME, name=manifest["project"], paths=(),
                         archs=tuple(manifest["archs"]), store=None, kernels=kernels)


class FromBundle:
    """What a project loaded from a bundle answers from the bundle's manifest, while its
    sources match it (`bundled`): its plan, fresh entries and status; `describe()`. Mixed
    into a `Project` (which answers otherwise), ahead of it."""

    bundled = True
    verify = "sources"

    def __init__(self, config, store, manifest: dict):
        super().__init__(config, store)
        self.manifest = manifest
        self._bundle_plans: dict = {}

    def source_roots(self) -> tuple:
        """An installed package's import root: the folder its top-level package is in
        (where the package's checkout had it when the bundle was built)."""
        import importlib.util

        tops = {k.name.partition(":")[0].partition(".")[0] for k in self.config.kernels}
        roots = []
        for top in sorted(tops):
            spec = importlib.util.find_spec(top)
            for location in (spec and spec.submodule_search_locations) or ():
                roots.append(os.path.dirname(os.path.abspath(location)))
        return tuple(dict.fromkeys(roots))

    def edited_modules(self) -> list[str]:
        """Modules of the kernels' packages that Python would now import from other bytes
        than were bundled, or from another file (a package folder beside a module of
        its name, another copy first on sys.path, ...), and modules added or gone."""
        digests, origins = self.manifest["modules"], self.manifest.get("origins")
        current = module_sources(k.name for k in self.config.kernels)
        return sorted(m for m in set(digests) | set(current.digests)
                      if current.digests.get(m) != digests.get(m)
                      or (origins is not None and current.origins.get(m) != origins.get(m)))

    def fresh_entry(self, the_plan, target):
        if not self.bundled:
            return super().fresh_entry(the_plan, target)
        return _build.BuildService(the_plan, self.store).held(target)

    def plan(self, names=None, archs=None):
        if not self.bundled:
            return super().plan(names, archs)
        cache_key = (tuple(names or ()), tuple(archs or ()))
        if cache_key not in self._bundle_plans:
            specs = _build.select_specs(self.config, names)
            keys = {(t["target"], t["signature"], t["arch"]): t["key"]
                    for t in self.manifest["targets"]}
            from .discover import Target, resolve_kernel

            kernels = {s.name: resolve_kernel(self.config, s) for s in specs}
            targets = [Target(s.name, sig, arch) for s in specs for sig in s.signatures
                       for arch in (archs or s.archs)]
            self._bundle_plans[cache_key] = _build.Plan(
                self.config, kernels, targets,
                {t: _BundledKey(keys.get((t.name, t.signature, t.arch), "")) for t in targets},
                keyer=None)
        return self._bundle_plans[cache_key]

    def status(self, names=None, archs=None) -> list[dict]:
        if not self.bundled:
            return super().status(names, archs)
        rows = []
        for target in self.plan(names, archs).targets:
            key = self.plan(names, archs).keys[target].digest
            held = key and self.store.lookup(key) is not None
            rows.append({"target": target.name, "signature": target.signature,
                         "arch": target.arch, "key": key,
                         "status": TargetState.UP_TO_DATE if held else TargetState.MISSING,
                         "reasons": [] if held else ["not in the package's bundle"]})
        return rows

    def describe(self, device_arch: str | None = None) -> list[dict]:
        """Per kernel and signature: the artifact a launch on `device_arch` (default: the
        current device) uses: 'cubin' (exact arch), 'ptx' (driver JIT from a lower arch),
        or the on_miss mode."""
        from .launch import choose_artifact, current_arch

        rows = []
        for spec in self.config.kernels:
            launcher = self.kernel(spec.name)
            arch = device_arch or current_arch(spec.archs)
            for signature in spec.signatures:
                built, kind = choose_artifact(tuple(launcher.stored_entries(signature)), arch)
                rows.append({"target": spec.name, "signature": signature, "device_arch": arch,
                             "arch": built, "artifact": kind or self.on_miss,
                             "source": "bundle" if self.bundled else "rekeyed"})
        return rows

    def __repr__(self):
        return f"PackagedProject({self.config.name!r}, bundle={str(self.store.root)!r})"
