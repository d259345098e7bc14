"""Storage: the local store and the remote tier behind it, opened in one call.

As ccache's `Storage` holds its local storage and its remote storages, a `Storage`
is the local store (`local.Store`, which knows nothing of remotes) plus the tier
built from the remote's settings (`remote.RemoteTier`, over one backend of
`remotes/`). The tier logic is here, once: a local miss is asked of the remote and a
verified hit is written here (blobs first, manifest last) before it is used; an entry
committed here is pushed. The tier only fetches, verifies and sends bytes.
`push_entries` seeds the remote with entries the store holds (`kbuild push`).

Every entry point opens its store with `open_storage`: the CLI, zero-config, and
`Project.load` (a dask worker opens none: only the build's own process writes).
"""

from __future__ import annotations

import json

from .local import Store
from .manifest import is_object
from .remote import open_remote
from .remote_settings import RemoteSettings

__all__ = ["Storage", "open_storage", "push_entries"]


class Storage(Store):
    """A local store at `root` and the remote `remote` names (None: none). `remote` is the
    tier (a `remote.RemoteTier`, or None); it says its problems into this store's
    `warnings`. A ConfigError for a remote URL no backend takes (nothing contacted)."""

    def __init__(self, root, *, read_only: bool = False, remote: RemoteSettings | None = None):
        super().__init__(root, read_only=read_only)
        self.remote = open_remote(remote, self.warnings)

    def lookup(self, key: str, expect: dict | None = None, *, remote: bool = True) -> dict | None:
        """The local store's `lookup`; on a miss (unless `remote` is false, or the store is
        read-only: a hit could not be kept), the remote's verified entry, written here
        first."""
        manifest = super().lookup(key, expect)
        if manifest is None and remote and self.remote is not None and not self.read_only:
            manifest = self._fill(key, expect)
        return manifest

    def _fill(self, key: str, expect: dict | None) -> dict | None:
        found = self.remote.fetch(key, expect, self.artifacts_problem)
        if found is None:
            return None
        manifest, blobs = found
        self.ensure_writable()
        for data in blobs.values():
            self.put_blob(data)
        super().commit(key, {k: v for k, v in manifest.items() if k not in ("schema", "key")})
        return manifest

    def commit(self, key: str, manifest: dict, *, push: bool = True) -> str:
        """The local store's `commit`, then (unless `push` is false) the entry sent to the
        remote; the text written."""
        text = super().commit(key, manifest)
        if push and self.remote is not None and self.remote.writable:
            self.remote.push(key, text, entry_blobs(self, manifest))
        return text

    def push(self, key: str) -> bool:
        """Send the entry `key` this store holds, after its blobs (read back verified), to
        the remote; whether it was sent."""
        if self.remote is None or not self.remote.writable:
            return False
        text = self.entry_path(key).read_text()
        return self.remote.push(key, text, entry_blobs(self, json.loads(text)))

    def tier_counts(self) -> dict:
        """The remote's counts since the last call (`remote_*` fields), {} without one."""
        return {} if self.remote is None else self.remote.take_counts()


def open_storage(root, *, read_only: bool = False, remote: RemoteSettings | None = None) -> Storage:
    """The store at `root` with the remote `remote` names behind it: how every entry point
    opens its store."""
    return Storage(root, read_only=read_only, remote=remote)


def entry_blobs(store, manifest: dict) -> dict:
    """name -> bytes of every blob `manifest` names, read from `store` verified: what a push
    sends before the manifest."""
    return {name: store.read_blob(name) for name in sorted(set(manifest["artifacts"].values()))}


def push_entries(storage, keys) -> dict:
    """Seed the remote of `storage` (a `Storage`) with its entries `keys` and the
    objects they link from (ccache's --reshare): each as a build's write-back sends it,
    signed when a key is set. Counts of what was sent and of `keys` the store lacks; stops
    at the remote's first failure (`tier.down`)."""
    tier = storage.remote
    sent, missing, queue, seen = {"entries": 0, "objects": 0}, [], list(keys), set()
    while queue and not tier.down:
        key = queue.pop(0)
        if key in seen:
            continue
        seen.add(key)
        manifest = storage.lookup(key, remote=False)
        if manifest is None:
            missing.append(key)
            continue
        if storage.push(key):
            sent["objects" if is_object(manifest) else "entries"] += 1
        queue += [k for k in (manifest.get("link") or {}).get("objects", ())
                  if isinstance(k, str)]
    counts = tier.take_counts()
    return dict(sent, missing=len(missing), missing_keys=missing, down=tier.down,
                bytes=counts["remote_bytes_pushed"])
