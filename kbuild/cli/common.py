"""What every command shares: exit codes, the usage error, printing, and opening the
project or the store a command line names.

Commands import the layers below lazily, inside the function that needs them, so
that `kbuild --help` and a no-op build start without numba or the store.
"""

from __future__ import annotations

import json
import sys

from ..errors import KbuildError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


class UsageError(KbuildError):
    """The command line itself is wrong (argparse's complaint)."""


def interrupted(exc: BaseException) -> bool:
    """Whether `exc` is Ctrl-C as Python hands it on: a KeyboardInterrupt, or one raised
    inside code Python ran on the way and wrapped in another error whose cause or context
    it is (Python 3.11 wraps one raised in a class's `__set_name__`, so a Ctrl-C while a
    module defines a dataclass arrives as a RuntimeError)."""
    for _ in range(32):  # a chain is short; a cycle in one must not loop
        if exc is None:
            return False
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


def error(message: str) -> None:
    print(f"kbuild: error: {message}", file=sys.stderr)


def size(n: int) -> str:
    """Bytes for a person: '512 B', '1.5 KiB', ... up to GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


class Opened:
    """What a command opened, handed to it by the entry point with its parsed options: the
    store whose warnings are printed when the command ends (however it ends), and the
    project file read for it (None: none)."""

    def __init__(self):
        self.store = None
        self.config = None


def warnings(opened: Opened) -> list[str]:
    """The warnings of the store the command opened, each once, in the order given."""
    return store_warnings(opened.store)


def store_warnings(store) -> list[str]:
    """`store`'s warnings (none when it is None), each once, in the order given."""
    return list(dict.fromkeys(store.warnings)) if store is not None else []


def flush_warnings(opened: Opened) -> None:
    for message in warnings(opened):
        print(f"kbuild: warning: {message}", file=sys.stderr)


def remember(opened: Opened, project):
    """Note the project's store as the one the command opened (its warnings are printed
    at the command's end); the project."""
    opened.store = project.store
    return project


def store_only(args, opened: Opened, read_only: bool = False):
    """The store a command names, for commands that need no project (cat, import, stats).

    A kbuild.toml is read only for its `store` setting; a broken or missing one is
    no obstacle when --store says where the store is.
    """
    from ..config import default_store, load_config
    from ..errors import ConfigError
    from ..store.storage import open_storage

    try:
        cfg = load_config(args.config) if args.config or not args.store else None
    except ConfigError:
        cfg = None
    opened.config = cfg
    opened.store = open_storage(default_store(cfg, args.store), read_only=read_only)
    return opened.store


def project_or_store(args, opened: Opened, open_project, needs_project: bool = True):
    """(project, its store) for gc and clean; (None, the store) when no project file is
    found and none is named, and the command can do without one (`gc`, `clean --all` on
    the store of --store, $KBUILD_STORE or the per-user cache: a zero-config user's)."""
    from ..config import find_config
    from ..errors import ConfigError

    if args.config or needs_project:
        project = remember(opened, open_project(args.config, args.store))
        return project, project.store
    try:
        find_config()
    except ConfigError:
        return None, store_only(args, opened)
    project = remember(opened, open_project(args.config, args.store))
    return project, project.store


def planned(args, opened: Opened, read_only: bool = True, remote: dict | None = None):
    """(project, plan of the command's targets and --arch) for commands that key targets;
    `remote`: the options that choose its remote (`project.open_project`), None for none."""
    from ..builder import parse_archs
    from ..project import open_project

    project = remember(opened, open_project(args.config, args.store, read_only=read_only,
                                          remote=remote))
    return project, project.plan(getattr(args, "targets", None), parse_archs(args.arch))


def light_project(args, opened: Opened, read_only: bool):
    """The project file and the local store a command names (see `light_config`)."""
    config = light_config(args)
    return config, command_store(args, opened, config, read_only)


def light_config(args):
    """The project file, its architectures checked by their spelling only (direct mode
    imports no toolchain)."""
    from ..config import load_config

    return load_config(args.config, check_toolchain=False)


def command_store(args, opened: Opened, config, read_only: bool, remote: bool = False):
    """The storage a command names: with the remote a build uses (CLI > env > kbuild.toml)
    when `remote`, else the local store alone."""
    from ..config import default_store
    from ..store.remote_settings import remote_settings
    from ..store.storage import open_storage

    settings = remote_settings(config, url=args.remote, no_remote=args.no_remote,
                               read_only=args.remote_read_only,
                               timeout=args.remote_timeout) if remote else None
    store = open_storage(default_store(config, args.store), read_only=read_only,
                         remote=settings)
    opened.store = store
    return store


def max_size_of(args, config):
    """The store's size cap for build and gc (None: no limit): --max-size, else
    $KBUILD_MAX_SIZE, else the project's [store] max_size, else the default (5 GB)."""
    from ..store.maintenance import max_size_setting

    return max_size_setting(getattr(args, "max_size", None), config)[0]
