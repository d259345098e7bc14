"""What a build command does between its options and its report: the journal's answer
(`direct_build`) or a full build (`full_build`: key, build, verify), then eviction and the
journal of the build. The commands (`build_cmds`) choose; these run.
"""

from __future__ import annotations

import time

from ..model import RowStatus
from .common import interrupted, remember
from .report import BuildReport, error_location


def held_shared(store):
    """The store held shared (gc and clean wait) while a no-op checks its entries."""
    import contextlib

    if store.read_only or not store.exists():
        return contextlib.nullcontext()
    return store.shared()


def direct_build(args, direct, config, store, rows, max_size, start) -> int:
    """A no-op build answered from the journal: every target cached, as a full run says."""
    from ..builder.row import Row
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


def full_build(args, opened, direct, store, executor, max_size, start) -> int:
    """Every target keyed from its sources, built if out of date; the journal written."""
    from ..builder import default_jobs, parse_archs
    from ..config import load_config
    from ..project import Project

    project = remember(opened, Project(load_config(args.config), direct.attach(store)))
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
                             executor=executor, last_entry=direct.last_entry,
                             **build_settings(args, jobs))
        if verifying and not args.read_only:
            rows = project.verify(rows, args.targets, archs, sample=args.verify, jobs=jobs,
                                  target_timeout=args.target_timeout)
    except BaseException as exc:
        if not interrupted(exc):
            raise
        # Finished rows are committed; what was compiling is dropped, its locks released.
        return report.finish(report.rows, time.perf_counter() - start, interrupted=True)
    evict(project.store, max_size, the_plan, rows)
    journal_build(direct, project, the_plan, rows)
    report.mode = direct.describe()
    return report.finish(rows, time.perf_counter() - start)


def journal_build(direct, project, the_plan, rows) -> None:
    """The journal of this build: every target's entry, looked up again where it was
    just built (so it is checked as a later lookup would check it)."""
    from ..builder.entries import expected
    from ..builder.failures import recorded_error
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


def evict(store, max_size, the_plan, rows) -> None:
    """After a build that added to the store: gc down to the size cap when over it,
    keeping the current targets (`maintenance.evict_after_build`)."""
    from ..store.maintenance import evict_after_build

    evict_after_build(store, max_size, [the_plan.keys[t].digest for t in the_plan.targets],
                      added=any(r.status == RowStatus.BUILT for r in rows))


def build_settings(args, jobs: int) -> dict:
    """`Project.build`'s settings from the options build and watch share."""
    return {"jobs": jobs, "separate": not args.whole_program,
            "target_timeout": args.target_timeout, "retry_failed": args.retry_failed}
