"""What a build reports for each target: a `Row`, as `kbuild build --json` prints it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Row:
    """The outcome for one target, as `kbuild build --json` reports it."""

    target: str
    signature: str
    arch: str
    key: str | None  # None: the target's module failed to import
    status: str  # built | cached | failed | skipped
    seconds: float = 0.0
    artifacts: dict = field(default_factory=dict)
    error: str | None = None
    link: str | None = None  # built rows: lto | relink | whole
    note: str | None = None  # why a built target was linked as one program
    recorded: bool = False  # failed rows: the failure was recorded by an earlier build
    # Relinked rows: the device functions that alone changed since the target's nearest
    # earlier build (set by `Project.build`); None when unknown or not relinked.
    changed: list | None = None

    def as_json(self) -> dict:
        return {"target": self.target, "signature": self.signature, "arch": self.arch,
                "key": self.key, "status": self.status, "seconds": round(self.seconds, 4),
                "artifacts": self.artifacts, "error": self.error, "link": self.link,
                "note": self.note, "recorded": self.recorded, "changed": self.changed}
