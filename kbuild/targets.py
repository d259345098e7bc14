"""Which targets a command asks for: names from the command line (full or unique short
names, with a did-you-mean for one nobody declared), `--arch` lists, and the targets
(kernel x signature x arch) they expand to.

Read from kbuild.toml alone, importing nothing of the project or of numba: the plan
(`builder.planning`) keys these targets, and direct mode (`direct`) answers for them from
the journal without keying.
"""

from __future__ import annotations

from .config import ProjectConfig, validate_arch
from .model import Target
from .errors import TargetError


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


def requested(specs, archs=None) -> list[Target]:
    """Every target of `specs` (each signature x each arch: `archs`, else the spec's own,
    x each launch configuration of a launch-config-sensitive kernel), in declaration
    order; a signature, arch or launch named twice is one target."""
    return list(dict.fromkeys(Target(spec.name, sig, arch, launch)
                              for spec in specs for sig in spec.signatures
                              for arch in (archs or spec.archs)
                              for launch in (spec.launches or (None,))))


def status_head(target: Target, key) -> dict:
    """The fields a `status` row starts with: the target (and the launch configuration a
    launch-config-sensitive one is built for) and its key."""
    row = {"target": target.name, "signature": target.signature, "arch": target.arch,
           "key": key}
    if target.launch is not None:
        from .keying.launch import launch_json

        row["launch"] = launch_json(target.launch)
    return row


def parse_archs(text: str | None, where: str = "--arch", check_toolchain: bool = True):
    """`--arch sm_80,sm_90` as a tuple (None when not given), each checked as
    `config.validate_arch` checks the file's."""
    if not text:
        return None
    return tuple(validate_arch(a.strip(), where, check_toolchain)
                 for a in text.split(",") if a.strip())


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
