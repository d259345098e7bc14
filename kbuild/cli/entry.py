"""Where `kbuild` starts and ends: parse the command line (`commands`), run the command,
and map what went wrong to an exit code and one line (or, with --json, one object).

Exit codes: 0 success, 1 a target failed, 2 usage, configuration or internal error,
130 interrupted. With --json every outcome, errors included, is one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import sys

from .. import __version__
from ..errors import KbuildError
from .commands import handler, parser
from .common import (EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, Opened, error, flush_warnings,
                     interrupted, print_json, warnings)


def main(argv=None) -> int:
    """Run one command line (default: `sys.argv[1:]`); its exit code."""
    # A build compiles for real: the simulator would hand us fake kernels.
    simulated = os.environ.get("NUMBA_ENABLE_CUDASIM")
    if simulated not in (None, "", "0"):
        os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
    from ..zeroconf.startup import stand_down

    stand_down()  # KBUILD_ENABLE is for programs, not for kbuild's own commands
    argv = sys.argv[1:] if argv is None else list(argv)
    args = argparse.Namespace(json="--json" in argv)  # what an error before parsing knows
    opened = Opened()
    try:
        the_parser = parser()
        args = the_parser.parse_args(argv)
        if getattr(args, "command", None) == "run" and simulated is not None:
            os.environ["NUMBA_ENABLE_CUDASIM"] = simulated  # `kbuild run` runs CMD as asked
        if not getattr(args, "command", None):  # `kbuild --version`, or a bare `kbuild`
            return _print_versions() if args.version else _usage(the_parser)
        return handler(args.run)(args, opened)
    except KbuildError as exc:
        return _fail(args, opened, str(exc), exc.exit_code, type(exc).__name__)
    except KeyboardInterrupt:
        return _fail(args, opened, "interrupted", EXIT_INTERRUPTED, "Interrupted")
    except BrokenPipeError:
        # `kbuild status | head`: the reader left; say nothing more on a closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - a bug of ours: one line, not a traceback
        if interrupted(exc):
            return _fail(args, opened, "interrupted", EXIT_INTERRUPTED, "Interrupted")
        if os.environ.get("KBUILD_TRACEBACK"):
            raise
        return _fail(args, opened, f"internal error: {type(exc).__name__}: {exc} (set "
                           "KBUILD_TRACEBACK=1 for the traceback, and please report it)",
                     EXIT_USAGE, "InternalError")
    finally:
        flush_warnings(opened)


def _usage(the_parser) -> int:
    the_parser.print_help()
    return EXIT_USAGE


def _fail(args, opened: Opened, message: str, code: int, kind: str) -> int:
    """Report an error: one line on stderr, or with --json one object on stdout (and
    nothing on stderr: a machine reads one stream, a person sees no echo of it)."""
    if getattr(args, "json", False):
        print_json({"error": message, "kind": kind, "exit_code": code,
                    "warnings": warnings(opened)})
    else:
        error(message)
    return code


def _print_versions() -> int:
    """kbuild's version first (what scripts parse), then the toolchain's; no driver is fine."""
    from ..backend import versions

    print(f"kbuild {__version__}")
    for name, version in versions().items():
        print(f"  {name:13} {version}")
    return EXIT_OK


def run(argv=None) -> None:
    """The console entry point (`kbuild`, `python -m kbuild`): `main`, then leave.

    Leaving skips the interpreter's teardown, which spends 0.2-0.5 s after every
    command unloading numba and the CUDA libraries; the atexit handlers still run
    and the output is flushed first. `main` itself returns, for callers in-process.

    The cyclic garbage collector runs less often: a command allocates hundreds of
    thousands of small objects while it keys (tuples, syntax trees) over numba's
    million, and each collection walks them all; at Python's default thresholds that
    was a quarter of a no-op's CPU time at 512 kernels. Young cycles are still
    collected; the peak memory of a no-op does not change.
    """
    gc.set_threshold(50_000, 20, 100)
    code = main(argv)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to say
            pass
    atexit._run_exitfuncs()
    os._exit(code)
