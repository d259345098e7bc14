"""A package's modules as Python's import system would resolve them, without importing them.

A bundle (see `bundle`) is fresh while the code Python would import for the kernels'
packages is the code that was built. A walk over the files in a package folder is not
that: `kbdemo/kernels/__init__.py` added beside `kbdemo/kernels.py` makes Python import
the folder, a `.pth` can put another copy of the package first on `sys.path`, a
namespace package spans several folders, an extension module wins over a `.py` of the
same name. So each module is resolved here the way `import` resolves it: every finder
on `sys.meta_path` is asked in order, a top-level name with `path=None`, a submodule
with its parent package's search locations. Nothing is executed: no module, and no
parent package, is imported.

For each module found, `Sources` holds the digest of the bytes of the file the
resolution names and that file's path relative to the folder it was found in
(`kernels.py`, `kernels/__init__.py`, `kbdemo/__init__.py` for a top-level package):
relocatable, and different whenever another file would be imported. The modules are
the top-level ones asked for and, inside packages, every name their folders could
import (module files and subfolders that hold modules), so a module added to a
package counts too.
"""

from __future__ import annotations

import importlib.machinery
import pkgutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .keying.encode import digest

NAMESPACE = "(namespace)"  # the origin of a namespace package: folders, no file


@dataclass
class Sources:
    """module name -> digest of its file's bytes, and -> its file relative to where found."""

    digests: dict = field(default_factory=dict)
    origins: dict = field(default_factory=dict)


def package_sources(top_names) -> Sources:
    """The modules of the top-level packages (or modules) `top_names`, resolved."""
    found = Sources()
    for top in sorted(set(top_names)):
        _visit(top, None, found)
    return found


def _visit(name: str, locations, found: Sources) -> bool:
    """Resolve `name` (searched in `locations`: its parent's, or None for sys.path) into
    `found`, and its submodules when it is a package; whether it holds any module."""
    spec = find_spec(name, locations)
    if spec is None:
        return False
    children = list(spec.submodule_search_locations or ())
    held = False
    for child in _candidates(children):
        held |= _visit(f"{name}.{child}", children, found)
    if _namespace(spec):
        if not held:
            return False  # a folder with no module in it (data, __pycache__): not code
        found.digests[name], found.origins[name] = digest(b""), NAMESPACE
        return True
    origin = Path(spec.origin)
    found.digests[name] = digest(origin.read_bytes())
    found.origins[name] = _relative(origin, name)
    return True


def find_spec(name: str, locations):
    """The spec the import system would find for `name` now (every `sys.meta_path`
    finder asked in order, as `import` does), without importing it or its parents."""
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder:
            spec = _path_spec(name, sys.path if locations is None else locations)
        else:
            find = getattr(finder, "find_spec", None)
            try:
                spec = find(name, locations) if find is not None else None
            except (ImportError, OSError, ValueError, KeyError):
                spec = None  # a finder that needs the parent imported: not its module
        if spec is not None:
            return spec
    return None


def _path_spec(name: str, locations):
    """What `PathFinder` finds for `name` in `locations`: the first entry's module or
    package, else a namespace package of every entry's portion. Done with each entry's
    own finder (`sys.path_hooks`), as PathFinder does, but without the namespace path
    object PathFinder makes, which reads the parent package from sys.modules."""
    portions = []
    for entry in locations:
        finder = pkgutil.get_importer(str(entry))
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name)
        except (ImportError, OSError, ValueError):
            continue
        if spec is None:
            continue
        if spec.loader is not None:
            return spec
        portions += list(spec.submodule_search_locations or ())
    if not portions:
        return None
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = portions
    return spec


def _namespace(spec) -> bool:
    return spec.origin in (None, "namespace") or not spec.has_location


def _candidates(locations) -> list:
    """Names a package's folders could import: module files by any import suffix, and
    subfolders (packages, or namespace packages if they hold modules)."""
    suffixes = sorted(importlib.machinery.all_suffixes(), key=len, reverse=True)
    names = set()
    for folder in locations:
        try:
            entries = list(Path(folder).iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir():
                stem = entry.name
            else:
                stem = next((entry.name[:-len(s)] for s in suffixes if entry.name.endswith(s)),
                            "")
            if stem.isidentifier() and stem != "__init__":  # the package's own file
                names.add(stem)
    return sorted(names)


def _relative(origin: Path, name: str) -> str:
    """`origin` relative to the folder the import system found module `name` in (posix):
    `kernels.py`, `kernels/__init__.py`, `kbdemo/__init__.py`. It is read off the name,
    never measured from a `sys.path` entry that merely contains the file: a program run
    from the folder that holds its venv has that folder first on sys.path, and every
    installed module would seem to lie at `.venv/lib/.../site-packages/kbdemo/...`."""
    last = name.rpartition(".")[2]
    if origin.name.startswith("__init__.") and origin.parent.name == last:
        return f"{last}/{origin.name}"
    return origin.name
