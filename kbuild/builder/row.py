"""What a build reports for each target: a `Row`, as `kbuild build --json` prints it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..keying.launch import launch_json
from ..model import Cutoff, LinkMode, RowStatus


@dataclass
class Row:
    """The outcome for one target, as `kbuild build --json` reports it."""

    target: str
    signature: str
    arch: str
    key: str | None  # None: the target's module failed to import
    status: RowStatus
    seconds: float = 0.0
    artifacts: dict = field(default_factory=dict)
    error: str | None = None
    link: LinkMode | None = None  # built rows: how the cubin was made
    note: str | None = None  # why a built target was linked as one program
    recorded: bool = False  # failed rows: the failure was recorded by an earlier build
    # Relinked rows: the device functions that alone changed since the target's nearest
    # earlier build (set by `Project.build`); None when unknown or not relinked.
    changed: list | None = None
    # The launch configuration a launch-config-sensitive target is built for (JSON form).
    launch: dict | None = None
    # Built rows: what early cutoff took from an earlier build of the same bytes (the link's
    # output, or the cubin of the same PTX); None when every step ran.
    cutoff: Cutoff | None = None
    # `--verify`: "same" (a fresh build gave the stored bytes), "differs" (it did not: the
    # row failed and the entry was replaced) or "unchecked"; None when not verified.
    verified: str | None = None
    # Failed rows answered from the journal: the file:line the full run reported.
    where: str | None = None

    @classmethod
    def of(cls, target, key: str | None, status: RowStatus, *args, **fields) -> Row:
        """`target`'s row (a `model.Target`: its name, signature, arch and launch)."""
        return cls(target.name, target.signature, target.arch, key, status, *args,
                   launch=launch_json(target.launch), **fields)

    def as_json(self) -> dict:
        found = {"target": self.target, "signature": self.signature, "arch": self.arch,
                 "key": self.key, "status": self.status, "seconds": round(self.seconds, 4),
                 "artifacts": self.artifacts, "error": self.error, "link": self.link,
                 "note": self.note, "recorded": self.recorded, "changed": self.changed,
                 "cutoff": self.cutoff}
        if self.verified is not None:
            found["verified"] = self.verified
        return found if self.launch is None else dict(found, launch=self.launch)
