"""The build: plan the requested targets, take what the store has, compile the rest, commit.

One room per concern:

| module | what |
|---|---|
| `planning` | `Plan` and `plan()`: the requested targets resolved and keyed; names, `--arch` |
| `row` | `Row`: what a build reports per target |
| `entries` | a target's entry: is the stored one fresh (static key, then observations); `commit` |
| `failures` | failed compiles recorded by key, failing an unchanged target at once |
| `compile` | one target's job here: compile it, or link it from stored objects |
| `service` | `BuildService`: the one path to an entry (look up, lock, again, build, commit) |
| `run` | `build()`: a row per target through the service; progress, stop after a failure |
| `cluster` | a target's job as plain data, and its compile on a cluster worker |
| `verify` | `--verify`: what the store would serve rebuilt from source and compared |

Callers use the names below (`from kbuild.builder import plan, build, Row`). The steps of
a build (look up, lock, compile or link, commit) are not among them: every caller goes
through `BuildService` (tests/test_architecture.py: only the service takes them).
"""

# name -> the module of this package that defines it, imported when the name is first
# used: `kbuild.builder.row` (what a direct no-op reports) must not import numba with the
# compiler (`compile`) and the keyer (`planning`).
_WHERE = {
    "current_digests": "entries", "expected": "entries",
    "launchable": "entries", "observation_changes": "entries", "observed_record": "entries",
    "CompileFailed": "failures", "CompileTimeout": "failures", "forget_failure": "failures",
    "recorded_failure": "failures", "remember_failure": "failures",
    "Plan": "planning", "new_keyer": "planning", "parse_archs": "planning", "plan": "planning",
    "select_specs": "planning", "target_key": "planning",
    "Row": "row",
    "Workers": "run", "build": "run", "default_jobs": "run",
    "BuildService": "service",
    "check_served": "verify", "parse_sample": "verify",
}

__all__ = sorted(_WHERE)


def _submodule(name: str):
    """This package's module `name`, imported now: by plain import statements, one per
    module, so that the import graph (tests/test_architecture.py) shows every arrow."""
    if name == "compile":
        from . import compile as module
    elif name == "entries":
        from . import entries as module
    elif name == "failures":
        from . import failures as module
    elif name == "planning":
        from . import planning as module
    elif name == "row":
        from . import row as module
    elif name == "run":
        from . import run as module
    elif name == "service":
        from . import service as module
    elif name == "verify":
        from . import verify as module
    else:
        raise AssertionError(f"kbuild.builder: _WHERE names {name!r}; import it in _submodule")
    return module


def __getattr__(name):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_submodule(module), name)
    globals()[name] = value
    return value
