"""The build: plan the requested targets, take what the store has, compile the rest, commit.

One room per concern:

| module | what |
|---|---|
| `planning` | `Plan` and `plan()`: the requested targets resolved and keyed; names, `--arch` |
| `row` | `Row`: what a build reports per target |
| `entries` | a target's entry: is the stored one fresh (static key, then observations); `commit` |
| `failures` | failed compiles recorded by key, failing an unchanged target at once |
| `compile` | one target's job here: compile it, or link it from stored objects |
| `run` | `build()`: locks, the two waves, worker processes or an executor |
| `cluster` | a target's job as plain data, and its compile on a cluster worker |

Callers use the names below (`from kbuild.build import plan, build, Row`).
"""

from .compile import compile_target, link_target
from .entries import (commit, current_digests, expected, fresh_entry, launchable,
                      observation_changes, observed_record)
from .failures import (CompileFailed, CompileTimeout, forget_failure, recorded_failure,
                       remember_failure)
from .planning import Plan, new_keyer, parse_archs, plan, select_specs, target_key
from .row import Row
from .run import Workers, build, default_jobs, relink_recipe

__all__ = ["CompileFailed", "CompileTimeout", "Plan", "Row", "Workers", "build", "commit",
           "compile_target", "current_digests", "default_jobs", "expected", "forget_failure",
           "fresh_entry", "launchable", "link_target", "new_keyer", "observation_changes",
           "observed_record", "parse_archs", "plan", "recorded_failure", "relink_recipe",
           "remember_failure", "select_specs", "target_key"]
