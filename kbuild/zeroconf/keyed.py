"""A compile keyed in full, as `kbuild build` keys it, looked up and built through the
build service.

`plan` keys the kernel with kbuild's own Keyer and `builder.target_key`: the key a
declared target of that name, signature and arch gets (a fresh Keyer per compile: the
program may have changed a global since the last one, and the key must say what numba
reads now), in a one-target `Plan` for the device's arch and the other `archs=`.
`obtained` then has the build service (`builder.service.BuildService`) look the key up
(the store and the remote behind it, checking what the compile observed as a build
does; in a launch, also under the key of the current launch configuration, where a
kernel that depends on it is kept: see keying/launch.py), and on a miss
(on_miss="build") take the key's lock, look again, relink or compile in this process and
commit (`BuildService.ensure`). What stays here is zero-config's own part of a build:
numba's compiled device functions kept in step (`dispatchers.DeviceCode`), a compile
marked launch-config sensitive committed under the key of its launch configuration
(keeping no objects), the other archs, KBUILD_VERIFY's fresh build before a launch.
"""

from __future__ import annotations

import random

from ..errors import LaunchError
from .dispatchers import backend_of


def plan(session, request, name: str, text: str, arch: str):
    """(the `Plan` keying `name` `text` for `arch` and the other archs asked for, its
    targets, `arch`'s first)."""
    from ..builder import Plan, new_keyer, target_key
    from ..config import KernelSpec
    from ..discover import ResolvedKernel, Target

    archs = (arch,) + tuple(a for a in session.settings.archs if a != arch)
    backend = backend_of(request.dispatcher)
    spec = KernelSpec(name, (text,), archs, backend=backend.name)
    resolved = ResolvedKernel(spec, request.dispatcher, {text: tuple(request.argtypes)},
                              backend=backend)
    keyer = new_keyer(session.config, sources=session.sources)
    targets = [Target(name, text, a) for a in archs]
    keys = {t: target_key(keyer, resolved, t) for t in targets}
    return Plan(session.config, {name: resolved}, list(targets), keys, keyer), targets


def obtained(session, service, targets, request, device_arch: str):
    """(the fresh entry for `targets[0]`, the target it is stored as): found, or built as
    `on_miss` says; (None, None) when numba must compile it (on_miss="jit", a store that
    cannot be written, a compile that failed, a KBUILD_VERIFY build that failed).
    LaunchError on a miss with on_miss="error"."""
    manifest, served = _lookup(service, targets[0], request)
    if manifest is not None:
        session.counts["hits"] += 1
        if session.verify and random.random() < session.verify:
            return _verified(session, service, served, manifest)
        return manifest, served
    first = targets[0]
    if session.settings.on_miss == "error":
        raise LaunchError(_missing(session, first, request, device_arch))
    if session.settings.on_miss == "jit" or not session.writable():
        return None, None
    manifest, served = _build(session, service, targets, request)
    session.starter.built(session.settings, session.journal, session.declared, first.name,
                          first.signature, first.arch, session.warn)
    return manifest, served


def _missing(session, first, request, device_arch: str) -> str:
    """What on_miss='error' says of a kernel the store lacks: the arch it was looked up
    for, which is not the device's own where the backend compiles for another (numba-cuda's
    JIT target 'sm_90a' on an sm_90, NUMBA_FORCE_CUDA_CC): a store prebuilt for the
    device's plain arch holds an entry a launch never serves."""
    where = f"{first.arch}"
    if first.arch != device_arch:
        where += (f", the arch {backend_of(request.dispatcher).name} compiles for on this "
                  f"{device_arch} device")
    return (f"kernel '{first.name}' {first.signature} is not in store {session.store.root} "
            f"for {where} (on_miss='error'); build it there with `kbuild build --arch "
            f"{first.arch}`, or run once with on_miss='build'")


def _lookup(service, target, request):
    """(the fresh entry for `target`, the target it was found as), or (None, None):
    its static key, then (in a launch) the key of the current launch configuration
    (first, when numba already knows its kernels depend on their launch)."""
    return service.fresh_in_launch(target, request.launch, request.launch_sensitive)


def _verified(session, service, served, manifest):
    """KBUILD_VERIFY: the entry `served` rebuilt from source here, reusing nothing
    this process or the store made, and compared byte for byte (see builder.verify):
    (the entry to load, its target), the fresh build's when the stored one differs,
    (None, None) when a fresh build fails. Checked before the launch, so a binary
    that differs is never launched."""
    session.device_code.disown(service.plan.keyer)
    outcome, seconds = service.compile_fresh(served, manifest, in_order=False)
    session.counts["verified"] += 1
    label = f"{served.name} {served.signature} {served.arch}"
    with session.store.shared():
        differ, _ = service.compared(served, manifest, outcome, seconds,
                                     record_failure=False)
    if isinstance(differ, Exception):
        session.warn(f"kbuild: {label}: the store holds a binary a fresh build cannot make "
                     f"({str(outcome).splitlines()[0]}); entry removed, numba compiles it "
                     "(please report this)")
        return None, None
    if not differ:
        return manifest, served
    session.counts["differ"] += 1
    session.warn(f"kbuild: {label}: the cached binary differs from a fresh build; kbuild "
                 "keyed nothing that changed (please report this); the entry is replaced "
                 "and the fresh build launched")
    return service.fresh_as_stored(served)


def _build(session, service, targets, request):
    """Build (relink or compile, and commit) the targets through the build service,
    the device's first; (its entry, the target it is stored as), or (None, None)
    when the compile failed."""
    manifest, served = _ensure(session, service, targets[0], request,
                               lambda t: _lookup(service, t, request))
    if manifest is None:
        return None, None
    if len(targets) > 1:
        _build_others(session, service, targets[1:], served, request)
    return manifest, served


def _build_others(session, service, others, served, request) -> None:
    """The same kernel for the other archs asked for (`archs=`): a store for a fleet."""
    for other in others:
        if served.launch is not None:
            other = service.for_launch(other, served.launch)
        _ensure(session, service, other, request)
    # Device functions now hold code for another arch: typed again when next needed.
    session.device_code.forget(service.plan.keyer)


def _ensure(session, service, target, request, lookup=None):
    """`service.ensure` as zero-config builds: compiled in this process (numba's
    compiled device functions kept in step, `DeviceCode.compiled`), committed under the
    key of its launch configuration when the compile depends on it; a failure warns
    (numba compiles it). (entry, target as stored) or (None, None)."""
    marks, placed = [], []
    backend = backend_of(request.dispatcher)
    keyer = service.plan.keyer

    def compile_now(target):
        session.starter.compiling()  # a compile, not a relink (see `background.Starter`)
        return service.compile(target, early_cutoff=False)

    def produce(target):
        with backend.watching(request.config) as watched:
            marks.append(watched)
            return service.produce(target, compile=lambda t: session.device_code.compiled(
                keyer, lambda: compile_now(t)))

    def place(target, outcome):
        placed.append(target)
        if (marks[-1].sensitive or request.launch_sensitive) and target.launch is None \
                and request.launch is not None:
            _forget_launch_specific(session, service.plan, target, outcome)
            return service.for_launch(target, request.launch)
        return target

    manifest, found = service.ensure(target, lookup=lookup, produce=produce, place=place)
    session.counts["built"] += len(placed)  # committed (found under the lock: not ours)
    if manifest is not None and not placed:
        session.counts["awaited"] += 1  # another process (the background build) made it
    if manifest is None and isinstance(found, Exception):
        session.warn(f"kbuild: {target.label}: {str(found).splitlines()[0]}; "
                     "numba compiles it")
        return None, None
    return manifest, found


def _forget_launch_specific(session, plan, target, outcome) -> None:
    """What a compile marked launch-config sensitive made for its launch alone: its
    objects, and the device functions numba typed meanwhile (typed again for the next
    launch configuration, as a fresh process types them)."""
    made = [o.key for o in outcome.objects]
    plan.kernels[target.name].backend.forget_compiled(objects=made)
    session.device_code.forget(plan.keyer)
