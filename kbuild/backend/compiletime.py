"""Which of numba-cuda's config values a compile reads, and when it reads them.

numba-cuda reads some config values when a function is decorated and freezes them
into the dispatcher (`targetoptions`: `opt` from `OPT`, `debug` from
`CUDA_DEBUGINFO_DEFAULT`, `lto` from nvJitLink's presence), and its signature with its
default values (`_compiler.pysig`). Changing those afterwards changes nothing numba
compiles, so keys read them from the dispatcher, never from the live module. Others it
reads while it compiles, after `config.reload_config()` has applied any `NUMBA_*`
variable the program set since: those are keyed as they are when the compile starts.

Surveyed in numba-cuda 0.30 (decorators.py, dispatcher.py, compiler.py, target.py,
lowering.py, debuginfo.py, core/base.py, memory_management/nrt.py); values only printed
or dumped (`DEBUG_*`, `DUMP_*`, `SHOW_HELP`) change no code and are not keyed.
"""

from __future__ import annotations

import inspect
import os

# Read while compiling, whatever the function's options: NRT (`target.enable_nrt`),
# its statistics, polymorphic debug variables, bounds checks (`BaseContext.
# enable_boundscheck`: a `NUMBA_BOUNDSCHECK=1` kernel checks every index), the forced
# arch (kbuild clears it around its own compiles, but it picks a device's arch).
CODEGEN_CONFIG = ("CUDA_ENABLE_NRT", "CUDA_NRT_STATS", "CUDA_DEBUG_POLY",
                  "CUDA_DEBUG_POLY_USE_TYPED_CONST", "FORCE_CUDA_CC", "BOUNDSCHECK")

# Read when a function is decorated, into its options (`opt`, `debug`): keyed there.
DECORATION_CONFIG = ("OPT", "CUDA_DEBUGINFO_DEFAULT")

# The option under which a function with debug information keys `config.OPT`: numba
# writes `isOptimized: OPT != 0` into that information when it compiles (debuginfo.py),
# and only there; the optimisation level itself is the `opt` option frozen at decoration.
DEBUGINFO_OPT = "debuginfo optimized (config.OPT)"


def codegen_config() -> dict:
    """The config values a compile starting now reads, by name (after the reload numba
    does at the start of every compile, so a `NUMBA_*` variable set since counts)."""
    from numba.cuda import config

    reload_settings(config)
    out = {}
    for name in CODEGEN_CONFIG:
        value = getattr(config, name, None)
        out[name] = tuple(value) if isinstance(value, list) else value
    return out


def reload_settings(config) -> None:
    """`config.reload_config()` (numba's settings module, any copy of it), skipped where
    numba's own would change nothing: the `NUMBA_*` variables are the very ones numba
    applied last (its test, made here without decoding the whole environment: numba's
    scan decodes every variable, ~30 µs a launch-time compile with 39 of them, most of the
    journal's settings digest). A config file (`.numba_config.yaml`), which numba reads
    at every reload, reloads every time."""
    reloader = getattr(config, "_env_reloader", None)
    applied = getattr(reloader, "old_environ", None)
    data = getattr(os.environ, "_data", None)
    fname = getattr(config, "_config_fname", None)
    if not isinstance(applied, dict) or not isinstance(data, dict) \
            or not isinstance(fname, str) or os.path.exists(fname):
        config.reload_config()
        return
    try:
        # POSIX: os.environ holds bytes, decoded as os.environ decodes them.
        now = {os.fsdecode(k): os.fsdecode(v) for k, v in data.items()
               if k.startswith(b"NUMBA_")}
    except TypeError:  # not bytes (Windows): numba's own scan
        config.reload_config()
        return
    if now != applied:
        config.reload_config()


def process_config() -> dict:
    """The codegen config and the values decoration reads: what a worker must share with
    the client that sends it a project (the client's dispatchers froze the latter)."""
    from numba.cuda import config

    return dict(codegen_config(), **{n: getattr(config, n, None) for n in DECORATION_CONFIG})


def with_compile_time(options: dict) -> dict:
    """A function's frozen options plus what its compile reads of the live config
    because of them: `OPT` where it has debug information (`debug` or `lineinfo`)."""
    if not (options.get("debug") or options.get("lineinfo")):
        return options
    from numba.cuda import config

    return dict(options, **{DEBUGINFO_OPT: config.OPT != 0})


def frozen_defaults(dispatcher) -> dict | None:
    """Parameter name -> default value, as the dispatcher recorded them when it was made
    (numba folds omitted arguments with this signature, not the function's current
    `__defaults__`); None when it records none (then the function's own are used)."""
    compiler = getattr(dispatcher, "_compiler", None)
    pysig = getattr(compiler, "pysig", None)
    if not isinstance(pysig, inspect.Signature):
        return None
    return {name: p.default for name, p in pysig.parameters.items()
            if p.default is not inspect.Parameter.empty}
