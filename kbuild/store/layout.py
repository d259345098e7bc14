"""Where things live in a store, and whose folder may become one.

The layout (the version is in the path; an unknown layout is never read)::

    STORE/CACHEDIR.TAG
    STORE/v1/blobs/ab/cd/<xxh3-128 of the bytes>
    STORE/v1/entries/ab/<target key>.json
    STORE/v1/locks/  STORE/v1/tmp/  STORE/v1/facts/  STORE/v1/failures/ (see `failures`)

The same relative paths name a blob or an entry in a file:// or object-store remote.
`store_root_problem` decides whether a folder is kbuild's to write; `atomic_write`
writes kbuild's files beside a store's own writes the same way (`tree.write_atomic`).
"""

from __future__ import annotations

import os
from pathlib import Path

from . import tree

LAYOUT = "v1"
MAX_BLOB = 256 << 20  # a blob whose entry records no size is read up to this
_CACHEDIR_TAG = (b"Signature: 8a477f597d28d172789f06886806bc55\n"
                 b"# This file is a cache directory tag created by kbuild.\n"
                 b"# For information about cache directory tags see https://bford.info/cachedir/\n")


def blob_relpath(name: str) -> str:
    """Where a blob lives under the layout folder (here and in a remote tier)."""
    return f"blobs/{name[:2]}/{name[2:4]}/{name}"


def entry_relpath(key: str) -> str:
    """Where an entry's manifest lives under the layout folder (here and in a remote tier)."""
    return f"entries/{key[:2]}/{key}.json"


def store_root_problem(root: Path, home: Path | None = None) -> str | None:
    """Why kbuild must not make or change a store at `root`, else None.

    A store is made in a folder kbuild creates, or an empty one; it is used where kbuild's
    marker is (see `_marked`).
    The file system's root and the home directory are never a store, and neither is a
    folder holding other files: `store = ".."` or `--store ~` would put CACHEDIR.TAG there
    (backup tools then skip the whole folder), and gc or clean would delete in it.
    """
    home = Path.home() if home is None else Path(home)
    try:
        resolved = Path(root).resolve()
        if resolved == Path(resolved.anchor):
            return "it is the file system's root"
        if resolved == home.resolve():
            return "it is the home directory"
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError, RuntimeError):
        return None  # made fresh (or refused by check_root / the writes, with their message)
    except OSError as exc:
        return f"it cannot be read: {exc.strerror or exc}"
    if _marked(Path(root), names):
        return None
    return "it holds other files and no kbuild store marker"


def _marked(root: Path, names) -> bool:
    """Whether `root` is empty or kbuild's: it holds kbuild's CACHEDIR.TAG, or nothing but
    the layout folder (a first build stopped before the tag), or the layout's entries (a
    store older than the tag)."""
    if not names or (names == [LAYOUT] and tree.plain_dir(root, LAYOUT)):
        return True
    try:
        tag, _ = tree.read_file(root, "CACHEDIR.TAG", 4096)
    except OSError:
        tag = b""
    return (tag.startswith(_CACHEDIR_TAG.split(b"\n", 1)[0]) and b"created by kbuild" in tag) \
        or tree.plain_dir(root, f"{LAYOUT}/entries")


def _regular(info) -> bool:
    return info is not None and (info.st_mode & 0o170000) == 0o100000


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def atomic_write(path: Path, data: bytes, tmp_dir: Path, prefix: str | None = None, *,
                 root: Path | None = None) -> None:
    """Write via a temp file in `tmp_dir` (same file system; named `prefix`..., default
    after `path`) and a rename: readers never see half a file. Missing folders are made.

    For kbuild's files outside a store's own writes (keying facts, a file:// remote).
    Like the store's files it goes through `tree.write_atomic`: every folder below
    `root` is opened without following a link, and a link there is refused (NotPlain,
    an OSError), never written through nor replaced. `root` defaults to the folder that
    holds the layout folder (`LAYOUT`) on `path` (a store's or a remote's root: the
    user's choice, which may be a link), else `path`'s own folder.

    No fsync: a process killed mid-write leaves only a temp file, and what a power loss
    could tear is caught on read (blobs are verified against their names, manifests
    validated) and rebuilt. An fsync per file cost a 64-kernel build about 0.6 s.
    """
    path, tmp_dir = Path(path), Path(tmp_dir)
    if root is None:
        layout = [i for i, part in enumerate(path.parts[:-1]) if part == LAYOUT]
        root = Path(*path.parts[:layout[-1]]) if layout else path.parent
    rel, tmp = path.relative_to(root).as_posix(), tmp_dir.relative_to(root).as_posix()
    tmp = "" if tmp == "." else tmp
    try:
        tree.write_atomic(root, rel, data, tmp, 0o666 & ~_umask(), prefix=prefix, replace=False)
    except FileNotFoundError:  # the first file under a root not made yet
        root.mkdir(parents=True, exist_ok=True)
        tree.write_atomic(root, rel, data, tmp, 0o666 & ~_umask(), prefix=prefix, replace=False)
