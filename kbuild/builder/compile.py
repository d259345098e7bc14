"""One target's job, in this process: compile it (recording what the compiler read), or
link it from stored objects when a recipe says they still hold."""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, replace

from ..artifacts import arch_cc
from ..discover import Target
from ..errors import CHANGED_AFTER_IMPORT, CompileError
from ..execute.parallel import note
from ..keying import made
from ..keying import observed as obs
from ..keying.objects import Recipe
from ..model import LinkMode
from ..store.local import Store
from ..store.manifest import built_problem
from .cutoff import Outputs, StoredObjects
from .entries import current_digests
from .failures import CompileFailed
from .planning import Plan


@dataclass(frozen=True)
class Relink:
    """A link recipe whose objects' observations all hold, and those observations."""

    recipe: Recipe
    observed: tuple  # (kind, name, digest) rows, the union of the objects'


def compile_target(the_plan: Plan, target: Target, store: Store | None = None,
                   objects: StoredObjects | None = None):
    """(Artifacts or CompileError, seconds) for one target, in this process; what `store`
    holds from earlier builds of the same bytes is reused (see `cutoff`; `objects`: the
    build's memo of the arch's stored objects)."""
    resolved = the_plan.kernels[target.name]
    backend = resolved.backend
    start = time.perf_counter()
    apart = (the_plan.keyer.nodes, the_plan.keys[target]) if the_plan.separate else None
    observer = backend.observer(_static_functions(the_plan, target), the_plan.config.root,
                                on_new=_note, digest_now=_digests(the_plan))
    if target.launch is not None:  # callees typed for another launch configuration
        for disp in the_plan.keyer.device_functions:
            backend.forget_code(disp)
    mark = made.fills()
    try:
        with backend.launched_as(resolved.kernel, target.launch):
            artifacts = backend.compile(
                resolved.kernel, resolved.argtypes[target.signature], arch_cc(target.arch),
                device_functions=the_plan.keyer.device_functions,
                stable_ids=the_plan.keyer.stable_ids, apart=apart, observer=observer,
                outputs=outputs(the_plan, target, store, objects),
                source_roots=the_plan.config.paths)
    except Exception as exc:  # noqa: BLE001 - numba's message goes into the row
        # Out of memory or a file it could not read may not happen again: not recorded.
        observed = None if isinstance(exc, (MemoryError, OSError)) else \
            _observed_rows(the_plan, observer)
        return CompileFailed(_compile_message(exc), observed), time.perf_counter() - start
    try:
        artifacts = _with_observations(the_plan, artifacts, observer)
        artifacts = replace(artifacts, fills=made.filled_since(mark))
    except CompileError as exc:
        return exc, time.perf_counter() - start
    return artifacts, time.perf_counter() - start


def _with_observations(the_plan: Plan, artifacts, observer):
    """`artifacts` with the digests of what the compile observed; a dependency that cannot
    be keyed by content fails this target, naming it (never keyed by identity)."""
    observed = _digests(the_plan).observations(observer)
    bad = obs.unkeyable(observed)
    if bad:
        o = bad[0]
        if CHANGED_AFTER_IMPORT in o.digest:  # not unkeyable: keyed from other bytes
            raise CompileError(o.digest.partition(": ")[2])
        if o.kind is obs.Kind.UNSEEN:
            raise CompileError(
                f"while compiling, code numba ran (an @overload, an @intrinsic or a helper "
                f"they call) {o.name}, whose result kbuild cannot key; do that when the "
                "module is imported and keep the result in a module constant, which the "
                "compile then reads as a value")
        raise CompileError(
            f"observed {o.kind.value} {obs.display_name(o.kind, o.name)} was read while "
            f"compiling, but kbuild cannot key it by content ({o.digest}); make it a number, "
            "string, tuple, numpy array or dtype, enum, or a function")
    try:
        obs.observation_set("", observed)
    except ValueError as exc:
        raise CompileError(f"{exc}; kbuild keeps at most {obs.MAX_OBSERVATIONS}") from None
    return replace(artifacts, observed=tuple(tuple(o.as_row()) for o in observed))


def _static_functions(the_plan: Plan, target: Target) -> list:
    """The functions this target's static key holds by content (their trees are in it).
    Another target's callee that this one's key left out (a callee only a branch numba
    prunes reads) is observed if numba compiles it here after all."""
    digests, todo = set(), [the_plan.keys[target]]
    while todo:
        node = todo.pop()
        if node.digest not in digests:
            digests.add(node.digest)
            todo.extend(node.children)
    keyer = the_plan.keyer
    return [keyer.python_function(obj) for obj, node in keyer.nodes.items()
            if node.digest in digests]


def _observed_rows(the_plan: Plan, observer):
    """The (kind, name, digest) rows of what `observer` saw, or None when that cannot be
    said (a failed compile is then not recorded): the compile failed where it could not
    be followed (`Observer.unsaid`), or the digests cannot be taken."""
    if observer.unsaid:
        return None
    try:
        return tuple(tuple(o.as_row()) for o in _digests(the_plan).observations(observer))
    except Exception:  # noqa: BLE001 - a failure not recorded only costs its next compile
        return None


def _digests(the_plan: Plan):
    """The digests of observed names now, taken once per plan in this process: a worker
    compiles many targets, whose compiles observe mostly the same names (the device
    functions they share are keyed once, not once per target)."""
    if the_plan.launch_digests is None:
        the_plan.launch_digests = current_digests(the_plan)
    return the_plan.launch_digests


def _note(kind, name) -> None:
    """Each new name a compile records goes to the parent process (`parallel.note`): a
    compile killed for its time still says what it had read."""
    note((kind.value, name))


def link_target(the_plan: Plan, store: Store, target: Target, relink: Relink,
                objects: StoredObjects | None = None):
    """(Artifacts, seconds) of a target linked from stored objects; compiled if that fails
    (a blob gone bad since the recipe was made, say). Objects byte-identical to an
    earlier link's take its output instead of linking (see `cutoff`)."""
    recipe = relink.recipe
    from ..backend.base import Artifacts

    start = time.perf_counter()
    resolved = the_plan.kernels[target.name]
    options = resolved.backend.target_options(resolved.kernel)
    try:
        ltoirs = [store.read_blob(blob) for _, blob in recipe.objects]
        linked = resolved.backend.relink(
            ltoirs, arch_cc(target.arch), max_registers=options.get("max_registers"),
            outputs=outputs(the_plan, target, store, objects), entry=recipe.entry,
            flags=recipe.flags, lto=recipe.lto)
    except Exception:  # noqa: BLE001 - a bad blob (CorruptBlob) or link: compile it instead
        return compile_target(the_plan, target, store, objects)
    if built_problem(target.arch, recipe.entry, {"ptx": linked.ptx, "cubin": linked.cubin}):
        return compile_target(the_plan, target, store, objects)  # objects linking another kernel
    artifacts = Artifacts(ptx=linked.ptx, cubin=linked.cubin, entry=recipe.entry,
                          cooperative=recipe.cooperative,
                          link={"mode": LinkMode.RELINK, "objects": [k for k, _ in recipe.objects]},
                          observed=relink.observed, cutoff=linked.cutoff, outputs=linked.keys)
    return artifacts, time.perf_counter() - start


def outputs(the_plan: Plan, target: Target, store: Store | None,
            objects: StoredObjects | None = None) -> Outputs:
    """The early-cutoff look-ups of `target`'s compile or link (keys only without a store)."""
    if store is not None and objects is None:
        objects = StoredObjects(store, target.arch,
                                make_current=functools.partial(current_digests, the_plan))
    return Outputs(the_plan.keys[target], target.arch, store, objects)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _compile_message(exc: Exception) -> str:
    # numba highlights its messages with terminal escapes; rows are data, not terminal output.
    text = _ANSI.sub("", str(exc)).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}"
