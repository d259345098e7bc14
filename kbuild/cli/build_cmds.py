"""The commands that build: build, verify and watch. Each turns its options into values,
opens the project and the store, and hands the sequence to `buildflow`.
"""

from __future__ import annotations

import os
import sys
import time

from ..errors import KbuildError
from ..model import RowStatus
from .buildflow import build_settings, direct_build, full_build, held_shared
from .common import (EXIT_OK, UsageError, command_store, error, flush_warnings, light_config,
                     light_project, max_size_of, remember)
from .report import BuildReport


def cmd_build(args, opened) -> int:
    from ..direct import Direct
    from ..targets import parse_archs

    config = light_config(args)
    parse_archs(args.arch, check_toolchain=False)  # misspelt: said before anything else
    max_size = max_size_of(args, config)
    store = command_store(args, opened, config, read_only=args.read_only, remote=True)
    executor = _executor(args, config, store)
    if not args.read_only:
        store.check_root()  # before keying imports numba and the project
        store.claim()  # a folder that is not kbuild's is refused before anything runs
    start = time.perf_counter()
    args.verify = _verify_setting(args)
    # Verifying rebuilds what the store serves: every target keyed, none answered blind.
    direct = Direct(config, store, enabled=not args.full and args.verify is None,
                    may_write=not args.read_only)
    rows = direct.answer(args.targets, args.arch, "fresh", hold=lambda: held_shared(store))
    if rows is not None and getattr(args, "retry_failed", False) and \
            any(r.failed is not None for r in rows):
        rows = direct.fall_back("--retry-failed: a recorded failure compiles again")
    if rows is not None:
        return direct_build(args, direct, config, store, rows, max_size, start)
    direct.begin_full()
    return full_build(args, opened, direct, store, executor, max_size, start)


def _verify_setting(args):
    """The share of served targets `--verify` checks ("" for all), None for no check:
    the option, else $KBUILD_VERIFY (`1`: all; `10%`: a share; `0` or empty: none)."""
    text = args.verify
    if text is None:
        env = os.environ.get("KBUILD_VERIFY", "").strip()
        if env.lower() in ("", "0", "false", "no", "off"):
            return None  # before importing the build: a no-op imports no numba
        text = "" if env.lower() in ("1", "true", "yes", "on") else env
    from ..builder import parse_sample

    try:
        return parse_sample(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_verify(args, opened) -> int:
    """Rebuild what the store holds for the current targets and compare the bytes."""
    from ..builder import default_jobs, launchable, parse_archs, parse_sample
    from ..builder.row import Row
    from ..config import load_config
    from ..project import Project

    config, store = light_project(args, opened, read_only=False)
    try:
        sample = parse_sample(args.sample)
    except ValueError as exc:
        raise UsageError(str(exc).replace("--verify=", "--sample ")) from None
    start = time.perf_counter()
    project = remember(opened, Project(load_config(args.config), store))
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


def cmd_watch(args, opened) -> int:
    """Build, then wait for a saved file and build again, in one process, until Ctrl-C.
    A round that fails (a config error, a module that does not import) is reported and
    the watch goes on; every round keeps going past failed targets."""
    from ..builder import default_jobs, parse_archs
    from ..discover import forget_project_modules

    archs = parse_archs(args.arch)
    jobs = args.jobs or default_jobs()
    rounds = 0
    try:
        while True:
            roots, extra = _watch_round(args, opened, archs, jobs)
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


def _watch_round(args, opened, archs, jobs):
    """One build; (the folders and files to watch for the next one)."""
    try:
        roots, extra = _watched_build(args, opened, archs, jobs)
    except KbuildError as exc:
        error(str(exc))
        roots, extra = _config_folder(args)
    flush_warnings(opened)
    if opened.store is not None:
        opened.store.warnings.clear()
    sys.stdout.flush()
    return roots, extra


def _watched_build(args, opened, archs, jobs):
    """A watch round's build; (the project's folders, [its kbuild.toml])."""
    from ..project import open_project

    start = time.perf_counter()
    project = remember(opened, open_project(args.config, args.store))
    project.store.warnings.clear()
    the_plan = project.plan(args.targets, archs)
    report = BuildReport(args, the_plan, project.store)
    rows = project.build(args.targets, archs, keep_going=True, progress=report,
                         **build_settings(args, jobs))
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
    from ..store.remote_settings import remote_timeout

    return parse_executor(args.executor, warnings=store.warnings,
                          timeout=remote_timeout(config, args.remote_timeout))
