"""A store's earlier builds of each target, and the one to explain a key against.

`kbuild status` and `explain` compare a target's key tree with the stored build whose
inputs differ from it least, not with the newest build: after a revert the newest
build is of the inputs just reverted, and blaming those would name the wrong change.
Relinked rows use the same comparison to name the device functions that changed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..keying.explain import Reason, diff
from ..keying.tree import LabelKind, function_name, label_kind
from .local import Store, is_target


_SCANNED: dict[str, dict] = {}  # store root -> `Store.entries` memo


@dataclass(frozen=True)
class Nearest:
    """A stored build and how the current key tree differs from its inputs."""

    manifest: dict
    reasons: list  # [Reason], old = that build, new = now

    @property
    def key(self) -> str:
        return self.manifest.get("key", "")

    @property
    def built_at(self) -> str:
        return self.manifest.get("built_at", "")


def explained(reasons) -> dict:
    """Reasons as `status --json` carries them: their messages, and each as data."""
    return {"reasons": [r.message for r in reasons], "changes": [r.as_json() for r in reasons]}


class History:
    """Every target entry of a store by (target, signature, arch), each manifest read once."""

    def __init__(self, store: Store):
        by_ident: dict[tuple, list] = {}
        # A resident process (`kbuild watch`) reads only the entries new since its last scan.
        memo, seen = _SCANNED.get(str(store.root), {}), set()
        for key, manifest in store.entries(memo):
            seen.add(key)
            if is_target(manifest):
                ident = (manifest.get("target"), manifest.get("signature"), manifest.get("arch"))
                by_ident.setdefault(ident, []).append(manifest)
        _SCANNED[str(store.root)] = {k: v for k, v in memo.items() if k in seen}
        self._by_ident = {ident: _newest_first(ms) for ident, ms in by_ident.items()}

    def builds(self, target) -> list[dict]:
        """The entries of `target` (a `Target`), newest first."""
        return self._by_ident.get((target.name, target.signature, target.arch), [])

    def nearest(self, target, inputs, other_than: str | None = None) -> Nearest | None:
        """The build of `target` whose inputs differ least from `inputs` (a flattened key
        tree): fewest differing inputs, the newest of equals. `other_than` (the key of
        `inputs`): only builds of other inputs, not that key's own or its variants."""
        return _nearest(self.builds(target), inputs, other_than)

    def nearest_replaced(self, target, declared, inputs) -> Nearest | None:
        """The nearest build of `target`'s kernel and arch under a signature no longer
        declared (one edited in kbuild.toml, say)."""
        found = [m for (name, sig, arch), ms in self._by_ident.items() for m in ms
                 if name == target.name and arch == target.arch and sig not in declared]
        return _nearest(_newest_first(found), inputs, None)

    def newer_than(self, target, manifest: dict) -> Nearest | None:
        """The newest build of `target`, when it is strictly newer than `manifest` and of
        other inputs (what a cached target was last rebuilt for), else None."""
        builds = self.builds(target)
        newest = builds[0] if builds else manifest
        if newest.get("built_at", "") <= manifest.get("built_at", "") \
                or newest.get("inputs") == manifest.get("inputs"):
            return None
        return Nearest(newest, diff(newest.get("inputs", []), manifest.get("inputs", [])))


class RelinkReasons:
    """Called with a relinked row of one build: the device functions it was relinked for
    (all that changed since the target's nearest earlier build), or None when unknown.

    Each is told against its last build (`last_entry`: the key of the entry it used, which
    the direct-mode journal names), one entry read; the store is scanned, once per build,
    only for a row whose last build is unknown or differs in more than device functions.
    Only relinked rows are compared: `kbuild watch` rebuilds on this path after every save.
    """

    def __init__(self, store: Store, keys: dict, last_entry=None):
        self._store, self._keys = store, keys  # keys: Target -> KeyNode
        self._last_entry = last_entry  # Target -> the key its last build used, or None
        self._history: History | None = None
        self._targets = {(t.name, t.signature, t.arch): t for t in keys}

    def __call__(self, row) -> list[str] | None:
        target = self._targets.get((row.target, row.signature, row.arch))
        if target is None:
            return None
        node = self._keys[target]
        inputs = [[list(path), text, d] for path, text, d in node.flatten()]
        # What changed since the target's last build, read from its one entry: a store of
        # many earlier builds is scanned only when that build is unknown or differs in more
        # than device functions (then the nearest build of all is the better answer).
        last = self._last_entry(target) if self._last_entry is not None else None
        if last is not None and last != node.digest:
            manifest = self._store.manifest(last, {"target": row.target, "signature":
                                                   row.signature, "arch": row.arch})
            nearest = _nearest([manifest], inputs, node.digest) if manifest else None
            changed = changed_device_functions(nearest.reasons) if nearest else None
            if changed:
                return changed
        if self._history is None:
            self._history = History(self._store)
        # Its own entry is committed by now: the nearest other build is the earlier one.
        nearest = self._history.nearest(_Ident(row.target, row.signature, row.arch), inputs,
                                        other_than=node.digest)
        return changed_device_functions(nearest.reasons) if nearest else None


@dataclass(frozen=True)
class _Ident:
    name: str
    signature: str
    arch: str


def _newest_first(manifests: list) -> list:
    # Entries of one second in key order, so the choice is the same every run.
    by_key = sorted(manifests, key=lambda m: m.get("key", ""))
    return sorted(by_key, key=lambda m: m.get("built_at", ""), reverse=True)


def _nearest(builds, inputs, other_than) -> Nearest | None:
    best, least = None, 1 if other_than else 0  # no build of other inputs differs in fewer
    for manifest in builds:  # newest first: a later one must differ in fewer inputs
        if manifest.get("key") == other_than or not isinstance(manifest.get("inputs"), list):
            continue
        reasons = diff(manifest["inputs"], inputs)
        if other_than and not reasons:
            continue  # the same inputs, built for other observations (a variant)
        if best is None or len(reasons) < len(best.reasons):
            best = Nearest(manifest, reasons)
            if len(reasons) <= least:
                break
    return best


def changed_device_functions(reasons: list[Reason]) -> list[str] | None:
    """The device functions (MOD:QUALNAME) whose edits are the only differences in
    `reasons`, or None when something else differs too (or nothing does)."""
    names = []
    for reason in reasons:
        name = _changed_callee(reason)
        if name is None:
            return None
        if name not in names:
            names.append(name)
    return names or None


def _changed_callee(reason: Reason) -> str | None:
    # A changed input inside a callee's tree is that callee's; an added or removed one is
    # the function that gained or lost it (the one above it in the path).
    path = reason.path if reason.change == "changed" else reason.path[:-1]
    callees = [label for label in path if label_kind(label) is LabelKind.CALLEE]
    if not callees:
        return None
    return function_name(callees[-1])
