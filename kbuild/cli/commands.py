"""Every command in one table, as ninja keeps its tools in `kTools[]`: its name, the
function that runs it, its help line and its options. The argument parser is built
from the table; a new command is a row here and a `cmd_*` function in `build_cmds`
(it builds), `project_cmds` (it works on a project's targets) or `store_cmds` (on the
store).

A row names its function as text ('build_cmds.cmd_build'), imported when the command
runs, as pip's command table does: `kbuild --help` loads no command's module.
Options are data too (`Opt` takes what `add_argument` takes); the sets several
commands share (targets and --arch, the remote cache, failure handling) are named.
"""

from __future__ import annotations

import argparse

from .common import UsageError


class Opt:
    """One argument: `add_argument(*flags, **settings)`."""

    __slots__ = ("flags", "settings")

    def __init__(self, *flags, **settings):
        self.flags, self.settings = flags, settings

    def add_to(self, parser) -> None:
        parser.add_argument(*self.flags, **self.settings)


class Either:
    """Options of which a command line may give one (a mutually exclusive group)."""

    __slots__ = ("options",)

    def __init__(self, *options: Opt):
        self.options = options

    def add_to(self, parser) -> None:
        group = parser.add_mutually_exclusive_group()
        for option in self.options:
            option.add_to(group)


class Command:
    """A row of the table. `run`: 'module.function' of this package,
    (args, opened: common.Opened) -> exit code;
    `defaults`: set on the parsed arguments, options or not; `store_options`: it takes
    --config and --store."""

    __slots__ = ("name", "run", "help", "options", "defaults", "store_options")

    def __init__(self, name: str, run: str, help: str, options=(), defaults=None,
                 store_options: bool = True):
        self.name, self.run, self.help, self.options = name, run, help, options
        self.defaults, self.store_options = defaults or {}, store_options


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r} (like 600; 0 for "
                                         "no limit)")
    return value


def _loudness(quiet_help: str) -> Either:
    return Either(Opt("-q", "--quiet", action="store_true", help=quiet_help),
                  Opt("-v", "--verbose", action="store_true",
                      help="also print each target's key, and every error in full"))


JSON = Opt("--json", action="store_true")
JSON_ONE = Opt("--json", action="store_true", help="print one JSON object")
TARGETS_AND_ARCH = (
    Opt("targets", nargs="*", metavar="TARGET",
        help="module:attr.path or a unique short name (default: all)"),
    Opt("--arch", help="architectures to build, comma-separated (e.g. sm_80,sm_90)"))
ONE_TARGET = (Opt("target", help="module:attr.path or a unique short name"),
              Opt("--arch", help="only these architectures, comma-separated"))
JOBS = Opt("-j", "--jobs", type=int, default=None, metavar="N",
           help="compile N targets at once (default: the number of cores)")
FAILURES = (
    Opt("--target-timeout", type=_seconds, default=None, metavar="SECONDS",
        help="stop a target's compile after SECONDS: it fails alone, the rest "
             "build (default: [build] target_timeout, else none; 0: none)"),
    Opt("--retry-failed", action="store_true",
        help="compile targets whose failure was recorded for their current key "
             "(otherwise they fail at once)"))
FULL = Opt("--full", action="store_true",
           help="key every target from its sources, not from the journal of the last full "
                "keying (direct mode; see also [build] direct)")
REMOTE = (
    Opt("--remote", metavar="URL",
        help="shared cache behind the store: redis://HOST:PORT/DB, http://HOST:PORT/PREFIX, "
             "s3://BUCKET/PREFIX, file:///PATH, module:Class ... (default: $KBUILD_REMOTE, "
             "else [store] remote)"),
    Opt("--no-remote", action="store_true", help="use no remote cache"),
    Opt("--remote-read-only", action="store_true",
        help="read from the remote cache but never write to it (CI jobs)"),
    Opt("--remote-timeout", metavar="SECONDS",
        help="bound on every remote call (default: $KBUILD_REMOTE_TIMEOUT, "
             "[store] remote_timeout, else 5)"))

COMMANDS = (
    Command("build", "build_cmds.cmd_build", "build what is out of date", (
        *TARGETS_AND_ARCH, JSON_ONE,
        Opt("-k", "--keep-going", action="store_true",
            help="build the other targets when one fails"),
        JOBS,
        Opt("--read-only", action="store_true",
            help="only look up the store (a shared one): targets not in it fail"),
        Opt("--whole-program", action="store_true",
            help="compile each kernel with its device functions as one program "
                 "(default: device functions as separate objects, linked with LTO)"),
        Opt("--max-size", metavar="SIZE",
            help="after a build that added to the store, evict least-recently-used "
                 "entries down to SIZE ('none': no limit; default: $KBUILD_MAX_SIZE, "
                 "else [store] max_size, else 5GB)"),
        *REMOTE,
        Opt("--executor", metavar="local|dask://HOST:PORT", default=None,
            help="where to compile: local processes (default) or a Dask cluster"),
        *FAILURES, FULL,
        Opt("--verify", nargs="?", const="", default=None, metavar="SHARE",
            help="also rebuild what the store served, from source in a worker, and compare "
                 "the bytes: a target that differs fails and its entry is replaced "
                 "(--verify=10%%: a random share of them; default: $KBUILD_VERIFY)"),
        _loudness("print only failed targets (first line of the error) and the summary"))),
    Command("verify", "build_cmds.cmd_verify",
            "rebuild what the store holds for the current targets, from source, and compare "
            "(a mismatch fails, and its entry is replaced)", (
                *TARGETS_AND_ARCH, JSON, JOBS,
                Opt("--sample", metavar="SHARE", default=None,
                    help="check a random share of the targets (e.g. 10%%; default: all)"),
                _loudness("print only targets that differ and the summary")),
            defaults={"full": True, "keep_going": True, "read_only": False, "whole_program": False,
                      "target_timeout": None, "retry_failed": False}),
    Command("watch", "build_cmds.cmd_watch",
            "stay resident and rebuild when a project file is saved", (
                *TARGETS_AND_ARCH, JOBS,
                Opt("--whole-program", action="store_true",
                    help="compile each kernel with its device functions as one program"),
                *FAILURES,
                _loudness("print only failed targets and the summary of each build"),
                Opt("--rounds", type=int, default=None, metavar="N", help=argparse.SUPPRESS)),
            defaults={"json": False, "keep_going": True, "watching": True}),
    Command("init", "project_cmds.cmd_init",
            "write a kbuild.toml here from the @cuda.jit kernels found in the sources "
            "(eager signatures as declared)", (
                Opt("folders", nargs="*", metavar="PACKAGE",
                    help="folders or files to look in (default: everything here but tests, "
                         "docs, benchmarks and virtual environments)"),
                Opt("--arch", default="sm_80",
                    help="architectures to declare, comma-separated (default: sm_80)"),
                Opt("--force", action="store_true", help="overwrite an existing kbuild.toml"),
                JSON),
            store_options=False),
    Command("gc", "store_cmds.cmd_gc", "evict least-recently-used entries and orphan blobs", (
        Opt("--max-size", metavar="SIZE", help="e.g. 500MB, or 'none' (default: "
            "$KBUILD_MAX_SIZE, else [store] max_size, else 5GB); without a kbuild.toml, "
            "the store of --store, $KBUILD_STORE or ~/.cache/kbuild"),
        JSON)),
    Command("config", "config_cmd.cmd_config",
            "every effective setting and where it came from (command line, environment, "
            "kbuild.toml, default)", (JSON,)),
    Command("stats", "store_cmds.cmd_stats",
            "entries, blobs, bytes; hits, misses and hit rate of builds and zero-config "
            "processes, store-wide and per project", (
                JSON,
                Opt("--zero", action="store_true",
                    help="forget the counts so far (the store's contents stay)"))),
    Command("status", "project_cmds.cmd_status",
            "which targets are up-to-date, stale or missing, and why (no compile)", (
                *TARGETS_AND_ARCH, JSON, FULL,
                Opt("--check", action="store_true",
                    help="exit 1 when a target is stale or missing (pre-commit hooks, CI); "
                         "also say whether the journal answered (direct) or every target "
                         "was keyed (full)"))),
    Command("explain", "project_cmds.cmd_explain",
            "which key inputs of a target changed since it was last built",
            (*ONE_TARGET, JSON)),
    Command("clean", "project_cmds.cmd_clean",
            "remove this project's entries and blobs no other entry uses", (
                Opt("--all", action="store_true", help="empty the whole store"),
                JSON)),
    Command("keys", "project_cmds.cmd_keys",
            "the current target keys and one digest of them (a CI cache key)",
            (*TARGETS_AND_ARCH, JSON, FULL)),
    Command("export", "store_cmds.cmd_export",
            "write the current targets' entries and blobs to one archive", (
                Opt("file", help="archive to write (.tar, or .tar.gz / .tgz for gzip)"),
                *TARGETS_AND_ARCH, JSON)),
    Command("push", "remote_cmds.cmd_push",
            "send the current targets' entries and blobs to the remote cache (seeds a new "
            "one from a warm store)", (
                *TARGETS_AND_ARCH, JSON,
                Opt("--remote", metavar="URL",
                    help="the remote to push to (default: $KBUILD_REMOTE, else [store] remote)"),
                Opt("--remote-timeout", metavar="SECONDS",
                    help="bound on every remote call (default: as build)"))),
    Command("import", "store_cmds.cmd_import",
            "merge an archive into the store, verifying every blob and entry", (
                Opt("file", help="archive written by kbuild export"),
                JSON)),
    Command("graph", "project_cmds.cmd_graph",
            "the target graph: kernels, device functions, what is stale", (
                *TARGETS_AND_ARCH,
                Opt("--format", choices=("dot", "json", "png"), default="dot"),
                Opt("-o", "--output", metavar="FILE", help="write here instead of stdout"))),
    Command("show", "project_cmds.cmd_show",
            "a built target's PTX, SASS, or registers and memory per thread and block", (
                *ONE_TARGET,
                Either(
                    Opt("--resources", action="store_const", dest="show", const="resources",
                        help="registers, local (stack frame) and static shared memory "
                             "(default)"),
                    Opt("--ptx", action="store_const", dest="show", const="ptx",
                        help="the PTX"),
                    Opt("--sass", action="store_const", dest="show", const="sass",
                        help="the SASS, through nvdisasm (where installed)")),
                JSON),
            defaults={"show": "resources"}),
    Command("cat", "store_cmds.cmd_cat", "write a blob's bytes to stdout",
            (Opt("hash", help="the blob's xxh3-128 hash (32 hex digits)"),)),
    Command("run", "project_cmds.cmd_run",
            "run a command with every kernel it compiles cached (--record: write them into "
            "kbuild.toml)", (
                Opt("--record", action="store_true",
                    help="write the (kernel, signature) pairs the command launched into "
                         "kbuild.toml (created or merged), for `kbuild build` to build ahead "
                         "of time"),
                Opt("--on-miss", choices=("build", "error", "jit"),
                    help="a kernel the store lacks: build it (default), raise an error, or "
                         "let numba compile it uncached"),
                Opt("--arch", help="also build each kernel for these architectures, "
                                   "comma-separated (the device's always is)"),
                Opt("--remote", metavar="URL", help="a shared cache behind the store"),
                Opt("--no-remote", action="store_true", help="use no remote cache"),
                Opt("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                    help="the command to run (after --)"))),
    Command("bundle", "project_cmds.cmd_bundle",
            "write the built kernels into a package directory (e.g. mypkg/_kbuild)", (
                Opt("dir", help="the bundle directory, inside the package"),
                Opt("--arch", help="archs to bundle, comma-separated (default: the declared)"),
                JSON_ONE)),
)


class _Parser(argparse.ArgumentParser):
    """argparse, raising instead of exiting, so `--json` can still answer in JSON."""

    def error(self, message):
        raise UsageError(f"{message}; see '{self.prog} --help'")


def parser() -> argparse.ArgumentParser:
    """`kbuild`'s argument parser, a subcommand for every row of `COMMANDS`."""
    top = _Parser(prog="kbuild", parents=[_store_options(None)],
                  description="Content-addressed, make-like builds of numba-cuda kernels.")
    top.add_argument("--version", action="store_true",
                     help="print kbuild's version and the toolchain's, and exit")
    # A subcommand's own defaults would overwrite `kbuild --store DIR build`: suppress them.
    common = _store_options(argparse.SUPPRESS)
    sub = top.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        p = sub.add_parser(command.name, parents=[common] if command.store_options else [],
                           help=command.help)
        for option in command.options:
            option.add_to(p)
        p.set_defaults(run=command.run, **command.defaults)
    return top


def _store_options(default) -> argparse.ArgumentParser:
    """--config and --store, which `kbuild` and every command but init take."""
    common = _Parser(add_help=False)
    common.add_argument("--config", metavar="PATH", default=default,
                        help="project file (default: kbuild.toml here or in the nearest parent)")
    common.add_argument("--store", metavar="DIR", default=default,
                        help="store directory (default: the file's store, $KBUILD_STORE, "
                             "~/.cache/kbuild)")
    return common


def handler(run: str):
    """The function a row's `run` names ('build_cmds.cmd_build'), imported now (by name,
    so that the import graph shows it; both modules import their heavy parts lazily)."""
    from . import build_cmds, config_cmd, project_cmds, remote_cmds, store_cmds

    module, _, name = run.partition(".")
    modules = {"build_cmds": build_cmds, "config_cmd": config_cmd, "project_cmds": project_cmds,
               "remote_cmds": remote_cmds, "store_cmds": store_cmds}
    return getattr(modules[module], name)
