"""The kinds every layer speaks of: what happened to a target in a build, and what `status`
says of it. Values are the strings of `--json` output, so a kind compares equal to its text
(`RowStatus.BUILT == "built"`) and JSON needs no conversion; code names kinds by member,
never by a string literal.
"""

from __future__ import annotations

import enum


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
