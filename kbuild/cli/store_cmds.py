"""The commands that work on the store itself: gc, stats, cat, export and import.
The store logic is in `kbuild.store` (maintenance, archive); these print it.
"""

from __future__ import annotations

import sys

from ..errors import KbuildError
from .common import (EXIT_FAILED, EXIT_OK, UsageError, error, max_size_of, planned, print_json,
                     remember, size, store_only, warnings)

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")  # what store/archive.py writes


def cmd_gc(args, opened) -> int:
    from ..project import open_project
    from ..store.maintenance import gc
    from .common import project_or_store

    project, store = project_or_store(args, opened, open_project, needs_project=False)
    max_size = max_size_of(args, project.config if project else None)
    keep = _current_keys(project) if project else []
    result = gc(store, max_size, keep)
    if project:
        result.update(_over_limit(project, max_size, keep, result))
    else:
        result.update(over_limit=max_size is not None and result["bytes"] > max_size,
                      pinned_entries=0, pinned_bytes=0)
    if args.json:
        result["warnings"] = warnings(opened)
        print_json(result)
    else:
        _print_gc(result)
    return EXIT_OK


def _current_keys(project) -> list[str]:
    """The keys gc keeps: the project's current targets' (none, with a warning, when the
    project does not import: its store still gets bounded)."""
    try:
        the_plan = project.plan()
    except KbuildError as exc:
        project.store.warnings.append(f"current keys unknown ({exc}); no entry is protected")
        return []
    return [the_plan.keys[t].digest for t in the_plan.targets]


def _over_limit(project, max_size, keep, result) -> dict:
    """Whether gc left the store over `max_size`, what it was not allowed to evict, and
    (when over) a warning that says so."""
    from ..store.maintenance import pinned

    if max_size is None or result["bytes"] <= max_size:
        return {"over_limit": False, "pinned_entries": 0, "pinned_bytes": 0}
    entries, pinned_bytes = pinned(project.store, keep)
    project.store.warnings.append(
        f"the store is still over {size(max_size)} ({size(result['bytes'])}): "
        f"{entries} entries ({size(pinned_bytes)}) are pinned, "
        f"the current targets of project '{project.config.name}' and the objects they "
        "link from; raise --max-size, or `kbuild clean` projects you no longer build")
    return {"over_limit": True, "max_size": max_size, "pinned_entries": entries,
            "pinned_bytes": pinned_bytes}


_EVICTED_SHOWN = 20  # evicted targets a human reads; --json has every one


def _print_gc(result: dict) -> None:
    print(f"evicted {result['evicted_entries']} entries, removed {result['removed_blobs']} "
          f"blobs, {result['removed_temp_files']} temp files and {result['removed_facts']} "
          f"facts files, freed "
          f"{size(result['freed_bytes'])}; the store now holds {result['blobs']} blobs "
          f"({size(result['bytes'])})")
    shown = result["evicted_targets"]
    for row in shown[:_EVICTED_SHOWN]:
        print(f"  evicted {row['target']} {row['signature']} {row['arch']}")
    if len(shown) > _EVICTED_SHOWN:
        print(f"  ... and {len(shown) - _EVICTED_SHOWN} more (--json lists them all)")


def cmd_stats(args, opened) -> int:
    from ..store.maintenance import stats, zero_stats

    if args.zero:
        zeroed = zero_stats(store_only(args, opened))
        if args.json:
            print_json({"store": str(opened.store.root), "zeroed": zeroed})
        else:
            print(f"statistics of store {opened.store.root} zeroed")
        return EXIT_OK
    result = stats(store_only(args, opened, read_only=True))
    if args.json:
        print_json(result)
    else:
        _print_stats(result)
    return EXIT_OK


def _print_stats(result: dict) -> None:
    print(f"store        {result['store']}")
    print(f"entries      {result['entries']}")
    print(f"objects      {result['objects']}")
    print(f"blobs        {result['blobs']} ({size(result['bytes'])})")
    print(f"runs         {_runs(result)}")
    print(f"hit rate     {_hit_rate(result)}")
    if result["projects"]:
        print("per project")
    for name, counts in result["projects"].items():
        rate = "-" if counts["hit_rate"] is None else f"{100 * counts['hit_rate']:.1f}%"
        print(f"  {name}: {rate} ({counts['hits']} hits, {counts['misses']} misses) over "
              f"{counts['runs']} runs, {counts['zeroconf_runs']} of them zero-config")
    if result["remote_hits"] or result["remote_misses"] or result["remote_bytes_pushed"]:
        print(f"remote       {result['remote_hits']} hits, {result['remote_misses']} misses, "
              f"{size(result['remote_bytes_fetched'])} fetched, "
              f"{size(result['remote_bytes_pushed'])} pushed"
              + (f", {result['remote_rejected']} rejected" if result["remote_rejected"] else "")
              + (f", {result['remote_errors']} unreachable" if result["remote_errors"] else ""))


def _runs(counts: dict) -> str:
    zeroconf = counts["zeroconf_runs"]
    return (f"{counts['runs'] - zeroconf} builds and {zeroconf} zero-config processes "
            "since the last --zero")


def _hit_rate(counts: dict) -> str:
    """'87.5% (35 hits, 5 misses: 4 built, 1 failed, 0 left to numba)'."""
    rate = "-" if counts["hit_rate"] is None else f"{100 * counts['hit_rate']:.1f}%"
    return (f"{rate} ({counts['hits']} hits, {counts['misses']} misses: {counts['builds']} "
            f"built, {counts['failures']} failed, {counts['fallbacks']} left to numba)")


def cmd_cat(args, opened) -> int:
    from ..store.local import CorruptBlob

    store = store_only(args, opened, read_only=True)
    try:
        data = store.read_blob(args.hash)
    except CorruptBlob as exc:
        error(f"{exc} in store {store.root}")
        return EXIT_FAILED
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    return EXIT_OK


def cmd_export(args, opened) -> int:
    from ..store.archive import export_archive
    from ..store.signing import signing_key

    if not args.file.endswith(ARCHIVE_SUFFIXES):
        raise UsageError(f"export: cannot write {args.file!r}: kbuild writes tar archives; "
                         f"name it {', '.join(ARCHIVE_SUFFIXES)}")
    project, the_plan = planned(args, opened)
    for exc in the_plan.failed.values():
        raise exc  # an archive missing targets would look complete to whoever imports it
    result = export_archive(project.store, [the_plan.keys[t].digest for t in the_plan.targets],
                            args.file, key=signing_key(project.config))
    if args.json:
        print_json(result)
    else:
        print(f"exported {result['entries']} entries and {result['blobs']} blobs "
              f"({size(result['bytes'])}) to {result['file']}")
    return EXIT_OK


def cmd_import(args, opened) -> int:
    from ..store.archive import import_archive
    from ..store.signing import signing_key

    store = store_only(args, opened)
    result = import_archive(store, args.file, key=signing_key(opened.config))
    if args.json:
        print_json(result)
    else:
        print(f"imported {result['new_entries']} new entries ({result['entries']} in the archive) "
              f"and {result['new_blobs']} new blobs into {store.root}")
    return EXIT_OK
