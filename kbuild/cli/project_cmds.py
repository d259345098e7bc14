"""The commands that work on a project's targets: build, watch, init, status, explain,
clean, keys, graph, show and bundle. Each parses nothing itself (the table in
`commands` did), calls the project API, prints, and returns an exit code.
"""

from __future__ import annotations

import os
import sys
import time

from ..errors import KbuildError
from ..model import RowStatus, TargetState
from .common import (EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, UsageError, error, flush_warnings,
                     max_size_of, planned, print_json, remember, size, warnings)
from .report import BuildReport, error_location


# -- build and watch ----------------------------------------------------------------------------

def cmd_build(args) -> int:
    from ..direct import Direct
    from ..targets import parse_archs

    config = _light_config(args)
    parse_archs(args.arch, check_toolchain=False)  # misspelt: said before anything else
    max_size = max_size_of(args, config)
    store = _storage(args, config, read_only=args.read_only, remote=True)
    executor = _executor(args, config, store)
    if not args.read_only:
        store.check_root()  # before keying imports numba and the project
        store.claim()  # a folder that is not kbuild's is refused before anything runs
    start = time.perf_counter()
    args.verify = _verify_setting(args)
    # Verifying rebuilds what the store serves: every target keyed, none answered blind.
    direct = Direct(config, store, enabled=not args.full and args.verify is None,
                    may_write=not args.read_only)
    rows = direct.answer(args.targets, args.arch, "fresh", hold=lambda: _shared(store))
    if rows is not None and getattr(args, "retry_failed", False) and \
            any(r.failed is not None for r in rows):
        rows = direct.fall_back("--retry-failed: a recorded failure compiles again")
    if rows is not None:
        return _direct_build(args, direct, config, store, rows, max_size, start)
    direct.begin_full()
    return _full_build(args, direct, store, executor, max_size, start)


def _light_project(args, read_only: bool):
    """The project file and the local store a command names (see `_light_config`)."""
    config = _light_config(args)
    return config, _storage(args, config, read_only)


def _light_config(args):
    """The project file, its architectures checked by their spelling only (direct mode
    imports no toolchain)."""
    from ..config import load_config

    return load_config(args.config, check_toolchain=False)


def _storage(args, config, read_only: bool, remote: bool = False):
    """The storage a command names: with the remote a build uses (CLI > env > kbuild.toml)
    when `remote`, else the local store alone."""
    from ..config import default_store
    from ..store.remote import remote_settings
    from ..store.storage import open_storage

    settings = remote_settings(config, url=args.remote, no_remote=args.no_remote,
                               read_only=args.remote_read_only,
                               timeout=args.remote_timeout) if remote else None
    store = open_storage(default_store(config, args.store), read_only=read_only,
                         remote=settings)
    args._store = store
    return store


def _shared(store):
    """The store held shared (gc and clean wait) while a no-op checks its entries."""
    import contextlib

    if store.read_only or not store.exists():
        return contextlib.nullcontext()
    return store.shared()


def _direct_build(args, direct, config, store, rows, max_size, start) -> int:
    """A no-op build answered from the journal: every target cached, as a full run says."""
    from ..build.row import Row
    from ..store.maintenance import record_build

    selection = _Selection(config, [r.target for r in rows])
    report = BuildReport(args, selection, store)
    report.mode = direct.describe()
    done = []
    for row in rows:
        if row.failed is not None:  # a failure recorded under its key, reported at once
            done.append(Row.of(row.target, row.key, RowStatus.FAILED, error=row.failed,
                               recorded=True, where=row.where))
        else:
            done.append(Row.of(row.target, row.key, RowStatus.CACHED, artifacts=row.artifacts))
        report(done[-1], len(done), len(rows))
    record_build(store, {s.value: sum(r.status == s for r in done) for s in RowStatus},
                 project=config.name)
    return report.finish(done, time.perf_counter() - start)  # nothing added: no eviction


class _Selection:
    """What a report needs of a plan, for rows the journal answered (no module failed
    to import; a failed compile is a row of its own)."""

    def __init__(self, config, targets):
        self.config, self.targets = config, targets
        self.failed, self.kernels = {}, {}

    @property
    def total(self) -> int:
        return len(self.targets)


def _full_build(args, direct, store, executor, max_size, start) -> int:
    """Every target keyed from its sources, built if out of date; the journal written."""
    from ..build import default_jobs, parse_archs
    from ..config import load_config
    from ..project import Project

    project = remember(args, Project(load_config(args.config), direct.attach(store)))
    archs = parse_archs(args.arch)
    the_plan = project.plan(args.targets, archs)
    report = BuildReport(args, the_plan, project.store)
    report.mode = direct.describe()
    verifying = getattr(args, "verify", None) is not None
    if verifying:
        report.stream = False  # rows are final only once checked: printed at the end
    jobs = args.jobs or default_jobs()
    try:
        rows = project.build(args.targets, archs, keep_going=args.keep_going, progress=report,
                             executor=executor, **_settings(args, jobs))
        if verifying and not args.read_only:
            rows = project.verify(rows, args.targets, archs, sample=args.verify, jobs=jobs,
                                  target_timeout=args.target_timeout)
    except KeyboardInterrupt:
        # Finished rows are committed; what was compiling is dropped, its locks released.
        return report.finish(report.rows, time.perf_counter() - start, interrupted=True)
    _evict(project.store, max_size, the_plan, rows)
    _journal_build(direct, project, the_plan, rows)
    report.mode = direct.describe()
    return report.finish(rows, time.perf_counter() - start)


def _verify_setting(args):
    """The share of served targets `--verify` checks ("" for all), None for no check:
    the option, else $KBUILD_VERIFY (`1`: all; `10%`: a share; `0` or empty: none)."""
    text = args.verify
    if text is None:
        env = os.environ.get("KBUILD_VERIFY", "").strip()
        if env.lower() in ("", "0", "false", "no", "off"):
            return None  # before importing the build: a no-op imports no numba
        text = "" if env.lower() in ("1", "true", "yes", "on") else env
    from ..build import parse_sample

    try:
        return parse_sample(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_verify(args) -> int:
    """Rebuild what the store holds for the current targets and compare the bytes."""
    from ..build import default_jobs, launchable, parse_archs, parse_sample
    from ..build.row import Row
    from ..config import load_config
    from ..project import Project

    config, store = _light_project(args, read_only=False)
    try:
        sample = parse_sample(args.sample)
    except ValueError as exc:
        raise UsageError(str(exc).replace("--verify=", "--sample ")) from None
    start = time.perf_counter()
    project = remember(args, Project(load_config(args.config), store))
    archs = parse_archs(args.arch)
    the_plan = project.plan(args.targets, archs)
    report = BuildReport(args, the_plan, store)
    report.stream = False
    rows = []
    for target in the_plan.targets:
        held = project.fresh_entry(the_plan, target)
        key = the_plan.keys[target].digest
        rows.append(Row.of(target, key, RowStatus.CACHED, artifacts=launchable(held))
                    if held is not None else
                    Row.of(target, key, RowStatus.SKIPPED, error="not in the store: nothing "
                           "to verify (kbuild build builds it)"))
    rows += [Row.of(t, None, RowStatus.FAILED, error=str(e)) for t, e in the_plan.failed.items()]
    rows = project.verify(rows, args.targets, archs, sample=sample,
                          jobs=args.jobs or default_jobs())
    return report.finish(rows, time.perf_counter() - start)


def _journal_build(direct, project, the_plan, rows) -> None:
    """The journal of this build: every target's entry, looked up again where it was
    just built (so it is checked as a later lookup would check it)."""
    from ..build.entries import expected
    from ..build.failures import recorded_error
    from ..store import failures

    if the_plan.failed or len(rows) != len(the_plan.targets):
        direct.journal_note = "not written: a target's module failed to import"
        return
    if any(row.verified == "differs" for row in rows):
        # Entries replaced after their look-ups: the next run keys in full and sees them.
        direct.journal_note = "not written: --verify replaced entries"
        return
    done = []
    for target, row in zip(the_plan.targets, rows):
        if row.status == RowStatus.BUILT and project.fresh_entry(the_plan, target) is None:
            direct.journal_note = f"not written: {target.label} is not fresh after its build"
            return
        error = None
        if row.status == RowStatus.FAILED and row.key is not None:
            # Journaled when its failure is recorded under its key: a later build
            # reports that record (the journal checks it is still there, unchanged).
            failure = failures.recorded(project.store, row.key, expected(target))
            # A compile stopped at a time limit is tried again under a longer one, which
            # a command line can give: never answered from the journal.
            error = None if failure is None or failure.limit is not None \
                else recorded_error(failure.error)
        where = error_location(row.error, the_plan.kernels.get(row.target),
                               the_plan.config.root) if error is not None else None
        done.append((target, row.key, row.status.value, error, where))
    direct.journal_build(done)


def _evict(store, max_size, the_plan, rows) -> None:
    """After a build that added to the store: gc down to the size cap when over it,
    keeping the current targets (`maintenance.evict_after_build`)."""
    from ..store.maintenance import evict_after_build

    evict_after_build(store, max_size, [the_plan.keys[t].digest for t in the_plan.targets],
                      added=any(r.status == RowStatus.BUILT for r in rows))


def _settings(args, jobs: int) -> dict:
    """`Project.build`'s settings from the options build and watch share."""
    return {"jobs": jobs, "separate": not args.whole_program,
            "target_timeout": args.target_timeout, "retry_failed": args.retry_failed}


def cmd_watch(args) -> int:
    """Build, then wait for a saved file and build again, in one process, until Ctrl-C.
    A round that fails (a config error, a module that does not import) is reported and
    the watch goes on; every round keeps going past failed targets."""
    from ..build import default_jobs, parse_archs
    from ..discover import forget_project_modules

    archs = parse_archs(args.arch)
    jobs = args.jobs or default_jobs()
    rounds = 0
    try:
        while True:
            roots, extra = _watch_round(args, archs, jobs)
            rounds += 1
            if args.rounds is not None and rounds >= args.rounds:
                return EXIT_OK
            _wait_for_a_save(roots, extra)
            forget_project_modules()
    except KeyboardInterrupt:
        # Ctrl-C is how a watch is meant to end (the build in progress, if any, with it).
        print("\nkbuild watch: stopped", flush=True)
        return EXIT_OK


def _wait_for_a_save(roots, extra) -> None:
    """Wait until a file under `roots`, or one of `extra`, changes; say which."""
    from ..backend.backends import loaded
    from ..watch import snapshot, wait_for_change

    def prepare():
        for backend in loaded():  # numba-cuda's, and numba-cuda-mlir's when its kernels are used
            backend.prepare()

    seen = snapshot(roots, extra)
    print(f"watching {len(seen)} files; Ctrl-C to stop", flush=True)
    _, what = wait_for_change(roots, extra, seen, idle=[prepare])
    print(f"changed: {', '.join(os.path.relpath(p) for p in what[:5])}"
          + (f" and {len(what) - 5} more" if len(what) > 5 else ""), flush=True)


def _watch_round(args, archs, jobs):
    """One build; (the folders and files to watch for the next one)."""
    try:
        roots, extra = _watched_build(args, archs, jobs)
    except KbuildError as exc:
        error(str(exc))
        roots, extra = _config_folder(args)
    flush_warnings(args)
    if getattr(args, "_store", None) is not None:
        args._store.warnings.clear()
    sys.stdout.flush()
    return roots, extra


def _watched_build(args, archs, jobs):
    """A watch round's build; (the project's folders, [its kbuild.toml])."""
    from ..project import open_project

    start = time.perf_counter()
    project = remember(args, open_project(args.config, args.store))
    project.store.warnings.clear()
    the_plan = project.plan(args.targets, archs)
    report = BuildReport(args, the_plan, project.store)
    rows = project.build(args.targets, archs, keep_going=True, progress=report,
                         **_settings(args, jobs))
    report.finish(rows, time.perf_counter() - start)
    return project.config.paths, [project.config.path]


def _config_folder(args):
    """What a round that could not build watches: the kbuild.toml's folder, and the file."""
    from ..config import find_config

    config = args.config or _nearest_config(find_config)
    return [os.path.dirname(os.path.abspath(config)) if config else os.getcwd()], \
        [config] if config else []


def _nearest_config(find_config):
    try:
        return str(find_config())
    except KbuildError:
        return None


def _executor(args, config, store):
    """The executor of a build (None: local)."""
    if args.executor in (None, "", "local"):
        return None
    from ..execute.distributed import parse_executor
    from ..store.remote import remote_timeout

    return parse_executor(args.executor, warnings=store.warnings,
                          timeout=remote_timeout(config, args.remote_timeout))


# -- init -------------------------------------------------------------------------------------

def cmd_init(args) -> int:
    from pathlib import Path

    from ..build import parse_archs
    from ..scaffold import write_config

    result = write_config(Path.cwd(), args.folders, parse_archs(args.arch), force=args.force)
    if args.json:
        print_json(result)
        return EXIT_OK
    print(f"wrote {result['file']}: {len(result['kernels'])} kernels with their signatures"
          + (f", {len(result['lazy'])} lazy ones commented out (declare the signatures they "
             "are launched with)" if result["lazy"] else ""))
    for name in result["lazy"]:
        print(f"  lazy: {name}")
    print(f"next: {result['next']}")
    return EXIT_OK


# -- status and explain -------------------------------------------------------------------------

def cmd_status(args) -> int:
    from ..direct import Direct

    config, store = _light_project(args, read_only=True)
    direct = Direct(config, store, enabled=not args.full)
    found = direct.answer(args.targets, args.arch, "status")
    if found is None:
        direct.begin_full()  # before anything imports numba
    rows = _full_status(args, direct, store) if found is None else [
        _direct_status_row(r) for r in found]
    mode = direct.describe()
    if args.json:
        counts = {s.value: sum(r["status"] == s for r in rows) for s in TargetState}
        print_json({"targets": rows, "summary": counts, "mode": mode})
    else:
        for r in rows:
            # One line per target: a compile error's first line (`explain` shows it all).
            firsts = [reason.splitlines()[0] if reason else reason for reason in r["reasons"]]
            why = f"  ({'; '.join(firsts)})" if firsts else ""
            print(f"{r['status']:10} {r['target']} {r['signature']} {r['arch']}{why}")
        if args.check:
            print(f"mode: {mode['used']} ({mode['reason']})")
    wanted = (TargetState.UP_TO_DATE,) if args.check else \
        (TargetState.UP_TO_DATE, TargetState.STALE, TargetState.MISSING)
    return EXIT_OK if all(r["status"] in wanted for r in rows) else EXIT_FAILED


def _direct_status_row(found) -> dict:
    """An up-to-date target's status row, as `Project.status` makes it, from the journal."""
    from ..targets import status_head

    return dict(status_head(found.target, found.key), status=TargetState.UP_TO_DATE,
                reasons=[], built_at=found.built_at, newest=found.newest)


def _full_status(args, direct, store) -> list[dict]:
    """Every target keyed from its sources and compared with the store; the journal
    written."""
    from ..build import parse_archs
    from ..config import load_config
    from ..direct import entry_dirs
    from ..project import Project

    project = remember(args, Project(load_config(args.config), direct.attach(store)))
    archs = parse_archs(args.arch)
    dirs = entry_dirs(store)  # before status reads the history they hold
    rows = project.status(args.targets, archs)
    direct.journal_status(rows, dirs)
    return rows


def cmd_explain(args) -> int:
    from ..build import parse_archs
    from ..project import open_project

    project = remember(args, open_project(args.config, args.store, read_only=True))
    archs = parse_archs(args.arch)
    rows = project.status([args.target], archs, diffs=True)
    code = EXIT_FAILED if any(r["status"] == TargetState.FAILED for r in rows) else EXIT_OK
    if args.json:
        print_json({"targets": rows})
        return code
    for r in rows:
        print(f"{r['target']} {r['signature']} {r['arch']}: {r['status']}")
        for line in _explanation(r):
            print(f"  {line}")
    return code


def _explanation(row) -> list[str]:
    """What `kbuild explain` says of one status row, below its heading."""
    if row["status"] == TargetState.UP_TO_DATE:
        return _cached_explanation(row)
    lines = []
    if row["status"] == TargetState.STALE and row.get("previous_is_newest") is False:
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


# -- clean and keys -----------------------------------------------------------------------------

def cmd_clean(args) -> int:
    from ..project import open_project
    from ..store.maintenance import clean_store
    from .common import project_or_store

    project, store = project_or_store(args, open_project, needs_project=not args.all)
    store.claim()  # a folder that is not kbuild's is refused, not cleaned
    if not store.exists():
        if not args.json:
            print(f"nothing to clean: store {store.root} does not exist yet")
            return EXIT_OK
        result = dict.fromkeys(("entries", "objects", "blobs", "bytes", "failures"), 0)
    else:
        result = project.clean(everything=args.all) if project else clean_store(store)
    if args.json:
        print_json(result)
    else:
        n = result.get("failures", 0)
        records = f", {n} failure record{'s' if n != 1 else ''}" if n else ""
        print(f"removed {result['entries']} entries and {result['blobs']} blobs "
              f"({size(result['bytes'])}){records} from {store.root}")
    return EXIT_OK


def cmd_keys(args) -> int:
    from ..direct import Direct
    from ..keying.encode import digest_of

    config, store = _light_project(args, read_only=True)
    found = Direct(config, store, enabled=not args.full, may_write=False).answer(
        args.targets, args.arch, "keys")
    if found is not None:
        rows = [{"target": r.target.name, "signature": r.target.signature,
                 "arch": r.target.arch, "key": r.key} for r in found]
        failed = []
    else:
        rows, failed = _planned_keys(args)
    # A digest missing some targets' keys would name a cache that is not the project's.
    combined = None if failed else digest_of(tuple(sorted(r["key"] for r in rows)))
    if args.json:
        print_json({"targets": rows + failed, "digest": combined})
    else:
        _print_keys(rows, failed, combined)
    return EXIT_FAILED if failed else EXIT_OK


def _planned_keys(args):
    _, the_plan = planned(args)
    rows = [{"target": t.name, "signature": t.signature, "arch": t.arch,
             "key": the_plan.keys[t].digest} for t in the_plan.targets]
    failed = [{"target": t.name, "signature": t.signature, "arch": t.arch, "key": None,
               "error": str(exc)}
              for t, exc in the_plan.failed.items()]
    return rows, failed


def _print_keys(rows, failed, combined) -> None:
    for r in rows:
        print(f"{r['key']}  {r['target']} {r['signature']} {r['arch']}")
    for r in failed:
        print(f"{RowStatus.FAILED:32}  {r['target']} {r['signature']} {r['arch']}: "
              f"{r['error']}")
    print(f"digest {combined or '(none: a target failed)'}")


# -- graph, show and bundle ---------------------------------------------------------------------

def cmd_graph(args) -> int:
    from .. import graph as graphs

    project, the_plan = planned(args)
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
    project, the_plan = planned(args)
    for exc in the_plan.failed.values():
        raise exc
    rows, missing = [], []
    for target in (t for t in the_plan.targets if _is_named(the_plan, t, args.target)):
        manifest = project.store.lookup(the_plan.keys[target].digest)
        if manifest is None:
            missing.append(target.label)
            continue
        rows.append(_shown(project.store, the_plan, target, manifest, args.show))
    for label in missing:
        project.store.warnings.append(f"{label} is not built (or stale): run kbuild build "
                                      f"{args.target} first")
    if args.json:
        print_json({"targets": rows, "warnings": warnings(args)})
    else:
        for row in rows:
            _print_shown(row, args.show, several=len(rows) > 1)
    return EXIT_FAILED if missing else EXIT_OK


def _shown(store, the_plan, target, manifest, what: str) -> dict:
    """`show`'s row of one built target: its resources, its PTX or its SASS."""
    from ..backend.cubin import disassemble, resources

    cubin = store.read_blob(manifest["artifacts"]["cubin"])
    row = {"target": target.name, "signature": target.signature, "arch": target.arch,
           "key": the_plan.keys[target].digest, "entry": manifest.get("entry")}
    if what == "resources":
        row["functions"] = resources(cubin)
        row["resources"] = row["functions"].get(row["entry"], {})
    elif what == "ptx":
        row["ptx"] = store.read_blob(manifest["artifacts"]["ptx"]).decode()
    else:
        try:
            row["sass"] = disassemble(cubin)
        except RuntimeError as exc:
            raise KbuildError(f"show --sass: {exc}") from None
    return row


def _is_named(the_plan, target, name: str) -> bool:
    from ..build import select_specs

    return target.name == select_specs(the_plan.config, [name])[0].name


def _print_shown(row, what: str, several: bool) -> None:
    label = f"{row['target']} {row['signature']} {row['arch']}"
    if what == "resources":
        r = row["resources"]
        # Registers and local memory are each thread's; static shared memory the block's.
        print(f"{label}: {r.get('registers', '?')} registers and "
              f"{size(r.get('local_bytes', 0))} local per thread, "
              f"{size(r.get('shared_bytes', 0))} shared per block")
        return
    if several:
        print(f"// kbuild: {label}")
    sys.stdout.write(row[what])
    if not row[what].endswith("\n"):
        sys.stdout.write("\n")


def cmd_bundle(args) -> int:
    from ..build import parse_archs
    from ..bundle import write_bundle
    from ..project import open_project

    project = open_project(args.config, args.store, read_only=True)
    report = write_bundle(project, args.dir, parse_archs(args.arch))
    if args.json:
        print_json(report)
    else:
        print(f"bundled {report['targets']} targets ({', '.join(report['archs'])}) as "
              f"{report['blobs']} blobs ({size(report['bytes'])}) into {report['dir']}")
    return EXIT_OK


# -- run: a program with zero-config caching ------------------------------------------------

def cmd_run(args) -> int:
    from ..zeroconf.run import handle

    return handle(args)
