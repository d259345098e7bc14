"""The `kbuild` command line: parse arguments, call the project API, map errors to exit codes.

Exit codes: 0 success, 1 a target failed, 2 usage, configuration or internal error.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import time

from . import __version__
from .errors import KbuildError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def main(argv=None) -> int:
    # A build compiles for real: the simulator would hand us fake kernels.
    if os.environ.get("NUMBA_ENABLE_CUDASIM") not in (None, "", "0"):
        os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.run(args)
    except KbuildError as exc:
        _error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_USAGE
    except BrokenPipeError:
        # `kbuild status | head`: the reader left; say nothing more on a closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    finally:
        _flush_warnings(args)


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
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="PATH", default=default,
                        help="project file (default: kbuild.toml here or in the nearest parent)")
    common.add_argument("--store", metavar="DIR", default=default,
                        help="store directory (default: the file's store, $KBUILD_STORE, "
                             "~/.cache/kbuild)")
    return common


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kbuild", parents=[_common(None)],
        description="Content-addressed, make-like builds of numba-cuda kernels.")
    # A subcommand's own defaults would overwrite `kbuild --store DIR build`: suppress them.
    common = _common(argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=f"kbuild {__version__}")
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
    p.set_defaults(run=cmd_build)

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

    p = sub.add_parser("cat", parents=[common], help="write a blob's bytes to stdout")
    p.add_argument("hash", help="the blob's xxh3-128 hash (32 hex digits)")
    p.set_defaults(run=cmd_cat)
    return parser


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
    progress = None if args.json or not sys.stderr.isatty() else _ProgressBar()
    rows = project.build(args.targets, archs, keep_going=args.keep_going, jobs=jobs,
                         progress=progress, separate=not args.whole_program,
                         executor=executor)
    if progress:
        progress.close()
    if max_size is not None and not args.read_only:
        from .store.maintenance import gc

        gc(project.store, max_size, keep=[the_plan.keys[t].digest for t in the_plan.targets])
    seconds = time.perf_counter() - start
    summary = {s: sum(r.status == s for r in rows) for s in ("built", "cached", "failed", "skipped")}
    summary["seconds"] = round(seconds, 3)
    if args.json:
        _print_json({"targets": [r.as_json() for r in rows], "summary": summary,
                     "store": str(project.store.root), "warnings": _warnings(args)})
    else:
        for r in rows:
            line = f"{r.status:8} {r.target} {r.signature} {r.arch}"
            if r.status == "built":
                line += f"  {r.seconds:.2f}s" + ("  relinked" if r.link == "relink" else "")
            print(line)
            if r.note and r.status == "built" and not args.whole_program:
                print(f"         linked as one program: {r.note}")
            if r.error and r.status == "failed":
                print("         " + r.error.replace("\n", "\n         "))
        print(f"{summary['built']} built, {summary['cached']} cached, {summary['failed']} failed"
              + (f", {summary['skipped']} skipped" if summary["skipped"] else "")
              + f" in {seconds:.2f}s")
    return EXIT_FAILED if summary["failed"] else EXIT_OK


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
    if args.json:
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


def cmd_status(args) -> int:
    from .build import parse_archs
    from .project import open_project

    project = _remember(args, open_project(args.config, args.store, read_only=True))
    rows = project.status(args.targets, parse_archs(args.arch))
    if args.json:
        counts = {s: sum(r["status"] == s for r in rows) for s in ("up-to-date", "stale", "missing")}
        _print_json({"targets": rows, "summary": counts})
    else:
        for r in rows:
            why = f"  ({'; '.join(r['reasons'])})" if r["reasons"] else ""
            print(f"{r['status']:10} {r['target']} {r['signature']} {r['arch']}{why}")
    return EXIT_OK


def cmd_explain(args) -> int:
    from .build import parse_archs
    from .project import open_project

    project = _remember(args, open_project(args.config, args.store, read_only=True))
    rows = project.status([args.target], parse_archs(args.arch))
    if args.json:
        _print_json({"targets": rows})
        return EXIT_OK
    for r in rows:
        print(f"{r['target']} {r['signature']} {r['arch']}: {r['status']}")
        if r["status"] == "up-to-date":
            print("  nothing changed since it was built")
        for reason in r["reasons"]:
            print(f"  {reason}")
    return EXIT_OK


def cmd_clean(args) -> int:
    from .project import open_project

    project = _remember(args, open_project(args.config, args.store))
    result = project.clean(everything=args.all)
    if args.json:
        _print_json(result)
    else:
        print(f"removed {result['entries']} entries and {result['blobs']} blobs "
              f"({_size(result['bytes'])}) from {project.store.root}")
    return EXIT_OK


def cmd_keys(args) -> int:
    from .keying.encode import digest_of

    _, the_plan = _planned(args)
    rows = [{"target": t.name, "signature": t.signature, "arch": t.arch,
             "key": the_plan.keys[t].digest} for t in the_plan.targets]
    combined = digest_of(tuple(sorted(r["key"] for r in rows)))
    if args.json:
        _print_json({"targets": rows, "digest": combined})
    else:
        for r in rows:
            print(f"{r['key']}  {r['target']} {r['signature']} {r['arch']}")
        print(f"digest {combined}")
    return EXIT_OK


def cmd_export(args) -> int:
    from .store.archive import export_archive
    from .store.signing import signing_key

    project, the_plan = _planned(args)
    result = export_archive(project.store, [the_plan.keys[t].digest for t in the_plan.targets],
                            args.file, key=signing_key(project.config))
    if args.json:
        _print_json(result)
    else:
        print(f"exported {result['entries']} entries and {result['blobs']} blobs "
              f"({_size(result['bytes'])}) to {result['file']}")
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
    """One self-rewriting line on stderr, shown only on a terminal."""

    def __call__(self, row, done, total):
        width = 30
        filled = width * done // max(total, 1)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
                         f"{row.target[-40:]:40}")
        sys.stderr.flush()

    def close(self):
        sys.stderr.write("\r" + " " * 100 + "\r")
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
