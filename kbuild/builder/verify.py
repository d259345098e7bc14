"""`--verify`: rebuild what the store would serve, from source, and compare the bytes.

A key is a list of inputs, and no list is complete: Python that runs while numba types
a kernel (an `@overload`'s implementation, an `@intrinsic`'s code generator) can read a
C library, a socket or a clock. Checking outputs finds what no list of inputs can, as
`nix build --check` and reproducible-builds' double builds do. kbuild's bytes are a pure
function of a key (one key, one set of bytes, whatever the worker or the order), so a
fresh compile of a target whose entry is right gives the entry's bytes exactly.

The fresh compile runs in a worker process, reuses nothing stored (no objects, no early
cutoff) and nothing this process compiled (numba's compiled device functions and
kbuild's own objects are dropped first), and is built the way the entry was (separate
compilation or one program). A target whose bytes differ is reported as failed, with
what differs, and its entry (and its objects) replaced by the fresh build: what was
wrong is never served again. A target a fresh compile fails for is reported failed and
its entry removed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from ..execute.parallel import TimedOut, run_in_workers
from ..model import RowStatus
from ..store.local import Store
from .planning import Plan
from .row import Row
from .service import BuildService

STALE = ("stale: {what} from a fresh build; kbuild keyed nothing that changed "
         "(please report this: the target's sources and what its compile reads). The "
         "entry is replaced by the fresh build")
FAILS = ("stale: a fresh build of this target fails, though the store holds a binary for "
         "its key (please report this); the entry is removed: {error}")


@dataclass(frozen=True)
class Sample:
    """Which served targets to check: all (`fraction` 1.0) or a random share of them."""

    fraction: float = 1.0

    def pick(self, targets: list) -> list:
        if self.fraction >= 1.0:
            return list(targets)
        count = round(len(targets) * self.fraction)
        chosen = set(random.sample(range(len(targets)), count))
        return [t for i, t in enumerate(targets) if i in chosen]


def parse_sample(text: str | None) -> Sample:
    """`--verify` (None or ""): every target; `--verify=25%` or `0.25`: a share of them."""
    if not text:
        return Sample()
    value = text.strip()
    try:
        fraction = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        fraction = -1.0
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"--verify={text!r}: give a share of the targets to check, from "
                         "1% to 100% (or 0.01 to 1)")
    return Sample(fraction)


def check_served(the_plan: Plan, store: Store, rows: list, *, sample: Sample = Sample(),
           jobs: int = 1, timeout: float | None = None) -> list:
    """`rows` (one per plan target, in plan order) with the cached ones `sample` picks
    checked against a fresh build: each gets `verified` ("same" or "differs"); a
    target whose bytes differ, or whose fresh build fails, becomes a failed row."""
    service = BuildService(the_plan, store)
    by_target = dict(zip(the_plan.targets, rows))
    served = {}
    for target in sample.pick([t for t, r in by_target.items()
                               if r.status == RowStatus.CACHED]):
        manifest = service.fresh(target)
        if manifest is not None:
            served[target] = manifest
    if len(served) > 1 and jobs > 1 or timeout is not None:
        service.prepare_workers(served)
    checked = run_in_workers(lambda target: service.compile_fresh(target, served[target]),
                             list(served), max(1, jobs), timeout=timeout)
    for target, outcome, seconds in checked:
        by_target[target] = _compared(service, target, served[target], outcome, seconds,
                                      by_target[target])
    return [by_target[t] for t in the_plan.targets] + rows[len(the_plan.targets):]


def _compared(service, target, manifest, outcome, seconds, row) -> Row:
    if isinstance(outcome, TimedOut):
        return replace(row, verified="unchecked",
                       note=f"verify: the fresh build took longer than {outcome.limit:g}s")
    differ, artifacts = service.compared(target, manifest, outcome, seconds)
    if isinstance(differ, Exception):
        error = FAILS.format(error=str(outcome).splitlines()[0] if str(outcome) else outcome)
        return replace(row, status=RowStatus.FAILED, error=error, verified="differs")
    if not differ:
        return replace(row, verified="same")
    what = "the cached " + " and ".join(differ) + (" differ" if len(differ) > 1 else " differs")
    return replace(row, status=RowStatus.FAILED, artifacts=artifacts, verified="differs",
                   error=STALE.format(what=what))
