"""`kbuild export` / `kbuild import`: a store's entries as one verified archive.

An archive is a tar file (gzip-compressed when its name ends in .gz or .tgz)
holding ``v1/entries/<key>.json`` and ``v1/blobs/<hash>`` members and
nothing else. Import reads the members one header at a time with `tarread`
(never tarfile: a pax header or GNU long name is bounded before it is read) and
checks each name, kind and declared size before reading its data (no absolute
paths, no ``..``, no links, devices or sparse files, no newline in a name,
nothing above the size limits), so a gzip bomb is refused at its header instead
of being inflated.
It then verifies every blob against its hash, every manifest against its
schema and its artifacts (PTX/cubin agree with the manifest's arch and entry),
and, with a signing key set, every manifest's signature; it writes blobs
first and manifests last, and is idempotent. Nothing is imported unless all
of it is good.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from pathlib import Path

from ..errors import KbuildError
from ..keying.encode import digest
from . import tarread
from .local import LAYOUT, MAX_BLOB, Store
from .manifest import MAX_JSON_BYTES, EntryProblem, parse_manifest
from .signing import sign, signature_problem, signing_key
from .tarread import Member, TarProblem, TarReader

_MEMBER = re.compile(rf"\A{LAYOUT}/(entries/(?P<key>[0-9a-f]{{32}})\.json|"
                     rf"blobs/(?P<blob>[0-9a-f]{{32}}))\Z")
MAX_MEMBER = MAX_BLOB  # bytes one member may declare; a member of exactly this is accepted
MAX_TOTAL = 1 << 30  # bytes all members together may declare
MAX_MEMBERS = 100_000
_KEY_FROM_ENV = object()


class ArchiveError(KbuildError):
    """An archive that is unsafe or malformed; nothing was imported."""


def export_archive(store: Store, keys, path: Path, key=_KEY_FROM_ENV) -> dict:
    """Write the entries `keys` (and the blobs they name) to the archive at `path`, each
    manifest signed with `key` (default: $KBUILD_SIGNING_KEY; None: unsigned)."""
    key = signing_key() if key is _KEY_FROM_ENV else key
    path = Path(path)
    if not path.parent.is_dir():
        raise ArchiveError(f"cannot write {path}: folder {path.parent} does not exist; "
                           "create it first or name another path")
    partial = path.with_name(path.name + ".partial")
    try:
        counts = _write_archive(store, keys, partial, path.name.endswith((".gz", ".tgz")), key)
        os.replace(partial, path)  # no half-written archive under the name asked for
    except OSError as exc:
        raise ArchiveError(f"cannot write {path} ({exc.strerror or exc}); "
                           "name a writable path") from None
    finally:
        partial.unlink(missing_ok=True)
    return dict(counts, bytes=path.stat().st_size, file=str(path))


def _write_archive(store: Store, keys, path: Path, gzip: bool, signing) -> dict:
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
            text = json.dumps(sign(manifest, signing), sort_keys=True, indent=1).encode()
            _add(tar, f"{LAYOUT}/entries/{key}.json", text)
            entries += 1
    return {"entries": entries, "blobs": blobs}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def import_archive(store: Store, path: Path, key=_KEY_FROM_ENV) -> dict:
    """Merge a verified archive into `store`; returns counts of what was new. With a signing
    `key` (default: $KBUILD_SIGNING_KEY), only entries signed with it are accepted."""
    key = signing_key() if key is _KEY_FROM_ENV else key
    blobs, texts = _read_members(path)
    manifests = {}
    for entry_key, text in sorted(texts.items()):
        try:
            manifest = parse_manifest(entry_key, text)
        except EntryProblem as exc:
            raise ArchiveError(f"{path}: entry {entry_key} is invalid ({exc}); "
                               "nothing was imported") from None
        problem = signature_problem(manifest, key) or _blobs_problem(store, manifest, blobs)
        if problem:
            raise ArchiveError(f"{path}: entry {entry_key} ({str(manifest.get('target'))[:80]}) "
                               f"is refused: {problem}; nothing was imported")
        manifests[entry_key] = manifest
    return _merge(store, blobs, manifests)


def _blobs_problem(store: Store, manifest: dict, blobs: dict) -> str | None:
    missing = [b for b in manifest["artifacts"].values()
               if b not in blobs and not store.has_blob(b)]
    if missing:
        return f"it names blob {missing[0]}, which is neither in the archive nor in the store"
    return store.artifacts_problem(manifest, blobs)


def _read_members(path) -> tuple[dict, dict]:
    """(blob name -> verified bytes, entry key -> manifest text). Headers are read by
    `tarread` (extended headers bounded before they are read, pax records in one pass),
    and each member's name, kind and declared size are checked before its data is read."""
    try:
        fh = open(Path(path), "rb")
    except OSError as exc:
        raise ArchiveError(f"{path}: not a readable tar archive ({exc.strerror or exc})") \
            from None
    blobs, texts, total = {}, {}, 0
    try:
        with fh:
            reader = TarReader(tarread.opened(fh))
            for count, member in enumerate(reader, 1):
                _check_member(path, member)
                total += member.size
                if count > MAX_MEMBERS:
                    raise ArchiveError(f"{path}: the archive holds more than {MAX_MEMBERS} "
                                       "members; nothing was imported")
                if total > MAX_TOTAL:
                    raise ArchiveError(f"{path}: the archive declares more than {MAX_TOTAL} "
                                       "bytes; nothing was imported")
                _take(path, member, reader.read(member), blobs, texts)
    except TarProblem as exc:
        what = "not a readable tar archive" if exc.unreadable else "the archive is damaged"
        raise ArchiveError(f"{path}: {what} ({exc}); nothing was imported") from None
    except tarread.DAMAGE as exc:
        raise ArchiveError(f"{path}: the archive is damaged ({exc}); nothing was imported") \
            from None
    return blobs, texts


def _take(path, member: Member, data: bytes, blobs: dict, texts: dict) -> None:
    match = _MEMBER.match(member.name)
    if match["blob"]:
        if digest(data) != match["blob"]:
            raise ArchiveError(f"{path}: blob {match['blob']} does not match its hash")
        blobs[match["blob"]] = data
    else:
        try:
            texts[match["key"]] = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ArchiveError(f"{path}: entry {match['key']} is not UTF-8 text; "
                               "nothing was imported") from None


def _merge(store: Store, blobs: dict, manifests: dict) -> dict:
    store.ensure_writable()
    new_blobs = sum(not store.has_blob(name) for name in blobs)
    for data in blobs.values():
        store.put_blob(data)
    new_entries = 0
    for key, manifest in sorted(manifests.items()):
        if store.lookup(key) is None:
            store.commit(key, {k: v for k, v in manifest.items() if k not in ("schema", "key")},
                         push=False)
            new_entries += 1
    return {"entries": len(manifests), "new_entries": new_entries,
            "blobs": len(blobs), "new_blobs": new_blobs}


def _check_member(path, member: Member) -> None:
    name = member.name
    shown = ascii(name)[1:-1][:120]
    if name.startswith("/") or ".." in name.split("/"):
        raise ArchiveError(f"{path}: refusing member '{shown}' (absolute or '..' path); "
                           "nothing was imported")
    if member.kind != "file":
        raise ArchiveError(f"{path}: refusing member '{shown}' (a {member.kind}, not a regular "
                           "file: links, devices, directories and sparse files are not "
                           "allowed); nothing was imported")
    if not _MEMBER.match(name):
        raise ArchiveError(f"{path}: unexpected member '{shown}'; nothing was imported")
    limit = MAX_JSON_BYTES if name.endswith(".json") else MAX_MEMBER
    if member.size > limit:
        raise ArchiveError(f"{path}: member '{shown}' declares {member.size} bytes, more than "
                           f"the {limit} allowed; nothing was imported")
