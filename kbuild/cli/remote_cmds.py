"""`kbuild push`: seed a remote cache from what the store holds for the current targets."""

from __future__ import annotations

from .common import EXIT_FAILED, EXIT_OK, UsageError, planned, print_json, size, warnings


def cmd_push(args, opened) -> int:
    """Send the current targets' entries (and the objects they link from) to the remote;
    exit 1 when the remote failed (a target the store lacks is reported, not an error:
    a partial build still seeds what it built)."""
    from ..store.storage import push_entries

    # One push may send thousands of entries: each call keeps its timeout, but no
    # build-sized budget stops it halfway (the first failure does).
    project, the_plan = planned(args, opened, remote={
        "url": args.remote, "timeout": args.remote_timeout, "budget": float("inf")})
    storage = project.store
    if storage.remote is None:
        raise UsageError("push: no remote cache to push to; name one with --remote URL, "
                         "$KBUILD_REMOTE or [store] remote in kbuild.toml")
    if storage.remote.read_only:
        raise UsageError("push: KBUILD_REMOTE_READ_ONLY=1 forbids writing to the remote; "
                         "unset it to push")
    result = push_entries(storage, [the_plan.keys[t].digest for t in the_plan.targets])
    labels = {the_plan.keys[t].digest: t.label for t in the_plan.targets}
    result = {"remote": storage.remote.name,
              **{k: v for k, v in result.items() if k != "missing_keys"},
              "missing_targets": sorted(labels.get(k, k) for k in result["missing_keys"])}
    if args.json:
        print_json(dict(result, warnings=warnings(opened)))
    else:
        print(f"pushed {result['entries']} entries and {result['objects']} objects "
              f"({size(result['bytes'])}) to {result['remote']}")
        if result["missing"]:
            print(f"{result['missing']} targets are not in the store (run `kbuild build` "
                  f"first): {', '.join(result['missing_targets'][:5])}")
    return EXIT_FAILED if result["down"] else EXIT_OK
