"""What a build is asked for: the requested targets resolved, each with its key tree.

How a target is named on the command line (full or unique short names, `--arch` lists)
is `targets`'s; its names are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..backend.backends import ALL_OBJECTS
from ..config import ProjectConfig
from ..discover import ImportFailure, ResolvedKernel, Target, resolve_kernel
from ..errors import KeyingError
from ..keying.keyer import Keyer
from ..keying.launch import with_launch
from ..keying.tree import KeyNode
from ..sources import ProjectSources
from ..targets import parse_archs, requested, select_specs

__all__ = ["Plan", "new_keyer", "parse_archs", "plan", "select_specs", "target_key"]


@dataclass
class Plan:
    """Every requested target with its resolved kernel and key tree."""

    config: ProjectConfig
    kernels: dict  # target name -> ResolvedKernel
    targets: list  # [Target]
    keys: dict  # Target -> KeyNode
    keyer: Keyer
    separate: bool = True  # compile device functions into objects of their own (see lto)
    # Targets that could not be imported (`ImportFailure`), parsed (`BadSignature`) or keyed
    # (`KeyingError`: a value kbuild cannot hash), never in `targets` or `keys`: Target ->
    # the error. Each fails alone; a failed import also stops the build without -k, as a
    # failed compile does.
    failed: dict = field(default_factory=dict)
    # What the names compiles observed digest to now (`entries.current_digests`), kept for
    # launches from this plan (`Project.fresh_entry`): like the keys, taken once per process.
    launch_digests: object = field(default=None, repr=False, compare=False)

    @property
    def total(self) -> int:
        """Every requested target, keyed or not."""
        return len(self.targets) + len(self.failed)

    @property
    def import_failed(self) -> bool:
        return any(isinstance(error, ImportFailure) for error in self.failed.values())

    def resolved(self, name: str) -> ResolvedKernel:
        """The resolved kernel of target `name`, or its import failure raised."""
        if name not in self.kernels:
            raise next(e for t, e in self.failed.items() if t.name == name)
        return self.kernels[name]

    def nodes_by_ident(self) -> dict:
        """Every separately compiled device function's current trees, by identity: more
        than one where one Python function is jitted with other options (its dispatchers
        share a name and differ in options, which numba mangles into their symbols)."""
        found: dict = {}
        for node in self.keyer.nodes.values():
            if node.ident and all(n.digest != node.digest for n in found.get(node.ident, ())):
                found[node.ident] = found.get(node.ident, ()) + (node,)
        return found


def new_keyer(config: ProjectConfig, facts_dir=None, sources=None) -> Keyer:
    """A keyer for the project's targets: its sources (default: its import roots, facts
    kept in `facts_dir`), and the object model of every backend (numba-cuda's,
    numba-cuda-mlir's where its kernels are used)."""
    return Keyer(sources or ProjectSources(config.paths, facts_dir=facts_dir), ALL_OBJECTS)


def plan(config: ProjectConfig, names=None, archs=None, keyer: Keyer | None = None) -> Plan:
    """Resolve the requested targets (default: all) and compute their keys.

    Plans that share a `keyer` key each function once between them.
    """
    specs = select_specs(config, names)
    kernels, broken = _resolve_all(config, specs)
    every = requested(specs, archs)
    targets = [t for t in every if t.name in kernels]
    keyer = keyer or new_keyer(config)
    keys, unkeyable = {}, {}
    for t in targets:
        bad = kernels[t.name].bad_signatures.get(t.signature)
        if bad is not None:
            unkeyable[t] = bad  # fails alone, as a value kbuild cannot key does
            continue
        try:
            keys[t] = target_key(keyer, kernels[t.name], t)
        except KeyingError as exc:
            unkeyable[t] = exc
    failed = {t: broken[t.name] for t in every if t.name in broken}
    return Plan(config, kernels, [t for t in targets if t in keys], keys, keyer,
                failed={**failed, **unkeyable})


def _resolve_all(config: ProjectConfig, specs):
    """(name -> ResolvedKernel, name -> ImportFailure): a module that raises at import
    fails its own targets only, and is imported once, not once per kernel."""
    kernels, broken, bad_modules = {}, {}, {}
    for spec in specs:
        module = spec.name.partition(":")[0]
        if module in bad_modules:
            broken[spec.name] = bad_modules[module].for_target(spec.name)
            continue
        try:
            kernels[spec.name] = resolve_kernel(config, spec)
        except ImportFailure as exc:
            broken[spec.name] = bad_modules[exc.module] = exc
    return kernels, broken


def target_key(keyer: Keyer, resolved: ResolvedKernel, target: Target) -> KeyNode:
    """A target's key tree; its toolchain and config parts are its backend's."""
    backend = resolved.backend
    node = keyer.target_node(resolved.kernel, target.name, resolved.argtypes[target.signature],
                             target.signature, target.arch, backend.toolchain(),
                             backend.codegen_config())
    return with_launch(node, target.launch)
