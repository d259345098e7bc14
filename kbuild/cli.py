"""The `kbuild` command line: parse arguments, call the project API, map errors to exit codes.

Exit codes: 0 success, 1 a target failed, 2 usage, configuration or internal error,
130 interrupted. With --json every outcome, errors included, is one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import sys
import time

from . import __version__
from .errors import KbuildError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")  # what store/archive.py writes


class UsageError(KbuildError):
    """The command line itself is wrong (argparse's complaint)."""


class _Parser(argparse.ArgumentParser):
    """argparse, raising instead of exiting, so `--json` can still answer in JSON."""

    def error(self, message):
        raise UsageError(f"{message}; see '{self.prog} --help'")


def main(argv=None) -> int:
    # A build compiles for real: the simulator would hand us fake kernels.
    simulated = os.environ.get("NUMBA_ENABLE_CUDASIM")
    if simulated not in (None, "", "0"):
        os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
    from .zeroconf.startup import stand_down

    stand_down()  # KBUILD_ENABLE is for programs, not for kbuild's own commands
    argv = sys.argv[1:] if argv is None else list(argv)
    args = argparse.Namespace(json="--json" in argv)  # what an error before parsing knows
    try:
        parser = _parser()
        args = parser.parse_args(argv)
        if getattr(args, "command", None) == "run" and simulated is not None:
            os.environ["NUMBA_ENABLE_CUDASIM"] = simulated  # `kbuild run` runs CMD as asked
        if args.version and not getattr(args, "command", None):
            return _print_versions()
        if not getattr(args, "command", None):
            parser.print_help()
            return EXIT_USAGE
        return args.run(args)
    except KbuildError as exc:
        return _fail(args, str(exc), exc.exit_code, type(exc).__name__)
    except KeyboardInterrupt:
        return _fail(args, "interrupted", EXIT_INTERRUPTED, "Interrupted")
    except BrokenPipeError:
        # `kbuild status | head`: the reader left; say nothing more on a closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - a bug of ours: one line, not a traceback
        if os.environ.get("KBUILD_TRACEBACK"):
            raise
        return _fail(args, f"internal error: {type(exc).__name__}: {exc} (set "
                           "KBUILD_TRACEBACK=1 for the traceback, and please report it)",
                     EXIT_USAGE, "InternalError")
    finally:
        _flush_warnings(args)


def _fail(args, message: str, code: int, kind: str) -> int:
    """Report an error: one line on stderr, and with --json one object on stdout too."""
    _error(message)
    if getattr(args, "json", False):
        _print_json({"error": message, "kind": kind, "exit_code": code,
                     "warnings": _warnings(args)})
    return code


def run(argv=None) -> None:
    """The console entry point (`kbuild`, `python -m kbuild`): `main`, then leave.

    Leaving skips the interpreter's teardown, which spends 0.2-0.5 s after every
    command unloading numba and the CUDA libraries; the atexit handlers still run
    and the output is flushed first. `main` itself returns, for callers in-process.
    """
    code = main(argv)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to say
            pass
    atexit._run_exitfuncs()
    os._exit(code)


def _common(default) -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--config", metavar="PATH", default=default,
                        help="project file (default: kbuild.toml here or in the nearest parent)")
    common.add_argument("--store", metavar="DIR", default=default,
                        help="store directory (default: the file's store, $KBUILD_STORE, "
                             "~/.cache/kbuild)")
    return common


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kbuild", parents=[_common(None)],
        description="Content-addressed, make-like builds of numba-cuda kernels.")
    # A subcommand's own defaults would overwrite `kbuild --store DIR build`: suppress them.
    common = _common(argparse.SUPPRESS)
    parser.add_argument("--version", action="store_true",
                        help="print kbuild's version and the toolchain's, and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("build", parents=[common], help="build what is out of date")
    _targets_and_arch(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("-k", "--keep-going", action="store_true",
                   help="build the other targets when one fails")
    p.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                   help="compile N targets at once (default: the number of cores)")
    p.add_argument("--read-only", action="store_true",
                   help="only look up the store (a shared one): targets not in it fail")
    p.add_argument("--whole-program", action="store_true",
                   help="compile each kernel with its device functions as one program "
                        "(default: device functions as separate objects, linked with LTO)")
    p.add_argument("--max-size", metavar="SIZE",
                   help="after building, evict least-recently-used entries down to SIZE "
                        "(default: [store] max_size)")
    _remote_options(p)
    p.add_argument("--executor", metavar="local|dask://HOST:PORT", default=None,
                   help="where to compile: local processes (default) or a Dask cluster")
    _failure_options(p)
    _loudness(p, "print only failed targets (first line of the error) and the summary")
    p.set_defaults(run=cmd_build)

    p = sub.add_parser("watch", parents=[common],
                       help="stay resident and rebuild when a project file is saved")
    _targets_and_arch(p)
    p.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                   help="compile N targets at once (default: the number of cores)")
    p.add_argument("--whole-program", action="store_true",
                   help="compile each kernel with its device functions as one program")
    _failure_options(p)
    _loudness(p, "print only failed targets and the summary of each build")
    p.add_argument("--rounds", type=int, default=None, metavar="N", help=argparse.SUPPRESS)
    p.set_defaults(run=cmd_watch, json=False, keep_going=True, watching=True)

    p = sub.add_parser("init", help="write a kbuild.toml here from the @cuda.jit kernels found "
                                     "in the sources (eager signatures as declared)")
    p.add_argument("folders", nargs="*", metavar="PACKAGE",
                   help="folders or files to look in (default: everything here but tests, "
                        "docs, benchmarks and virtual environments)")
    p.add_argument("--arch", default="sm_80",
                   help="architectures to declare, comma-separated (default: sm_80)")
    p.add_argument("--force", action="store_true", help="overwrite an existing kbuild.toml")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_init)

    p = sub.add_parser("gc", parents=[common],
                       help="evict least-recently-used entries and orphan blobs")
    p.add_argument("--max-size", metavar="SIZE", help="e.g. 500MB (default: [store] max_size; "
                   "without one, only orphan blobs and stale temp files go)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_gc)

    p = sub.add_parser("stats", parents=[common],
                       help="entries, blobs, bytes, and hits/misses/builds of recent builds")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_stats)

    p = sub.add_parser("status", parents=[common],
                       help="which targets are up-to-date, stale or missing, and why (no compile)")
    _targets_and_arch(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when a target is stale or missing (pre-commit hooks, CI)")
    p.set_defaults(run=cmd_status)

    p = sub.add_parser("explain", parents=[common],
                       help="which key inputs of a target changed since it was last built")
    p.add_argument("target", help="module:attr.path or a unique short name")
    p.add_argument("--arch", help="only these architectures, comma-separated")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_explain)

    p = sub.add_parser("clean", parents=[common],
                       help="remove this project's entries and blobs no other entry uses")
    p.add_argument("--all", action="store_true", help="empty the whole store")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_clean)

    p = sub.add_parser("keys", parents=[common],
                       help="the current target keys and one digest of them (a CI cache key)")
    _targets_and_arch(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_keys)

    p = sub.add_parser("export", parents=[common],
                       help="write the current targets' entries and blobs to one archive")
    p.add_argument("file", help="archive to write (.tar, or .tar.gz / .tgz for gzip)")
    _targets_and_arch(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_export)

    p = sub.add_parser("import", parents=[common],
                       help="merge an archive into the store, verifying every blob and entry")
    p.add_argument("file", help="archive written by kbuild export")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_import)

    p = sub.add_parser("graph", parents=[common],
                       help="the target graph: kernels, device functions, what is stale")
    _targets_and_arch(p)
    p.add_argument("--format", choices=("dot", "json", "png"), default="dot")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.set_defaults(run=cmd_graph)

    p = sub.add_parser("show", parents=[common],
                       help="a built target's PTX, SASS, or registers and memory per thread")
    p.add_argument("target", help="module:attr.path or a unique short name")
    p.add_argument("--arch", help="only these architectures, comma-separated")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--resources", action="store_const", dest="show", const="resources",
                      help="registers, local (stack frame) and static shared memory (default)")
    what.add_argument("--ptx", action="store_const", dest="show", const="ptx",
                      help="the PTX")
    what.add_argument("--sass", action="store_const", dest="show", const="sass",
                      help="the SASS, through nvdisasm (where installed)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_show, show="resources")

    p = sub.add_parser("cat", parents=[common], help="write a blob's bytes to stdout")
    p.add_argument("hash", help="the blob's xxh3-128 hash (32 hex digits)")
    p.set_defaults(run=cmd_cat)

    from .zeroconf import run as zeroconf_run

    p = sub.add_parser("run", parents=[common], help="run a command with every kernel it "
                       "compiles cached (--record: write them into kbuild.toml)")
    zeroconf_run.add_arguments(p)
    p.set_defaults(run=zeroconf_run.handle)

    p = sub.add_parser("bundle", parents=[common],
                       help="write the built kernels into a package directory (e.g. mypkg/_kbuild)")
    p.add_argument("dir", help="the bundle directory, inside the package")
    p.add_argument("--arch", help="archs to bundle, comma-separated (default: the declared)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=cmd_bundle)
    return parser


def _print_versions() -> int:
    """kbuild's version first (what scripts parse), then the toolchain's; no driver is fine."""
    from .backend.toolchain import versions

    print(f"kbuild {__version__}")
    for name, version in versions().items():
        print(f"  {name:13} {version}")
    return EXIT_OK


def _loudness(p, quiet_help: str) -> None:
    loud = p.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true", help=quiet_help)
    loud.add_argument("-v", "--verbose", action="store_true",
                      help="also print each target's key, and every error in full")


def _failure_options(p):
    p.add_argument("--target-timeout", type=_seconds, default=None, metavar="SECONDS",
                   help="stop a target's compile after SECONDS: it fails alone, the rest "
                        "build (default: [build] target_timeout, else none; 0: none)")
    p.add_argument("--retry-failed", action="store_true",
                   help="compile targets whose failure was recorded for their current key "
                        "(otherwise they fail at once)")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r} (like 600; 0 for "
                                         "no limit)")
    return value


def _remote_options(p):
    p.add_argument("--remote", metavar="URL",
                   help="shared cache behind the store: redis://HOST:PORT/DB, s3://BUCKET/PREFIX, "
                        "file:///PATH ... (default: $KBUILD_REMOTE, else [store] remote)")
    p.add_argument("--no-remote", action="store_true", help="use no remote cache")
    p.add_argument("--remote-read-only", action="store_true",
                   help="read from the remote cache but never write to it (CI jobs)")
    p.add_argument("--remote-timeout", metavar="SECONDS",
                   help="bound on every remote call (default: $KBUILD_REMOTE_TIMEOUT, "
                        "[store] remote_timeout, else 5)")


def _targets_and_arch(p):
    p.add_argument("targets", nargs="*", metavar="TARGET",
                   help="module:attr.path or a unique short name (default: all)")
    p.add_argument("--arch", help="architectures to build, comma-separated (e.g. sm_80,sm_90)")


# -- commands -----------------------------------------------------------------

def cmd_build(args) -> int:
    from .build import default_jobs, parse_archs
    from .project import open_project

    project = _remember(args, open_project(args.config, args.store, read_only=args.read_only))
    archs = parse_archs(args.arch)
    max_size = _max_size(args, project)
    project.store.remote, executor = _remote_and_executor(args, project)
    if not args.read_only:
        project.store.check_root()  # before keying imports numba and the project
    start = time.perf_counter()
    the_plan = project.plan(args.targets, archs)
    jobs = args.jobs if args.jobs else default_jobs()
    report = BuildReport(args, the_plan, project.store)
    try:
        rows = project.build(args.targets, archs, keep_going=args.keep_going, jobs=jobs,
                             progress=report, separate=not args.whole_program,
                             executor=executor, **_failure_settings(args))
    except KeyboardInterrupt:
        # Finished rows are committed; what was compiling is dropped, its locks released.
        return report.finish(report.rows, time.perf_counter() - start, interrupted=True)
    if max_size is not None and not args.read_only:
        from .store.maintenance import gc

        gc(project.store, max_size, keep=[the_plan.keys[t].digest for t in the_plan.targets])
    return report.finish(rows, time.perf_counter() - start)


class BuildReport:
    """The build's rows for a person or a program: the build's progress callback
    collects them (streamed as they finish on a terminal), `finish` prints the rest.

    Rows come out in one order every run: the plan's, failed rows after the others and
    skipped rows last, so a -j2 race between a failure and its neighbours changes no
    line's position. A kernel's repeated compile error is printed once.
    """

    def __init__(self, args, the_plan, store):
        self.args, self.the_plan, self.store = args, the_plan, store
        self.rows = []
        self.verbose, self.quiet = args.verbose, args.quiet
        terminal = not args.json and sys.stdout.isatty()
        self.stream = terminal
        self.colour = terminal and _colour_wanted()
        self.bar = _ProgressBar(the_plan.total) if not args.json and not args.quiet and \
            sys.stderr.isatty() else None
        self.first_errors: dict = {}  # (kernel, error head) -> label of the row that showed it
        order = [*the_plan.targets, *the_plan.failed]
        self.order = {(t.name, t.signature, t.arch): i for i, t in enumerate(order)}

    def __call__(self, row, done, total):
        self.rows.append(row)
        if self.stream:
            if self.bar:
                self.bar.clear()
            self._print_row(row)
        if self.bar:
            self.bar(row, done, total)

    def started(self, target) -> None:
        """The build began compiling (or linking) `target`: the bar names what is in flight."""
        if self.bar:
            self.bar.started(target)

    def finish(self, rows, seconds: float, interrupted: bool = False) -> int:
        if self.bar:
            self.bar.clear()
        rows = sorted(rows, key=self._position)
        summary = {s: sum(r.status == s for r in rows)
                   for s in ("built", "cached", "failed", "skipped")}
        summary["seconds"] = round(seconds, 3)
        if interrupted:
            summary["interrupted"] = True
            _error("interrupted")
        if self.args.json:
            answer = {"targets": [self._json_row(r) for r in rows], "summary": summary,
                      "store": str(self.store.root), "warnings": _warnings(self.args)}
            if interrupted:
                answer.update(error="interrupted", exit_code=EXIT_INTERRUPTED)
            _print_json(answer)
        else:
            if not self.stream:
                for row in rows:
                    self._print_row(row)
            print(self._summary_line(summary, len(self.order) - len(rows), interrupted))
        if interrupted:
            return EXIT_INTERRUPTED
        return EXIT_FAILED if summary["failed"] else EXIT_OK

    def _position(self, row):
        rank = {"failed": 1, "skipped": 2}.get(row.status, 0)
        return rank, self.order.get((row.target, row.signature, row.arch), len(self.order))

    def _summary_line(self, summary, not_done: int, interrupted: bool) -> str:
        line = (f"{summary['built']} built, {summary['cached']} cached, "
                f"{summary['failed']} failed"
                + (f", {summary['skipped']} skipped" if summary["skipped"] else "")
                + f" in {summary['seconds']:.2f}s")
        if interrupted:
            line = f"interrupted: {line}; {not_done} not built"
        return line

    def _json_row(self, row) -> dict:
        out = row.as_json()
        if row.status == "failed" and row.key is not None:
            out["where"] = self._where(row)
        return out

    def _print_row(self, row) -> None:
        if self.quiet and row.status != "failed":
            return
        if row.status == "cached" and getattr(self.args, "watching", False):
            return  # a watch prints what each save changed, not the whole project again
        line = f"{self._paint(row.status)} {row.target} {row.signature} {row.arch}"
        if row.launch is not None:
            line += f" (grid {row.launch['grid']} block {row.launch['block']})"
        if row.status == "built":
            line += f"  {row.seconds:.2f}s" + _relinked(row)
        print(line, flush=self.stream)
        indent = " " * 9
        if self.verbose and row.key:
            print(f"{indent}key {row.key}")
        if row.note and row.status == "built" and not self.args.whole_program:
            print(f"{indent}linked as one program: {row.note}")
        if row.error and row.status == "failed":
            print(indent + self._error_text(row).replace("\n", "\n" + indent),
                  flush=self.stream)

    def _error_text(self, row) -> str:
        """The row's error; a compile error with the kernel's file:line first, and only
        once per kernel: its other rows name the row that showed it (-v: every time)."""
        if row.key is None:  # an import failure: already one line with its file:line
            return row.error
        head = row.error.splitlines()[0]
        seen = self.first_errors.setdefault((row.target, head), f"{row.signature} {row.arch}")
        if seen != f"{row.signature} {row.arch}" and not self.verbose:
            return f"same error as {row.target} {seen}"
        return f"{self._where(row)}: {head if self.quiet else row.error}"

    def _where(self, row) -> str:
        return _error_location(row.error, self.the_plan.kernels.get(row.target),
                               self.the_plan.config.root)

    def _paint(self, status: str) -> str:
        text = f"{status:8}"
        code = {"built": "32", "cached": "2", "failed": "1;31", "skipped": "33"}.get(status)
        return f"\x1b[{code}m{text}\x1b[0m" if self.colour and code else text


_FILE_LINE = re.compile(r'File "(?P<file>[^"]+\.py)", line (?P<line>\d+)'
                        r"|\bat (?P<file2>\S+\.py) \((?P<line2>\d+)\)")


def _error_location(error: str, resolved, root) -> str:
    """file:line of a compile error: the first source position numba's message names,
    else where the kernel is defined (numba's typing errors often name none)."""
    found = _FILE_LINE.search(error or "")
    if found:
        path, line = found.group("file") or found.group("file2"), \
            found.group("line") or found.group("line2")
    else:
        code = getattr(getattr(getattr(resolved, "kernel", None), "py_func", None),
                       "__code__", None)
        if code is None:
            return "?"
        path, line = code.co_filename, _def_line(code.co_filename, code.co_firstlineno)
    relative = os.path.relpath(path, root) if os.path.isabs(path) else path
    return f"{path if relative.startswith('..') else relative}:{line}"


def _def_line(path: str, first: int) -> int:
    """The `def` line of a function whose code starts at `first` (its first decorator)."""
    import linecache

    for number in range(first, first + 50):
        text = linecache.getline(path, number).lstrip()
        if text.startswith(("def ", "async def ")):
            return number
        if not text:
            break
    return first


def _colour_wanted() -> bool:
    """Colour on a terminal only, and never when NO_COLOR is set (no-color.org) or
    TERM is dumb."""
    return not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def cmd_watch(args) -> int:
    """Build, then wait for a saved file and build again, in one process, until Ctrl-C.
    A round that fails (a config error, a module that does not import) is reported and
    the watch goes on; every round keeps going past failed targets."""
    from .backend.compiler import prepare
    from .build import default_jobs, parse_archs
    from .discover import forget_project_modules
    from .watch import snapshot, wait_for_change

    archs = parse_archs(args.arch)
    jobs = args.jobs or default_jobs()
    rounds = 0
    try:
        while True:
            roots, extra = _watch_round(args, archs, jobs)
            rounds += 1
            if args.rounds is not None and rounds >= args.rounds:
                return EXIT_OK
            seen = snapshot(roots, extra)
            print(f"watching {len(seen)} files; Ctrl-C to stop", flush=True)
            _, what = wait_for_change(roots, extra, seen, idle=[prepare])
            print(f"changed: {', '.join(os.path.relpath(p) for p in what[:5])}"
                  + (f" and {len(what) - 5} more" if len(what) > 5 else ""), flush=True)
            forget_project_modules()
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED


def _watch_round(args, archs, jobs):
    """One build; (the folders and files to watch for the next one)."""
    from .config import find_config
    from .project import open_project

    start = time.perf_counter()
    try:
        project = _remember(args, open_project(args.config, args.store))
        project.store.warnings.clear()
        the_plan = project.plan(args.targets, archs)
        report = BuildReport(args, the_plan, project.store)
        rows = project.build(args.targets, archs, keep_going=True, jobs=jobs, progress=report,
                             separate=not args.whole_program, **_failure_settings(args))
        report.finish(rows, time.perf_counter() - start)
        roots, extra = project.config.paths, [project.config.path]
    except KbuildError as exc:
        _error(str(exc))
        config = args.config or _nearest_config(find_config)
        roots, extra = [os.path.dirname(os.path.abspath(config)) if config else os.getcwd()], \
            [config] if config else []
    _flush_warnings(args)
    if getattr(args, "_store", None) is not None:
        args._store.warnings.clear()
    sys.stdout.flush()
    return roots, extra


def _nearest_config(find_config):
    try:
        return str(find_config())
    except KbuildError:
        return None


def cmd_init(args) -> int:
    from pathlib import Path

    from .build import parse_archs
    from .scaffold import write_config

    result = write_config(Path.cwd(), args.folders, parse_archs(args.arch), force=args.force)
    if args.json:
        _print_json(result)
        return EXIT_OK
    print(f"wrote {result['file']}: {len(result['kernels'])} kernels with their signatures"
          + (f", {len(result['lazy'])} lazy ones commented out (declare the signatures they "
             "are launched with)" if result["lazy"] else ""))
    for name in result["lazy"]:
        print(f"  lazy: {name}")
    print("next: kbuild status, then kbuild build")
    return EXIT_OK


def _failure_settings(args) -> dict:
    """`Project.build`'s `target_timeout` and `retry_failed` from build/watch options."""
    return {"target_timeout": args.target_timeout, "retry_failed": args.retry_failed}


def _remote_and_executor(args, project):
    """The remote tier (CLI > env > kbuild.toml) and the executor (None: local) of a build."""
    from .execute.distributed import parse_executor
    from .store.remote import open_remote, remote_settings, remote_timeout

    settings = remote_settings(project.config, url=args.remote, no_remote=args.no_remote,
                               read_only=args.remote_read_only, timeout=args.remote_timeout)
    executor = parse_executor(args.executor, warnings=project.store.warnings,
                              timeout=remote_timeout(project.config, args.remote_timeout))
    return open_remote(settings), executor


def _max_size(args, project):
    from .store.maintenance import parse_size

    if getattr(args, "max_size", None):
        return parse_size(args.max_size)
    return project.config.max_size


def cmd_gc(args) -> int:
    from .store.maintenance import gc
    from .project import open_project

    project = _remember(args, open_project(args.config, args.store))
    max_size = _max_size(args, project)
    try:
        the_plan = project.plan()
        keep = [the_plan.keys[t].digest for t in the_plan.targets]
    except KbuildError as exc:
        # A project that does not import still gets its store bounded; say what is unprotected.
        project.store.warnings.append(f"current keys unknown ({exc}); no entry is protected")
        keep = []
    result = gc(project.store, max_size, keep)
    result.update(_over_limit(project, max_size, keep, result))
    if result["over_limit"]:
        project.store.warnings.append(
            f"the store is still over {_size(max_size)} ({_size(result['bytes'])}): "
            f"{result['pinned_entries']} entries ({_size(result['pinned_bytes'])}) are pinned, "
            f"the current targets of project '{project.config.name}' and the objects they "
            "link from; raise --max-size, or `kbuild clean` projects you no longer build")
    if args.json:
        result["warnings"] = _warnings(args)
        _print_json(result)
    else:
        print(f"evicted {result['evicted_entries']} entries, removed {result['removed_blobs']} "
              f"blobs, {result['removed_temp_files']} temp files and {result['removed_facts']} "
              f"facts files, freed "
              f"{_size(result['freed_bytes'])}; the store now holds {result['blobs']} blobs "
              f"({_size(result['bytes'])})")
        for target in result["evicted"]:
            print(f"  evicted {target}")
    return EXIT_OK


def _over_limit(project, max_size, keep, result) -> dict:
    """Whether gc left the store over `max_size`, and what it was not allowed to evict:
    the current targets' entries and the objects they link from, with their blobs' bytes."""
    over = max_size is not None and result["bytes"] > max_size
    if not over:
        return {"over_limit": False, "pinned_entries": 0, "pinned_bytes": 0}
    store, pinned, blobs = project.store, set(), set()
    for key in keep:
        manifest = store.lookup(key)
        if manifest is None:
            continue
        objects = (manifest.get("link") or {}).get("objects", ())
        for entry_key, entry in [(key, manifest)] + [(k, store.lookup(k)) for k in objects]:
            if entry is not None:
                pinned.add(entry_key)
                blobs.update(entry["artifacts"].values())
    size = sum(store.blob_path(b).stat().st_size for b in blobs if store.blob_path(b).is_file())
    return {"over_limit": True, "max_size": max_size, "pinned_entries": len(pinned),
            "pinned_bytes": size}


def cmd_stats(args) -> int:
    from .store.maintenance import stats

    result = stats(_store_only(args, read_only=True))
    if args.json:
        _print_json(result)
    else:
        print(f"store        {result['store']}")
        print(f"entries      {result['entries']}")
        print(f"objects      {result['objects']}")
        print(f"blobs        {result['blobs']} ({_size(result['bytes'])})")
        print(f"last {result['recent_builds']} builds: {result['hits']} hits, "
              f"{result['misses']} misses, {result['builds']} built, {result['failures']} failed")
        if result["remote_hits"] or result["remote_misses"] or result["remote_bytes_pushed"]:
            print(f"remote       {result['remote_hits']} hits, {result['remote_misses']} misses, "
                  f"{_size(result['remote_bytes_fetched'])} fetched, "
                  f"{_size(result['remote_bytes_pushed'])} pushed"
                  + (f", {result['remote_rejected']} rejected" if result["remote_rejected"] else "")
                  + (f", {result['remote_errors']} unreachable" if result["remote_errors"] else ""))
    return EXIT_OK


def _relinked(row) -> str:
    """'  relinked: only device function m:f changed' (the edit compilation was skipped for)."""
    if row.link != "relink":
        return ""
    if not row.changed:
        return "  relinked"
    plural = "s" if len(row.changed) > 1 else ""
    return f"  relinked: only device function{plural} {', '.join(row.changed)} changed"


def cmd_status(args) -> int:
    from .build import parse_archs
    from .project import open_project

    project = _remember(args, open_project(args.config, args.store, read_only=True))
    archs = parse_archs(args.arch)
    rows = project.status(args.targets, archs)
    if args.json:
        counts = {s: sum(r["status"] == s for r in rows)
                  for s in ("up-to-date", "stale", "missing", "failed", "unkeyable")}
        _print_json({"targets": rows, "summary": counts})
    else:
        for r in rows:
            # One line per target: a compile error's first line (`explain` shows it all).
            firsts = [reason.splitlines()[0] if reason else reason for reason in r["reasons"]]
            why = f"  ({'; '.join(firsts)})" if firsts else ""
            print(f"{r['status']:10} {r['target']} {r['signature']} {r['arch']}{why}")
    wanted = ("up-to-date",) if args.check else ("up-to-date", "stale", "missing")
    return EXIT_OK if all(r["status"] in wanted for r in rows) else EXIT_FAILED


def cmd_explain(args) -> int:
    from .build import parse_archs
    from .project import open_project

    project = _remember(args, open_project(args.config, args.store, read_only=True))
    archs = parse_archs(args.arch)
    rows = project.status([args.target], archs, diffs=True)
    code = EXIT_FAILED if any(r["status"] == "failed" for r in rows) else EXIT_OK
    if args.json:
        _print_json({"targets": rows})
        return code
    for r in rows:
        print(f"{r['target']} {r['signature']} {r['arch']}: {r['status']}")
        for line in _explanation(r):
            print(f"  {line}")
    return code


def _explanation(row) -> list[str]:
    """What `kbuild explain` says of one status row, below its heading."""
    if row["status"] == "up-to-date":
        return _cached_explanation(row)
    lines = []
    if row["status"] == "stale" and row.get("previous_is_newest") is False:
        lines.append(f"(compared with its build of {row['previous_built_at']}, the one "
                     "closest to these inputs; newer builds differ more)")
    changes = row.get("changes") or [{"message": r} for r in row["reasons"]]
    for change in changes:
        lines.append(change["message"])
        if change.get("diff"):
            lines += [f"  {line}" for line in change["diff"].splitlines()]
        elif "diff" in change:
            lines.append(f"  ({change.get('diff_note') or _same_text(change)})")
    return lines


def _cached_explanation(row) -> list[str]:
    when = row.get("built_at") or "at an unknown time"
    newest = row.get("newest")
    if not newest:
        return [f"nothing changed since it was built ({when})"]
    return [f"cached (built earlier, {when})",
            f"the newest build ({newest['built_at']}) was for other inputs:",
            *(f"  {reason}" for reason in newest["reasons"])]


def _same_text(change) -> str:
    if "line numbers" in f"{change.get('old')} {change.get('new')}":
        return "the same source; its line numbers moved"
    return "the same source text; its bytecode differs"


def cmd_clean(args) -> int:
    from .project import open_project

    project = _remember(args, open_project(args.config, args.store))
    result = project.clean(everything=args.all)
    if args.json:
        _print_json(result)
    else:
        n = result.get("failures", 0)
        records = f", {n} failure record{'s' if n != 1 else ''}" if n else ""
        print(f"removed {result['entries']} entries and {result['blobs']} blobs "
              f"({_size(result['bytes'])}){records} from {project.store.root}")
    return EXIT_OK


def cmd_keys(args) -> int:
    from .keying.encode import digest_of

    _, the_plan = _planned(args)
    rows = [{"target": t.name, "signature": t.signature, "arch": t.arch,
             "key": the_plan.keys[t].digest} for t in the_plan.targets]
    failed = [{"target": t.name, "signature": t.signature, "arch": t.arch, "key": None,
               "error": str(error)}
              for t, error in the_plan.failed.items()]
    # A digest missing some targets' keys would name a cache that is not the project's.
    combined = None if failed else digest_of(tuple(sorted(r["key"] for r in rows)))
    if args.json:
        _print_json({"targets": rows + failed, "digest": combined})
    else:
        for r in rows:
            print(f"{r['key']}  {r['target']} {r['signature']} {r['arch']}")
        for r in failed:
            print(f"{'failed':32}  {r['target']} {r['signature']} {r['arch']}: {r['error']}")
        print(f"digest {combined or '(none: a target failed)'}")
    return EXIT_FAILED if failed else EXIT_OK


def cmd_export(args) -> int:
    from .store.archive import export_archive
    from .store.signing import signing_key

    if not args.file.endswith(ARCHIVE_SUFFIXES):
        raise UsageError(f"export: cannot write {args.file!r}: kbuild writes tar archives; "
                         f"name it {', '.join(ARCHIVE_SUFFIXES)}")
    project, the_plan = _planned(args)
    for error in the_plan.failed.values():
        raise error  # an archive missing targets would look complete to whoever imports it
    result = export_archive(project.store, [the_plan.keys[t].digest for t in the_plan.targets],
                            args.file, key=signing_key(project.config))
    if args.json:
        _print_json(result)
    else:
        print(f"exported {result['entries']} entries and {result['blobs']} blobs "
              f"({_size(result['bytes'])}) to {result['file']}")
    return EXIT_OK


def cmd_bundle(args) -> int:
    from .build import parse_archs
    from .bundle import write_bundle
    from .project import open_project

    project = open_project(args.config, args.store, read_only=True)
    report = write_bundle(project, args.dir, parse_archs(args.arch))
    if args.json:
        _print_json(report)
    else:
        print(f"bundled {report['targets']} targets ({', '.join(report['archs'])}) as "
              f"{report['blobs']} blobs ({_size(report['bytes'])}) into {report['dir']}")
    return EXIT_OK


def cmd_import(args) -> int:
    from .store.archive import import_archive
    from .store.signing import signing_key

    store = _store_only(args)
    result = import_archive(store, args.file, key=signing_key(args._config))
    if args.json:
        _print_json(result)
    else:
        print(f"imported {result['new_entries']} new entries ({result['entries']} in the archive) "
              f"and {result['new_blobs']} new blobs into {store.root}")
    return EXIT_OK


def cmd_graph(args) -> int:
    from . import graph as graphs

    project, the_plan = _planned(args)
    graph = graphs.target_graph(the_plan, lambda key: project.store.lookup(key) is not None)
    if args.format == "png":
        try:
            data = graphs.to_png(graph)
        except RuntimeError as exc:
            raise KbuildError(str(exc)) from None
    else:
        text = graphs.to_dot(graph) if args.format == "dot" else graphs.to_json(graph) + "\n"
        data = text.encode()
    if args.output:
        with open(args.output, "wb") as fh:
            fh.write(data)
    else:
        sys.stdout.buffer.write(data)
    return EXIT_OK


def cmd_show(args) -> int:
    from .backend.cubin import disassemble, resources

    project, the_plan = _planned(args)
    for error in the_plan.failed.values():
        raise error
    rows, missing = [], []
    for target in (t for t in the_plan.targets if _is_named(the_plan, t, args.target)):
        manifest = project.store.lookup(the_plan.keys[target].digest)
        if manifest is None:
            missing.append(target.label)
            continue
        cubin = project.store.read_blob(manifest["artifacts"]["cubin"])
        row = {"target": target.name, "signature": target.signature, "arch": target.arch,
               "key": the_plan.keys[target].digest, "entry": manifest.get("entry")}
        if args.show == "resources":
            row["functions"] = resources(cubin)
            row["resources"] = row["functions"].get(row["entry"], {})
        elif args.show == "ptx":
            row["ptx"] = project.store.read_blob(manifest["artifacts"]["ptx"]).decode()
        else:
            try:
                row["sass"] = disassemble(cubin)
            except RuntimeError as exc:
                raise KbuildError(f"show --sass: {exc}") from None
        rows.append(row)
    for label in missing:
        project.store.warnings.append(f"{label} is not built (or stale): run kbuild build "
                                      f"{args.target} first")
    if args.json:
        _print_json({"targets": rows, "warnings": _warnings(args)})
    else:
        for row in rows:
            _print_shown(row, args.show, several=len(rows) > 1)
    return EXIT_FAILED if missing else EXIT_OK


def _is_named(the_plan, target, name: str) -> bool:
    from .build import select_specs

    return target.name == select_specs(the_plan.config, [name])[0].name


def _print_shown(row, what: str, several: bool) -> None:
    label = f"{row['target']} {row['signature']} {row['arch']}"
    if what == "resources":
        r = row["resources"]
        print(f"{label}: {r.get('registers', '?')} registers, {_size(r.get('local_bytes', 0))} "
              f"local, {_size(r.get('shared_bytes', 0))} shared per "
              f"{'thread' if not r.get('shared_bytes') else 'thread / block'}")
        return
    if several:
        print(f"// kbuild: {label}")
    sys.stdout.write(row[what])
    if not row[what].endswith("\n"):
        sys.stdout.write("\n")


def cmd_cat(args) -> int:
    from .store.local import CorruptBlob

    store = _store_only(args, read_only=True)
    try:
        data = store.read_blob(args.hash)
    except CorruptBlob as exc:
        _error(f"{exc} in store {store.root}")
        return EXIT_FAILED
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    return EXIT_OK


# -- output helpers -------------------------------------------------------------

class _ProgressBar:
    """One self-rewriting line on stderr, shown only on a terminal: how many targets are
    done and what is compiling now (`[#####.....] 12/40  compiling saxpy sm_80, poly sm_90`)."""

    def __init__(self, total: int = 0):
        self.done, self.total = 0, total
        self.running: dict = {}  # (target, signature, arch) -> label, in the order started
        self.width = max(20, min(160, shutil.get_terminal_size((100, 24)).columns - 1))

    def __call__(self, row, done, total):
        self.done, self.total = done, total
        self.running.pop((row.target, row.signature, row.arch), None)
        self._draw(f"{row.status} {row.target[-40:]} {row.arch}")

    def started(self, target) -> None:
        label = f"{target.name.rpartition(':')[2]} {target.arch}"
        self.running[(target.name, target.signature, target.arch)] = label
        self._draw()

    def _draw(self, last: str = "") -> None:
        filled = 30 * self.done // max(self.total, 1)
        doing = list(dict.fromkeys(self.running.values()))  # one per kernel and arch
        what = f" compiling {', '.join(doing)}" if doing else last
        line = f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {what}"
        sys.stderr.write("\r" + line[:self.width].ljust(self.width))
        sys.stderr.flush()

    def clear(self):
        sys.stderr.write("\r" + " " * self.width + "\r")
        sys.stderr.flush()


def _store_only(args, read_only: bool = False):
    """The store a command names, for commands that need no project (cat, import, stats).

    A kbuild.toml is read only for its `store` setting; a broken or missing one is
    no obstacle when --store says where the store is.
    """
    from .config import default_store, load_config
    from .errors import ConfigError
    from .store.local import Store

    try:
        cfg = load_config(args.config) if args.config or not args.store else None
    except ConfigError:
        cfg = None
    args._config = cfg
    args._store = Store(default_store(cfg, args.store), read_only=read_only)
    return args._store


def _planned(args, read_only: bool = True):
    """(project, plan of the command's targets and --arch) for commands that key targets."""
    from .build import parse_archs
    from .project import open_project

    project = _remember(args, open_project(args.config, args.store, read_only=read_only))
    return project, project.plan(getattr(args, "targets", None), parse_archs(args.arch))


def _remember(args, project):
    args._store = project.store
    return project


def _warnings(args) -> list[str]:
    store = getattr(args, "_store", None)
    return list(dict.fromkeys(store.warnings)) if store is not None else []


def _flush_warnings(args) -> None:
    for message in _warnings(args):
        print(f"kbuild: warning: {message}", file=sys.stderr)


def _print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


def _error(message: str) -> None:
    print(f"kbuild: error: {message}", file=sys.stderr)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


if __name__ == "__main__":
    sys.exit(main())
