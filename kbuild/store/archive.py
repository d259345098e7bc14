"""`kbuild export` / `kbuild import`: a store's entries as one verified archive.

An archive is a tar file (gzip-compressed when its name ends in .gz or .tgz)
holding ``v1/entries/<key>.json`` and ``v1/blobs/<hash>`` members and
nothing else. Import checks every member's name and kind before reading any
of them (no absolute paths, no ``..``, no links or devices), verifies every
blob against its hash and every manifest against its schema, writes blobs
first and manifests last, and is idempotent.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from pathlib import Path

from ..keying.encode import digest
from ..errors import KbuildError
from .local import LAYOUT, Store, _manifest_problem

_MEMBER = re.compile(rf"^{LAYOUT}/(entries/(?P<key>[0-9a-f]{{32}})\.json|blobs/(?P<blob>[0-9a-f]{{32}}))$")
_MAX_MEMBER = 1 << 30


class ArchiveError(KbuildError):
    """An archive that is unsafe or malformed; nothing was imported."""


def export_archive(store: Store, keys, path: Path) -> dict:
    """Write the entries `keys` (and the blobs they name) to the archive at `path`."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    try:
        counts = _write_archive(store, keys, partial, path.name.endswith((".gz", ".tgz")))
        os.replace(partial, path)  # no half-written archive under the name asked for
    finally:
        partial.unlink(missing_ok=True)
    return dict(counts, bytes=path.stat().st_size, file=str(path))


def _write_archive(store: Store, keys, path: Path, gzip: bool) -> dict:
    entries = blobs = 0
    names = set()
    with tarfile.open(path, "w:gz" if gzip else "w") as tar:
        for key in sorted(set(keys)):
            manifest = store.lookup(key)
            if manifest is None:
                raise ArchiveError(f"cannot export {key}: not in store {store.root}; "
                                   "run `kbuild build` first")
            for name in sorted(set(manifest["artifacts"].values()) - names):
                _add(tar, f"{LAYOUT}/blobs/{name}", store.read_blob(name))
                names.add(name)
                blobs += 1
            text = json.dumps(manifest, sort_keys=True, indent=1).encode()
            _add(tar, f"{LAYOUT}/entries/{key}.json", text)
            entries += 1
    return {"entries": entries, "blobs": blobs}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def import_archive(store: Store, path: Path) -> dict:
    """Merge a verified archive into `store`; returns counts of what was new."""
    try:
        tar = tarfile.open(Path(path), "r:*")
    except (OSError, tarfile.TarError) as exc:
        raise ArchiveError(f"{path}: not a readable tar archive ({exc})") from None
    with tar:
        members = tar.getmembers()
        for member in members:
            _check_member(path, member)
        blobs, manifests = {}, {}
        for member in members:
            match = _MEMBER.match(member.name)
            data = tar.extractfile(member).read()
            if match["blob"]:
                if digest(data) != match["blob"]:
                    raise ArchiveError(f"{path}: blob {match['blob']} does not match its hash")
                blobs[match["blob"]] = data
            else:
                manifests[match["key"]] = data.decode("utf-8", "replace")
    for key, text in manifests.items():
        problem = _manifest_problem(key, text)
        if problem:
            raise ArchiveError(f"{path}: entry {key} is invalid ({problem})")
        missing = [b for b in json.loads(text)["artifacts"].values()
                   if b not in blobs and not store.has_blob(b)]
        if missing:
            raise ArchiveError(f"{path}: entry {key} names blob {missing[0]}, "
                               "which is neither in the archive nor in the store")
    return _merge(store, blobs, manifests)


def _merge(store: Store, blobs: dict, manifests: dict) -> dict:
    store.ensure_writable()
    new_blobs = sum(not store.has_blob(name) for name in blobs)
    for data in blobs.values():
        store.put_blob(data)
    new_entries = 0
    for key, text in sorted(manifests.items()):
        if store.lookup(key) is None:
            manifest = json.loads(text)
            store.commit(key, {k: v for k, v in manifest.items() if k not in ("schema", "key")})
            new_entries += 1
    return {"entries": len(manifests), "new_entries": new_entries,
            "blobs": len(blobs), "new_blobs": new_blobs}


def _check_member(path, member: tarfile.TarInfo) -> None:
    name = member.name
    if name.startswith("/") or ".." in name.split("/"):
        raise ArchiveError(f"{path}: refusing member '{name}' (absolute or '..' path); "
                           "nothing was imported")
    if not member.isfile():
        raise ArchiveError(f"{path}: refusing member '{name}' (not a regular file: links, "
                           "devices and directories are not allowed); nothing was imported")
    if not _MEMBER.match(name):
        raise ArchiveError(f"{path}: unexpected member '{name}'; nothing was imported")
    if member.size > _MAX_MEMBER:
        raise ArchiveError(f"{path}: member '{name}' is larger than 1 GiB")
