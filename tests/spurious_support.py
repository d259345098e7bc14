"""Spurious compiles across the edit and observed matrices, held at their measured count.

A compile is spurious when an incremental build compiled a target (`built`) and got the
very artifacts (PTX and cubin) the baseline build had for it: nothing it compiles
changed. Each matrix case counts its own against the count recorded for it here
(`RECORDED`, by suite and case id; absent: none), so none can rise unnoticed, and
tests/test_spurious_budget.py holds their sum at most LIMIT (issue 30: at most 5 across
the edit and observed matrices). A change that removes one lowers its count here; one
that adds one must say so here, where the budget test sees it.
"""

from __future__ import annotations

LIMIT = 5

# suite/case id -> spurious compiles measured (numba-cuda): targets rebuilt whose
# artifacts are the baseline's.
RECORDED: dict[str, int] = {}


def artifacts_by_row(result: dict) -> dict:
    """(target, signature, arch) -> (PTX digest, cubin digest) of a `build --json` result."""
    return {(r["target"], r["signature"], r["arch"]):
            (r["artifacts"].get("ptx"), r["artifacts"].get("cubin"))
            for r in result["targets"] if r.get("artifacts")}


def spurious(baseline: dict, result: dict) -> set:
    """The rows `result` built whose artifacts are the baseline's, as (target, signature)."""
    before = artifacts_by_row(baseline)
    return {(r["target"], r["signature"]) for r in result["targets"]
            if r["status"] == "built" and r.get("artifacts")
            and before.get((r["target"], r["signature"], r["arch"])) ==
            (r["artifacts"].get("ptx"), r["artifacts"].get("cubin"))}


def check(suite: str, case_id: str, baseline: dict, result: dict) -> None:
    """Fail when the case compiled more targets needlessly than recorded for it (counted
    for numba-cuda; numba-cuda-mlir's variants are not measured yet)."""
    if "mlir" in suite:
        return
    found = spurious(baseline, result)
    allowed = RECORDED.get(f"{suite}/{case_id}", 0)
    assert len(found) <= allowed, (
        f"{suite}/{case_id}: {len(found)} spurious compile(s) (recorded {allowed}): "
        f"{sorted(found)} rebuilt to the baseline's bytes")
