"""What a build is asked for: the requested targets resolved, each with its key tree.

Also how a target is named on the command line: full or unique short names, with a
did-you-mean for a name nobody declared, and `--arch` lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..backend.backends import ALL_OBJECTS
from ..config import ProjectConfig, validate_arch
from ..discover import ImportFailure, ResolvedKernel, Target, resolve_kernel
from ..errors import KeyingError, TargetError
from ..keying.keyer import Keyer
from ..keying.launch import with_launch
from ..keying.tree import KeyNode
from ..sources import ProjectSources


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
        """Every separately compiled device function's current tree, by identity."""
        return {n.ident: n for n in self.keyer.nodes.values() if n.ident}


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
    # A signature or arch named twice is one target, built once.
    every = list(dict.fromkeys(Target(spec.name, sig, arch, launch)
                               for spec in specs for sig in spec.signatures
                               for arch in (archs or spec.archs)
                               for launch in (spec.launches or (None,))))
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


def select_specs(config: ProjectConfig, names):
    """The kernel specs named (by full or unique short name), or all of them."""
    if not names:
        return list(config.kernels)
    by_name = {s.name: s for s in config.kernels}
    chosen = []
    for name in names:
        spec = by_name.get(name) or _by_short_name(config, name)
        if spec not in chosen:
            chosen.append(spec)
    return chosen


def _by_short_name(config: ProjectConfig, name: str):
    matches = [s for s in config.kernels if s.name.rpartition(":")[2] == name
               or s.name.rpartition(":")[2].rpartition(".")[2] == name]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise TargetError(f"target '{name}' is ambiguous in {config.path.name}: "
                          f"{', '.join(s.name for s in matches)}")
    raise TargetError(f"unknown target '{name}': {config.path.name} declares "
                      f"{_declared(config)}{_did_you_mean(config, name)}")


def _declared(config: ProjectConfig, shown: int = 8) -> str:
    names = [s.name for s in config.kernels]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _did_you_mean(config: ProjectConfig, name: str) -> str:
    """'; did you mean 'X'?' for the declared target (full or short name) closest to `name`."""
    import difflib

    # What a user may have meant -> the name to suggest: a full name, a short name
    # (`kernel`, `obj.kernel`), or a module's last part (`saxpy` of `examples.saxpy:k`).
    meant = {}
    for full in (s.name for s in config.kernels):
        module, _, attr = full.partition(":")
        last = attr.rpartition(".")[2]
        for alias, suggestion in ((full, full), (attr, attr), (last, last),
                                  (module.rpartition(".")[2], full)):
            meant.setdefault(alias, suggestion)
    close = difflib.get_close_matches(name, sorted(meant), n=1, cutoff=0.6)
    return f"; did you mean '{meant[close[0]]}'?" if close else ""


def parse_archs(text: str | None, where: str = "--arch"):
    if not text:
        return None
    return tuple(validate_arch(a.strip(), where) for a in text.split(",") if a.strip())


def target_key(keyer: Keyer, resolved: ResolvedKernel, target: Target) -> KeyNode:
    """A target's key tree; its toolchain and config parts are its backend's."""
    backend = resolved.backend
    node = keyer.target_node(resolved.kernel, target.name, resolved.argtypes[target.signature],
                             target.signature, target.arch, backend.toolchain(),
                             backend.codegen_config())
    return with_launch(node, target.launch)
