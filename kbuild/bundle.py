"""Bundles: a project's built kernels as a read-only store inside a Python package.

`write_bundle` copies the entries and blobs of the current targets (the kernels, not
the separately compiled device-function objects: those are only needed to link) into
`DIR/store`, and writes `DIR/bundle.json`: what was built (targets, signatures, archs,
keys), with which toolchain, and for every module of the kernels' packages the digest of
the bytes of the file Python's import system resolves it to, and that file's relative
path (see `installed`). An installed package resolves its modules again and compares
(cheap: no numba import, no re-keying, nothing imported) before it trusts the keys;
see `packaged.py`. Blobs are content-addressed, so a PTX shared by two
targets is stored once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .errors import ConfigError, StoreError
from .installed import package_sources
from .store.local import Store
from .store.manifest import EntryProblem, load_json

BUNDLE_FORMAT = 1
MANIFEST_NAME = "bundle.json"
STORE_DIR = "store"
MAX_MANIFEST_BYTES = 16 << 20
# The fields an installed bundle is loaded from, and their JSON types (validated as a store
# entry is: a package is input like any other).
_LISTS = {"kernels": {"name": str, "signatures": list, "archs": list},
          "targets": {"target": str, "signature": str, "arch": str, "key": str}}


def write_bundle(project, dest_dir, archs=None) -> dict:
    """Write the bundle of `project`'s current targets into `dest_dir` (replacing one
    there); return a report: targets, blobs, bytes. Every target must be built."""
    dest = Path(dest_dir)
    the_plan = project.plan(None, archs)
    entries = {t: project.fresh_entry(the_plan, t) for t in the_plan.targets}
    missing = [t.label for t, manifest in entries.items() if manifest is None]
    if missing:
        raise StoreError(f"cannot bundle into {dest}: {len(missing)} target(s) not built in "
                         f"store {project.store.root} (first: {missing[0]}); "
                         "run `kbuild build` first")
    if (dest / STORE_DIR).exists():
        shutil.rmtree(dest / STORE_DIR)
    store = Store(dest / STORE_DIR)
    store.ensure_writable()
    targets = [_copy_target(project.store, store, t, entries[t]) for t in the_plan.targets]
    sources = module_sources(the_plan.kernels)
    if not sources.digests:
        raise StoreError(f"cannot bundle into {dest}: the kernels' packages "
                         f"({', '.join(sorted(the_plan.kernels))}) resolve to no source file")
    _prune(store)
    blobs, size = Store(dest / STORE_DIR, read_only=True).size()
    manifest = {
        "format": BUNDLE_FORMAT,
        "project": project.config.name,
        "archs": sorted({t.arch for t in the_plan.targets}),
        "kernels": [{"name": s.name, "signatures": list(s.signatures),
                     "archs": [a for a in (archs or s.archs)]}
                    for s in project.config.kernels],
        "targets": targets,
        "modules": sources.digests,
        "origins": sources.origins,
        "toolchain": _toolchain(),
    }
    (dest / MANIFEST_NAME).write_text(json.dumps(manifest, sort_keys=True, indent=1))
    return {"dir": str(dest), "targets": len(targets), "blobs": blobs, "bytes": size,
            "archs": manifest["archs"]}


def read_manifest(path: Path) -> dict:
    """The bundle manifest at `path`, bounded in size and depth and its schema checked;
    ConfigError naming the file and what is wrong."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_MANIFEST_BYTES + 1)
        manifest = load_json(data.decode("utf-8"), "it", MAX_MANIFEST_BYTES)
        problem = _manifest_problem(manifest)
    except OSError as exc:
        problem = f"it cannot be read: {exc.strerror or exc}"
    except UnicodeDecodeError:
        problem = "it is not UTF-8 text"
    except EntryProblem as exc:
        problem = str(exc)
    if problem:
        raise ConfigError(f"{path}: the bundle manifest is invalid ({problem}); reinstall the "
                          "package, or rebuild its wheel with this kbuild")
    return manifest


def _manifest_problem(manifest) -> str | None:
    if not isinstance(manifest, dict):
        return "not a JSON object"
    if manifest.get("format") != BUNDLE_FORMAT:
        return None  # said by the caller: another format, another kbuild
    if not isinstance(manifest.get("project"), str):
        return "project is not a string"
    if not _strings(manifest.get("archs")):
        return "archs is not a list of strings"
    for field in ("modules", "origins"):
        value = manifest.get(field, {})  # origins: bundles made before it was kept have none
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            return f"{field} is not an object of strings"
    if "modules" not in manifest:
        return "modules is missing"
    for field, shape in _LISTS.items():
        rows = manifest.get(field)
        if not isinstance(rows, list) or not all(
                isinstance(row, dict) and all(isinstance(row.get(k), t) for k, t in shape.items())
                for row in rows):
            return f"{field} is not a list of objects with {', '.join(shape)}"
    if not all(_strings(k["signatures"]) and _strings(k["archs"]) for k in manifest["kernels"]):
        return "a kernel's signatures or archs are not lists of strings"
    return None


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _copy_target(source: Store, dest: Store, target, manifest: dict) -> dict:
    """Copy the entry a launch uses (at its full key) with every blob it names."""
    key = manifest["key"]
    for name in sorted(set(manifest["artifacts"].values())):
        if dest.put_blob(source.read_blob(name)) != name:
            raise StoreError(f"internal error: blob {name} changed while bundling")
    dest.commit(key, manifest, push=False)
    return {"target": target.name, "signature": target.signature, "arch": target.arch,
            "key": key}


def _prune(store: Store) -> None:
    """Keep only entries and blobs: an index, a temp dir or a CACHEDIR.TAG (which would
    make backup tools skip the package) has no place in a wheel."""
    base = store.base
    for path in store.root.iterdir():
        if path != base:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for path in base.iterdir():
        if path.name not in ("blobs", "entries"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def module_sources(target_names):
    """The modules of the top-level packages that declare `target_names`, as the import
    system resolves them (`installed.Sources`: each one's file digest and relative path):
    a device function or a constant in a sibling module is as much a part of the kernels
    as their own module (numba #1833 is exactly that miss), and whichever file Python
    would import for a name is the one that counts."""
    return package_sources(name.partition(":")[0].partition(".")[0] for name in target_names)


def _toolchain():
    from .backend.backends import DEFAULT, get

    return json.loads(json.dumps(get(DEFAULT).toolchain(), default=str))
