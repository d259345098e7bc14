"""The ledger: what a store verified in this process, for the journal (`direct`)."""

from __future__ import annotations

from ..keying.encode import digest
from . import tree
from .layout import LAYOUT, blob_relpath, entry_relpath

LEDGER_FIELDS = ("target", "signature", "arch", "launch", "kind", "artifacts", "built_at")


class Ledger:
    """The entries and blobs a store verified (read and checked, or wrote) in this process,
    each with the identity (`tree.identity`) of the file that held them then: what the
    journal (`direct`) records, so that a later process that finds the same files can
    trust them without reading them again.

    `entries`: key -> (store-relative path, identity, digest of the file's bytes, what the
    manifest says of its target: `LEDGER_FIELDS`); `blobs`: name -> (store-relative path,
    identity).
    """

    def __init__(self):
        self.entries: dict = {}
        self.blobs: dict = {}

    def entry(self, key: str, info, text: str, manifest: dict) -> None:
        rel = f"{LAYOUT}/{entry_relpath(key)}"
        said = {k: manifest[k] for k in LEDGER_FIELDS if k in manifest}
        self.entries[key] = (rel, tree.identity(info), digest(text.encode("utf-8")), said)

    def blob(self, name: str, info) -> None:
        if info is not None:
            self.blobs[name] = (f"{LAYOUT}/{blob_relpath(name)}", tree.identity(info))
