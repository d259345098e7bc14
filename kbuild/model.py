"""The nouns every layer speaks of: a build `Target`, and the kinds of what happened to a
target in a build and of what `status` says of it. A kind's values are the strings of
`--json` output, so a kind compares equal to its text (`RowStatus.BUILT == "built"`) and
JSON needs no conversion; code names kinds by member, never by a string literal.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RowStatus(str, enum.Enum):
    """What `kbuild build` did with one target (a row's `status`)."""

    BUILT = "built"
    CACHED = "cached"
    FAILED = "failed"
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value


class TargetState(str, enum.Enum):
    """What `kbuild status` says of one target, compiling nothing."""

    UP_TO_DATE = "up-to-date"
    STALE = "stale"
    MISSING = "missing"
    FAILED = "failed"
    UNKEYABLE = "unkeyable"

    def __str__(self) -> str:
        return self.value


class LinkMode(str, enum.Enum):
    """How a built target's cubin was made (a row's `link`)."""

    LTO = "lto"  # compiled now, device functions as objects of their own, LTO-linked
    RELINK = "relink"  # linked from stored objects, nothing compiled
    WHOLE = "whole"  # one program with its device functions, as numba compiles it

    def __str__(self) -> str:
        return self.value


class Cutoff(str, enum.Enum):
    """What a built target took from an earlier build because the bytes going into its
    last steps were identical (early cutoff; a row's `cutoff`, null when nothing)."""

    LINK = "link"  # its LTO-IR objects were an earlier link's: that PTX and cubin, no link
    CUBIN = "cubin"  # its PTX was an earlier build's: that cubin, no PTX -> cubin

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Target:
    """One build target: a kernel x one signature x one arch (x the launch configuration
    it is built for, for a launch-config-sensitive kernel: see keying/launch.py)."""

    name: str
    signature: str
    arch: str
    launch: tuple | None = None

    @property
    def label(self) -> str:
        if self.launch is None:
            return f"{self.name} {self.signature} {self.arch}"
        return f"{self.name} {self.signature} {self.arch} ({launch_text(self.launch)})"


def launch_text(launch) -> str:
    """`grid 64x1x1 block 128x1x1 shared 0`: how rows and messages name a launch (a
    (grid, block, shared) tuple, see keying/launch.py)."""
    grid, block, shared = launch
    return (f"grid {'x'.join(map(str, grid))} block {'x'.join(map(str, block))} "
            f"shared {shared}")
