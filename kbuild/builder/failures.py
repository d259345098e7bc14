"""Failed compiles, recorded by key: an unchanged target fails at once next time, with
the error it had, until something it read changes (or `--retry-failed`)."""

from __future__ import annotations

from ..discover import Target
from ..errors import CompileError
from ..keying import observed as obs
from ..model import RowStatus
from ..store import failures as records
from ..store.local import Store
from .entries import expected
from .planning import Plan
from .row import Row


class CompileFailed(CompileError):
    """A compile error, with the observation rows of what the compile had read (None when
    they cannot be keyed by content: then the failure is not recorded)."""

    def __init__(self, message: str, observed=None):
        super().__init__(message)
        self.observed = observed


class CompileTimeout(CompileError):
    """A compile stopped at the time limit; `notes` are the (kind, name) pairs it had read."""

    def __init__(self, limit: float, notes=()):
        super().__init__(f"compile took longer than {limit:g}s (--target-timeout / [build] "
                         "target_timeout); stopped it: raise the limit to let it finish")
        self.limit, self.notes = limit, notes


_EARLIER = "(failed earlier with this key; --retry-failed to compile again)"


def remember_failure(the_plan: Plan, store: Store, target: Target, error, seconds,
                     current) -> None:
    """Record a failed compile under its key, with what it had read, so the unchanged
    target fails at once next time. Only compile errors and timeouts: a worker that died
    (out of memory?) may live next time. Nothing is recorded when something the compile
    read cannot be keyed by content (it could change unseen)."""
    if isinstance(error, CompileTimeout):
        observed, limit = _digests(error.notes, current), error.limit
    elif isinstance(error, CompileFailed):
        observed, limit = error.observed, None
    else:
        return
    if observed is None or store.read_only or any(d.startswith(obs.UNKEYABLE)
                                                  for _, _, d in observed):
        return
    records.remember(store, the_plan.keys[target].digest, records.Failure(
        target.name, target.signature, target.arch, str(error), tuple(observed), limit,
        seconds, the_plan.config.name))


def forget_failure(store: Store, key: str) -> None:
    records.forget(store, key)


def recorded_failure(the_plan: Plan, store: Store, target: Target, current,
                     limit: float | None) -> Row | None:
    """The failed row of a target whose failure was recorded for its key and still holds:
    everything its compile had read has the digest it had, and, for a compile stopped at
    a time limit, the limit now is no longer than that one. None: compile it."""
    key = the_plan.keys[target].digest
    failure = records.recorded(store, key, expected(target))
    if failure is None:
        return None
    if failure.limit is not None and (limit is None or limit > failure.limit):
        return None  # a longer limit may see it through
    for kind, name, digest in failure.observed:
        try:
            now = current(obs.Kind(kind), name)
        except ValueError:  # a kind this kbuild does not know: not a record to trust
            return None
        if now != digest or digest.startswith(obs.UNKEYABLE):
            return None
    return Row.of(target, key, RowStatus.FAILED, error=recorded_error(failure.error),
                  recorded=True)


def recorded_error(error: str) -> str:
    """How a build reports a failure recorded earlier (`error` as the record holds it)."""
    return f"{error} {_EARLIER}"


def _digests(notes, current):
    """Observation rows of the (kind, name) pairs a killed compile sent, digested now."""
    try:
        return tuple((kind, name, current(obs.Kind(kind), name)) for kind, name in notes)
    except Exception:  # noqa: BLE001 - as above
        return None
