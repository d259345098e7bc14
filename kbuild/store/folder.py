"""One store directory: whose it is, its layout, its locks, and every change below it.

Before anything is read, the folders are checked to be the user's (`trust`); before
anything is created or removed, the root is checked to be kbuild's to write (`claim`).
Every write below the root is atomic (a temp file in `v1/tmp`, then a rename) and every
removal goes through `tree` (never through a link); a store that cannot be changed
keeps what it holds and says so once. The blob shelf (`blobs`) and the entries
(`entries`) write and remove only through here.
"""

from __future__ import annotations

import errno
import fcntl
import tempfile
from pathlib import Path

from ..errors import StoreError
from . import tree
from .layout import _CACHEDIR_TAG, LAYOUT, _umask, store_root_problem
from .ledger import Ledger
from .locks import StoreLock
from .trust import check_owner

_LAYOUT_DIRS = ("blobs", "entries", "tmp")

__all__ = ["StoreFolder"]


class StoreFolder:
    """The store directory at `root`. `warnings` collects problems healed along the way;
    `ledger` (None until `keep_ledger` starts one) is told what the store verified or
    wrote."""

    ledger: Ledger | None = None

    def __init__(self, root, *, read_only: bool = False):
        self.root = Path(root)
        self.base = self.root / LAYOUT
        self.read_only = read_only
        self.warnings: list[str] = []
        self.lock = StoreLock(self.root)
        self.cannot_write: str | None = None  # why a change failed: none is tried again
        self._claimed = False  # the root was checked to be kbuild's to write
        self._trusted = False  # the root was checked to be the user's (see `trust`)

    # -- set-up -------------------------------------------------------------

    def check_root(self) -> None:
        """Fail at once, creating nothing, when the store path or a parent is not a directory."""
        for path in (self.root, *self.root.parents):
            if path.exists():
                if not path.is_dir():
                    raise StoreError(
                        f"store {self.root} is not writable ({path} is not a directory); "
                        "pass --store DIR or set KBUILD_STORE to a writable directory")
                return

    def trust(self) -> None:
        """Fail unless the store's folders are the user's or root's, or the user trusts
        them (`trust.check_owner`). Every read of an entry or a blob, and every write,
        passes here first; once per store object that finds them so."""
        if not self._trusted:
            check_owner(self.root, LAYOUT)
            self._trusted = self.root.exists()

    def claim(self) -> None:
        """Fail, creating nothing, unless the root is kbuild's to write: absent, empty, or
        marked as a store (see `store_root_problem`). Everything that creates or removes
        files in the store (a build, gc, clean, import, a remote's fill) passes here first."""
        self.trust()
        if self._claimed or self.read_only:
            return
        problem = store_root_problem(self.root)
        if problem:
            raise StoreError(f"store {self.root} is not kbuild's to write ({problem}); "
                             "use a fresh folder, or one that already has kbuild's "
                             "CACHEDIR.TAG, for --store, KBUILD_STORE or [project] store")
        self._claimed = True

    def exists(self) -> bool:
        """Whether the store has been made (its layout folder is there)."""
        return tree.plain_dir(self.root, LAYOUT)

    def ensure_writable(self) -> None:
        """Create the layout, or fail clearly before any compile work starts. A layout
        folder that is a link (or a file) is removed and made again: the tree is kbuild's."""
        self.claim()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for sub in _LAYOUT_DIRS:
                rel = f"{LAYOUT}/{sub}"
                if not tree.plain_dir(self.root, rel):
                    if tree.lstat(self.root, rel) is not None:
                        self.warnings.append(f"store {self.root}: {rel} was not a plain "
                                             "directory (a link?); replaced it")
                        tree.remove(self.root, rel)
                    with tree.opened_dir(self.root, rel.split("/"), create=True):
                        pass
            if tree.lstat(self.root, "CACHEDIR.TAG") is None:
                self.write("CACHEDIR.TAG", _CACHEDIR_TAG)
            probe = tempfile.NamedTemporaryFile(dir=self.base / "tmp", delete=True)
            probe.close()
        except OSError as exc:
            raise StoreError(
                f"store {self.root} is not writable ({exc.strerror or exc}); "
                "pass --store DIR or set KBUILD_STORE to a writable directory") from None

    def keep_ledger(self) -> Ledger:
        """The ledger of what this store verifies or writes from now on (started once)."""
        if self.ledger is None:
            self.ledger = Ledger()
        return self.ledger

    # -- locks --------------------------------------------------------------

    def shared(self):
        """Held by a build: gc and clean wait until it ends. A store that cannot be
        written has no lock file and needs none (gc cannot delete from it either)."""
        self.claim()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
        return self.lock.hold(fcntl.LOCK_SH, "the build", optional=True)

    def exclusive(self, what: str = "gc"):
        """Held by gc and clean: builds wait until it ends."""
        self.claim()
        return self.lock.hold(fcntl.LOCK_EX, what)

    # -- changes below the root ---------------------------------------------

    def subdirs(self, rel: str):
        """(name, stat) of the two-letter fan-out folders in root/rel, from its listing."""
        return [(n, i) for n, i in tree.listing(self.root, rel)
                if len(n) == 2 and (i.st_mode & 0o170000) == 0o040000]

    def touch(self, rel: str) -> None:
        """Set root/rel's time to now; a store that cannot be written is left as it is
        (and the first failure stops every later change)."""
        if not self.read_only and self.cannot_write is None:
            try:
                tree.touch(self.root, rel)
            except OSError as exc:
                self.cannot_write = exc.strerror or str(exc)

    def remove(self, rel: str) -> bool:
        """Remove root/rel (never through a link); a store that cannot be written keeps it,
        and says so once."""
        if self.read_only or self.cannot_write is not None:
            return False
        try:
            return tree.remove(self.root, rel)
        except OSError as exc:
            self.cannot_write = exc.strerror or str(exc)
            self.warnings.append(f"store {self.root} cannot be changed ({self.cannot_write}); "
                                 "damaged files are left in place")
            return False

    def write(self, rel: str, data: bytes) -> None:
        """Write root/rel atomically (a temp file in the store's tmp folder, then a rename)."""
        try:
            tree.write_atomic(self.root, rel, data, f"{LAYOUT}/tmp", 0o666 & ~_umask())
        except OSError as exc:
            hint = ("free some space or run `kbuild gc --max-size SIZE`"
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT) else
                    "pass --store DIR or set KBUILD_STORE to a writable directory")
            raise StoreError(f"cannot write to store {self.root} ({exc.strerror or exc}); "
                             f"{hint}") from None
