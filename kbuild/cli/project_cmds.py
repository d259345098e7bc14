"""The commands that work on a project's targets: init, status, explain, clean, keys,
graph, show, bundle and run (build, verify and watch are `build_cmds`). Each parses
nothing itself (the table in `commands` did), calls the project API, prints, and returns
an exit code.
"""

from __future__ import annotations

import sys

from ..errors import KbuildError
from ..model import RowStatus, TargetState
from .common import (EXIT_FAILED, EXIT_OK, light_project, planned, print_json, remember, size,
                     warnings)


# -- init -------------------------------------------------------------------------------------

def cmd_init(args, opened) -> int:
    from pathlib import Path

    from ..builder import parse_archs
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

def cmd_status(args, opened) -> int:
    from ..direct import Direct

    config, store = light_project(args, opened, read_only=True)
    direct = Direct(config, store, enabled=not args.full)
    found = direct.answer(args.targets, args.arch, "status")
    if found is None:
        direct.begin_full()  # before anything imports numba
    rows = _full_status(args, opened, direct, store) if found is None else [
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


def _full_status(args, opened, direct, store) -> list[dict]:
    """Every target keyed from its sources and compared with the store; the journal
    written."""
    from ..builder import parse_archs
    from ..config import load_config
    from ..direct import entry_dirs
    from ..project import Project

    project = remember(opened, Project(load_config(args.config), direct.attach(store)))
    archs = parse_archs(args.arch)
    dirs = entry_dirs(store)  # before status reads the history they hold
    rows = project.status(args.targets, archs)
    direct.journal_status(rows, dirs)
    return rows


def cmd_explain(args, opened) -> int:
    from ..builder import parse_archs
    from ..project import open_project

    project = remember(opened, open_project(args.config, args.store, read_only=True))
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

def cmd_clean(args, opened) -> int:
    from ..project import open_project
    from ..store.maintenance import clean_store
    from .common import project_or_store

    project, store = project_or_store(args, opened, open_project, needs_project=not args.all)
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


def cmd_keys(args, opened) -> int:
    from ..direct import Direct
    from ..keying.encode import digest_of

    config, store = light_project(args, opened, read_only=True)
    found = Direct(config, store, enabled=not args.full, may_write=False).answer(
        args.targets, args.arch, "keys")
    if found is not None:
        rows = [{"target": r.target.name, "signature": r.target.signature,
                 "arch": r.target.arch, "key": r.key} for r in found]
        failed = []
    else:
        rows, failed = _planned_keys(args, opened)
    # A digest missing some targets' keys would name a cache that is not the project's.
    combined = None if failed else digest_of(tuple(sorted(r["key"] for r in rows)))
    if args.json:
        print_json({"targets": rows + failed, "digest": combined})
    else:
        _print_keys(rows, failed, combined)
    return EXIT_FAILED if failed else EXIT_OK


def _planned_keys(args, opened):
    _, the_plan = planned(args, opened)
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

def cmd_graph(args, opened) -> int:
    from .. import graph as graphs

    project, the_plan = planned(args, opened)
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


def cmd_show(args, opened) -> int:
    project, the_plan = planned(args, opened)
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
        print_json({"targets": rows, "warnings": warnings(opened)})
    else:
        for row in rows:
            _print_shown(row, args.show, several=len(rows) > 1)
    return EXIT_FAILED if missing else EXIT_OK


def _shown(store, the_plan, target, manifest, what: str) -> dict:
    """`show`'s row of one built target: its resources, its PTX or its SASS."""
    from ..backend import disassemble, resources

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
    from ..builder import select_specs

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


def cmd_bundle(args, opened) -> int:
    from ..builder import parse_archs
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

def cmd_run(args, opened) -> int:
    from ..zeroconf.run import handle

    return handle(args)
