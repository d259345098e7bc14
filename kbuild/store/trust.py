"""Whether a store folder is the user's to trust, as git's `safe.directory` and ssh decide.

Whoever owns a store's folders can replace an entry and its blobs together, each named by
the hash of its own bytes, and every check the store makes then passes: the forged cubin
is launched. So a store is used only when its root and layout folder belong to the user
running kbuild or to root (who could replace anything anyway; a package's bundled store
in a system site-packages is root's), or when the user has said to trust it:
`KBUILD_TRUSTED_STORES`, a list of folders (separated as PATH is), or `*` for any.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import StoreError

TRUST_ENV = "KBUILD_TRUSTED_STORES"


def owner_problem(root: Path, layout: str) -> str | None:
    """Why the store at `root` must not be used (a folder of it owned by another user),
    else None. Absent folders are made by this user, so nothing is wrong with them."""
    if not hasattr(os, "geteuid"):
        return None  # no POSIX owners to compare
    me = os.geteuid()
    for folder in (root, root / layout):
        try:
            owner = folder.stat().st_uid
        except OSError:
            continue
        if owner not in (me, 0):
            return f"{folder} is owned by another user (uid {owner})"
    return None


def trusted(root: Path) -> bool:
    """Whether the user named `root` (or every store) in KBUILD_TRUSTED_STORES."""
    listed = [p for p in os.environ.get(TRUST_ENV, "").split(os.pathsep) if p]
    if "*" in listed:
        return True
    try:
        here = root.resolve()
        return any(Path(p).expanduser().resolve() == here for p in listed)
    except (OSError, RuntimeError):
        return False


def check_owner(root: Path, layout: str) -> None:
    """StoreError unless the store at `root` is the user's (or trusted)."""
    problem = owner_problem(root, layout)
    if problem and not trusted(root):
        raise StoreError(f"store {root} is not trusted: {problem}, who could replace the "
                         f"binaries it holds; use a store of your own (--store, KBUILD_STORE), "
                         f"or trust this one: {TRUST_ENV}={root}")
