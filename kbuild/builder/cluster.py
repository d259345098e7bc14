"""A target's compile on a cluster worker (`--executor dask://...`), as plain data.

The executor (`execute.distributed`) carries the project's files to each worker and a
job there; this is the job: which target of which plan, and the key this machine
computed for it. On the worker, `run_job` plans the target again from the project's
files, checks that it computes the same key and compiles it with `compile_target`,
the code path of a local build. The executor sends `run_job` itself, by its module
and name, so it lives here, above the executor, and the executor never imports the
build.
"""

from __future__ import annotations

import dataclasses

from ..artifacts import names_kernel
from ..backend.base import Artifacts, Object
from ..config import load_config
from ..model import Target
from ..errors import CompileError
from ..keying.launch import launch_json, launch_of
from ..execute.distributed import serve_job, worker_name
from ..store.manifest import HEX32, built_problem
from .compile import compile_target
from .entries import expected
from .planning import Plan, new_keyer, plan


def job_of(the_plan: Plan, target: Target) -> dict:
    """One target's job, as plain data (the executor adds the project and toolchain)."""
    return {"names": list(the_plan.kernels), "archs": sorted({t.arch for t in the_plan.targets}),
            # Plain-valued plan settings (such as how to link) hold on the worker too.
            "options": {f.name: getattr(the_plan, f.name) for f in dataclasses.fields(the_plan)
                        if isinstance(getattr(the_plan, f.name), (bool, int, float, str))},
            "target": [target.name, target.signature, target.arch,
                       None if target.launch is None else launch_json(target.launch)],
            "key": the_plan.keys[target].digest}


def checked(the_plan: Plan, target: Target, outcome):
    """A worker's outcome for `target` as the build may commit it: its Artifacts when they
    are `target`'s binaries (as the store checks an entry it reads: the entry symbol is
    this kernel's, the PTX's .target and .entry and the cubin's arch and kernel symbol
    agree with it, each object is LTO-IR), else a CompileError saying why (a worker runs
    code this machine does not control)."""
    if isinstance(outcome, Exception):
        return outcome
    resolved = the_plan.kernels[target.name]
    prefix = expected(target, resolved.kernel, resolved.backend).get("entry_prefix")
    problem = result_problem(target, outcome, prefix)
    if problem is None:
        return outcome
    return CompileError(f"dask worker's result for {target.label} is not its binary "
                        f"({problem}); it is not stored: check that worker's toolchain")


def result_problem(target: Target, artifacts, entry_prefix: str | None = None) -> str | None:
    """Why `artifacts`, from a worker, are not a compile of `target` (whose entry symbol
    starts with `entry_prefix`, when the backend knows it), else None."""
    if not isinstance(artifacts, Artifacts):
        return f"a {type(artifacts).__name__}, not a compile's artifacts"
    if not (isinstance(artifacts.ptx, bytes) and isinstance(artifacts.cubin, bytes)
            and isinstance(artifacts.entry, str) and isinstance(artifacts.cooperative, bool)
            and isinstance(artifacts.link, dict) and isinstance(artifacts.objects, tuple)):
        return "fields of the wrong types"
    if entry_prefix and not names_kernel(artifacts.entry, entry_prefix):
        return f"its entry symbol {artifacts.entry[:60]} is another kernel's"
    problem = built_problem(target.arch, artifacts.entry,
                            {"ptx": artifacts.ptx, "cubin": artifacts.cubin})
    if problem:
        return problem
    for obj in artifacts.objects:
        if not (isinstance(obj, Object) and isinstance(obj.key, str) and HEX32.match(obj.key)
                and isinstance(obj.ltoir, bytes) and isinstance(obj.manifest, dict)):
            return "an object that is not a keyed LTO-IR object"
        problem = built_problem(target.arch, artifacts.entry, {"ltoir": obj.ltoir})
        if problem:
            return f"object {obj.key}: {problem}"
    if not all(isinstance(row, tuple) and len(row) == 3 and all(isinstance(x, str) for x in row)
               for row in artifacts.observed):
        return "observations that are not (kind, name, digest) rows"
    if not (isinstance(artifacts.outputs, tuple) and all(
            isinstance(k, str) and HEX32.match(k) for k in artifacts.outputs)
            and isinstance(artifacts.cutoff, (str, type(None)))):
        return "early-cutoff keys that are not keys"
    return None


def run_job(files: dict, job: dict) -> dict:
    """On a worker: plan and compile one target from plain data; {'artifacts'|'error',
    'seconds'} (see `execute.distributed.serve_job`)."""
    return serve_job(files, job, _compile_job)


def _compile_job(root, job: dict, memo: dict):
    """(Artifacts or CompileError, seconds) for the job's target, from the project at
    `root`; `memo` keeps this project's config, keyer and plans between jobs."""
    the_plan = _plan(root, job, memo)
    name, signature, arch, launch = (list(job["target"]) + [None])[:4]
    target = Target(name, signature, arch, None if launch is None else launch_of(launch))
    key = the_plan.keys[target].digest if target in the_plan.keys else None
    if key != job["key"]:
        return CompileError(f"dask worker {worker_name()} computes key {key} for "
                            f"{target.label}, this machine {job['key']}: the worker imports "
                            "other code (a module outside the project's import roots, or a "
                            "data file?)"), 0.0
    return compile_target(the_plan, target)


def _plan(root, job: dict, memo: dict) -> Plan:
    """The client's plan, made again here once per project and selection.

    All of the client's kernels are planned, in its order, before anything is
    compiled, as a local build does: the keyer hands out symbol numbers as it
    meets functions (two functions of one identity keep numba's own numbering),
    so keying in another order could give the same key other bytes.
    """
    if not memo:
        config = load_config(root / job["config"])
        memo.update(config=config, plans={}, keyer=new_keyer(config))
    selection = (tuple(job["names"]), tuple(job["archs"]), tuple(sorted(job["options"].items())))
    if selection not in memo["plans"]:
        the_plan = plan(memo["config"], *selection[:2], memo["keyer"])
        for name, value in job["options"].items():
            setattr(the_plan, name, value)
        memo["plans"][selection] = the_plan
    return memo["plans"][selection]
