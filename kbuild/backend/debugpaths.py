"""Source paths in debug binaries: written against placeholders, put back at load.

A kernel built with `lineinfo=True` or `debug=True` names its source files in its PTX
(`.file 1 "/home/me/proj/lab/lines.py"`) and its cubin's line table, and so would a store
shared by two checkouts serve one checkout's binary to the other, whose debugger and
`compute-sanitizer` would then point into the first (keys leave paths out, so that stores
move between checkouts and machines). Instead, as gcc's `-fdebug-prefix-map` and
ccache's `base_dir` do, the compile writes every path under a known folder - one of the
project's import roots, or the toolchain's `site-packages` (numba's own code is compiled
into the kernel too) - against a fixed placeholder: `/kbuild-root-0/./././...`. The
bytes, and so the key, are the same in every checkout.

At load, `located` writes the folders of *this* checkout and toolchain back over the
placeholders, in place: each placeholder is `SLOT` bytes long and each folder is padded to
exactly that length with `/.` (`/home/me/proj/./././.` names the same folder), so no
offset in the PTX or the cubin's ELF sections moves. A folder longer than `SLOT` bytes
keeps its placeholder (the binary still loads; its debugger shows the placeholder).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

SLOT = 512  # bytes every placeholder (and every folder written over it) takes


def _padded(folder: str) -> str | None:
    """`folder` padded with `/.` to exactly SLOT bytes, as the file system spells it (a
    trailing `/` first when the parity needs it: `/a//./.` is `/a`), or None when it
    does not fit."""
    folder = folder.rstrip("/") or "/"
    room = SLOT - len(os.fsencode(folder))
    if room < 0:
        return None
    lead = "/" if room % 2 else ""
    return folder + lead + "/." * ((room - len(lead)) // 2)


@dataclass(frozen=True)
class PathMap:
    """Each known folder and its placeholder, longest folder first."""

    pairs: tuple  # ((real folder, placeholder), ...)

    def written(self, path: str) -> str:
        """`path` as a compile writes it into a binary: under its placeholder when it lies
        in a known folder, else as it is."""
        for real in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
            for folder, placeholder in self.pairs:
                for form in dict.fromkeys((folder, os.path.realpath(folder))):
                    form = form.rstrip("/")
                    if real == form or real.startswith(form + "/"):
                        return placeholder + real[len(form):]
        return path

    def located(self, binary: bytes) -> bytes:
        """`binary` with this checkout's folders written over the placeholders (same
        length: a cubin's ELF offsets and a PTX's lines stay as they are)."""
        if b"/kbuild-" not in binary:
            return binary
        for folder, placeholder in self.pairs:
            here = _padded(folder)
            if here is not None:
                # The file system's bytes: a checkout's path need not be valid UTF-8 (it
                # comes back from the OS as surrogate escapes, which .encode() refuses).
                binary = binary.replace(os.fsencode(placeholder), os.fsencode(here))
        return binary


def located(binary: bytes, roots) -> tuple[bytes, str]:
    """`binary` as a checkout (or program) whose import roots are `roots` loads it, and what
    it was located to: "" when it is the stored bytes, else the roots (modules loaded from
    it are cached under the blob's name and this, apart from other checkouts')."""
    found = path_map(roots).located(binary)
    return found, "" if found == binary else os.pathsep.join(map(str, roots))


@functools.lru_cache(maxsize=None)
def _placeholder(name: str) -> str:
    found = _padded(f"/kbuild-{name}")
    assert found is not None
    return found


def path_map(roots) -> PathMap:
    """The map for a project whose import roots are `roots` (in kbuild.toml's order) and
    for this process's toolchain (the folder numba-cuda is installed in): made once per
    process for the same roots, spelled the same, from the same working folder (a
    relative root is taken from it)."""
    return _path_map(tuple(str(root) for root in roots), os.getcwd())


@functools.lru_cache(maxsize=64)
def _path_map(roots: tuple, cwd: str) -> PathMap:
    pairs = [(os.path.abspath(str(root)), _placeholder(f"root-{i}"))
             for i, root in enumerate(roots)]
    try:
        import numba_cuda

        site = os.path.dirname(os.path.dirname(os.path.abspath(numba_cuda.__file__)))
        pairs.append((site, _placeholder("toolchain")))
    except ImportError:
        pass
    pairs.sort(key=lambda pair: len(pair[0]), reverse=True)
    return PathMap(tuple(pairs))
