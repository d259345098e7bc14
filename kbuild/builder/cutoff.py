"""Early cutoff in a build: what an earlier build made from the same bytes is reused.

A target whose inputs changed is compiled or relinked, but its last steps need not
run when what they read is byte-identical to what an earlier build's read (see
`keying.cutoff`): a device function recompiled into the same LTO-IR object, linked
with its callers' stored objects, gives the PTX and cubin the earlier link gave.
`Outputs` is what a compile or link asks (`backend.compiler`, `backend.lto`), in
this process or a worker: stored objects' LTO-IR (through the build's `StoredObjects`,
which its recipes share), a link's output by the blob
names of its objects, a cubin by the blob name of its PTX. `record` writes, after a
target's commit, its output under the cutoff keys its compile computed.

What is reused is only ever bytes a step made from the same input bytes, read back
verified (blob hashes, and a record's PTX and cubin must define the entry for the
arch, as a target's entry must); the target's entry is committed under its own new
key. Records are local to a store: a remote tier is not asked for them (a worker
must not use the parent's connection) nor sent them.
"""

from __future__ import annotations

from ..artifacts import OUTPUT_KIND
from ..keying import observed as obs
from ..keying.cutoff import cubin_key, link_key
from ..keying.encode import digest
from ..keying.objects import interface
from ..keying.tree import KeyNode
from ..store.local import CorruptBlob, Store
from .entries import built_now, observed_record


class StoredObjects:
    """The lookup of one arch's stored objects for a build's recipes and compiles,
    remembering hits: an object shared by many targets is read and verified once per
    build, and so is its record of what its compile observed. Misses, and records that no
    longer hold, are asked again (the first wave commits new objects). `current` is what
    observed names digest to now (`entries.current_digests`), or `make_current()` makes
    it when first needed."""

    def __init__(self, store: Store, arch: str, current=None, make_current=None):
        self.store, self.arch = store, arch
        self._current, self._make_current = current, make_current
        self.hits, self.holding = {}, {}

    @property
    def current(self):
        if self._current is None:
            self._current = self._make_current()
        return self._current

    def __call__(self, key: str, remote: bool = True) -> dict | None:
        """The stored object `key` (asked of the remote tier on a local miss, unless
        `remote` is false: a worker process never uses the parent's connection)."""
        if key not in self.hits:
            manifest = self.store.lookup(key, {"kind": "object", "arch": self.arch},
                                         remote=remote)
            if manifest is None:
                return None
            self.hits[key] = manifest
        return self.hits[key]

    def held(self, key: str):
        """The observation set of the stored object `key` that still holds, or None."""
        if key not in self.holding:
            record = observed_record(self.store, self(key))
            found = record and obs.matching_set(record, self.current)
            if not found:
                return None
            self.holding[key] = found
        return self.holding[key]


class Outputs:
    """The early-cutoff look-ups of one target's compile or link, against `store` and
    its `objects` (the build's `StoredObjects` for the target's arch); with no store (a
    cluster worker) it only computes the cutoff keys, which the machine that commits
    records."""

    def __init__(self, node: KeyNode, arch: str, store: Store | None = None,
                 objects: StoredObjects | None = None):
        self.node, self.arch, self.store, self.objects = node, arch, store, objects

    def ltoir(self, key: str, manifest: dict) -> bytes | None:
        """The LTO-IR of the stored object `key` when it was compiled against `manifest`'s
        interface and what its compile observed still holds (what a relink requires)."""
        if self.store is None or self.objects is None:
            return None
        stored = self.objects(key, remote=False)
        if stored is None or interface(stored) != interface(manifest) \
                or not self.objects.held(key):
            return None
        return self._blob(stored["artifacts"]["ltoir"])

    def linked(self, ltoirs, options: tuple, entry: str):
        """(cutoff key, (PTX, cubin) or None) of linking the LTO-IR objects `ltoirs`."""
        key = link_key(self.node, [digest(b) for b in ltoirs], options)
        found = self._output(key, entry)
        return key, found

    def cubin(self, inputs, options: tuple, entry: str):
        """(cutoff key, cubin or None) of making a cubin from `inputs` (PTX modules, or a
        whole program's LTO-IR: `options` say which)."""
        key = cubin_key(self.node, [digest(b) for b in inputs], options)
        found = self._output(key, entry)
        return key, found and found[1]

    def _output(self, key: str, entry: str):
        if self.store is None:
            return None
        manifest = self.store.lookup(key, {"kind": OUTPUT_KIND, "arch": self.arch,
                                           "entry": entry}, remote=False)
        if manifest is None:
            return None
        ptx = self._blob(manifest["artifacts"]["ptx"])
        cubin = ptx and self._blob(manifest["artifacts"]["cubin"])
        return (ptx, cubin) if cubin else None

    def _blob(self, name: str) -> bytes | None:
        try:
            return self.store.read_blob(name)
        except (CorruptBlob, OSError):
            return None  # made again, as if never stored


def record(store: Store, project: str, arch: str, artifacts, hashes: dict) -> None:
    """Record a committed target's PTX and cubin (`hashes`, already stored) under each
    cutoff key its compile or link computed that the store does not hold yet."""
    for key in artifacts.outputs:
        if store.has_entry(key):
            continue
        store.commit(key, {"kind": OUTPUT_KIND, "arch": arch, "entry": artifacts.entry,
                           "artifacts": {"ptx": hashes["ptx"], "cubin": hashes["cubin"]},
                           "project": project,
                           "built_at": built_now()},
                     push=False)
