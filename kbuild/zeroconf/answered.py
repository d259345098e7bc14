"""A compile answered by the program journal (`journal`), without a key tree.

When the live digest of what this compile's key rests on (`journal.LiveDigest`) is one
the journal holds from an earlier run, the key is the journal's: its entry is the one the
journal checked before when it is the same (`journal.checked_entry`), else the build
service's look-up at that key (the entry verified, and what its compile read matched
against this process), and the kernel is loaded from it. Anything else is keyed in full
(`keyed`), and `remember` has the journal keep the key that full keying found, for the
live digest taken here.

The work per answered kernel is counted (tests/test_zeroconf_journal.py): no key tree, no
entry checked in full, its entry and its cubin read.
"""

from __future__ import annotations

from ..builder.service import program_fills
from ..keying.made import stored_fills
from ..keying.observed import Kind
from . import cellwatch
from .dispatchers import backend_of


def answer(session, request, name: str, text: str, arch: str, device_arch: str):
    """(the kernel served under the key the journal holds for this compile, or None:
    keyed in full; the (journal target id, live digest) taken, or None). `arch` is the
    one compiled for, `device_arch` the device's. Under KBUILD_VERIFY every kernel is
    keyed in full, and so checked."""
    from ..builder import new_keyer
    from ..discover import Target
    from ..store.local import CorruptBlob
    from .journal import live_digest, target_id

    journal = session.journal
    # A notebook's kernels follow its cells (`cellwatch`), which the key tree tells.
    if journal is None or request.launch_sensitive or session.verify or cellwatch.active():
        return None, None
    backend = backend_of(request.dispatcher)
    keyer = new_keyer(session.config, sources=session.sources)
    live = live_digest(keyer, keyer.objects, request, text, arch, backend)
    if live is None:
        journal.counts["not vouched"] += 1
        return None, None
    tid = target_id(name, text, arch)
    held = journal.held_for(tid, live)
    if held is None:
        return None, (tid, live)
    if program_fills() or any(row[0] == Kind.FILLED for row in held.observed):
        # State compiles fill is filled in this program, or was when this was built:
        # looked up through the build service, which checks it was read as it is now.
        journal.counts["not vouched"] += 1
        return None, (tid, live)
    target = Target(name, text, arch)
    try:
        manifest = _entry(session, held, target, request, backend, keyer)
    except Exception:  # noqa: BLE001 - the full look-up meets it and says what it is
        manifest = None
    if manifest is None:
        journal.counts["missed"] += 1
        return None, (tid, live)
    if stored_fills(manifest) is not None:
        # Its compile filled state a later compile may read: served through the build
        # service, which runs that compile again before the next one (`replay_writers`).
        journal.counts["not vouched"] += 1
        return None, (tid, live)
    try:
        kernel = session.load(manifest, target, request, device_arch, backend, held.key)
    except CorruptBlob:  # its binary is gone or damaged (said once): the full look-up
        journal.counts["missed"] += 1  # finds the entry broken and rebuilds it
        return None, (tid, live)
    session.counts["hits"] += 1
    journal.counts["answered"] += 1
    journal.launched(tid)
    return kernel, None


def _entry(session, held, target, request, backend, keyer):
    """The entry for a key the journal gave: the entry the journal checked before when
    it is the same (`journal.checked_entry`), else the build service's look-up (the
    entry verified, and the observation set of what its compile read matched against
    this process)."""
    from ..builder.entries import digests_now, expected
    from ..builder.service import fresh_at_key
    from .journal import checked_entry

    root = session.config.root
    current = digests_now(keyer.sources, root)
    manifest = checked_entry(session.store, held, current,
                             expected(target, request.dispatcher, backend))
    if manifest is not None:
        return manifest
    return fresh_at_key(session.store, held.key, target, request.dispatcher, backend,
                        keyer.sources, root)


def remember(session, live, served, name: str, text: str, plan, manifest) -> None:
    """A compile keyed in full and served from its static key: the journal keeps its
    key, and its entry's identity, for the `live` (target id, digest) taken before
    keying (`answer`'s; None: nothing to keep)."""
    from .journal import held_entry

    if live is None or served.launch is not None or served.name != name \
            or served.signature != text or served not in plan.keys:
        return
    key = plan.keys[served].digest
    session.journal.remember(live[0], live[1], held_entry(session.store, key, manifest))
    session.journal.launched(live[0])
