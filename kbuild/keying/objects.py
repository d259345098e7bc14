"""Separately compiled objects and link recipes (pure: no I/O, no numba).

A target is linked (nvJitLink, link-time optimisation) from LTO-IR objects:
its kernel's own object, and one object per (device function, argument
types) it reaches. Each object is keyed by its function's *own* tree
(`tree.own_digest`: callees by identity, not by body), so editing a device
function changes the objects of that function only; every caller's object
is reused and relinked with the new one.

Reuse is safe because an object records its interface: the symbols it
defines (with the return type numba inferred) and the symbols it calls
(with the argument and return types it was compiled against). A recipe
only links objects whose imports are all met by exports with the same
types; otherwise the target is compiled again.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import made
from .encode import digest_of
from .tree import KEY_SCHEMA, KeyNode, LabelKind, own_digest

# Target inputs an object depends on besides its function; kernel options that reach NVVM.
# A target built for one launch configuration (keying/launch.py) may have callees typed
# for it: their objects are that launch's too.
_CONTEXT = (LabelKind.ARCH, LabelKind.TOOLCHAIN, LabelKind.CONFIG, LabelKind.LAUNCH)
_NVVM_OPTIONS = (LabelKind.OPTION.label("fastmath"), LabelKind.OPTION.label("opt"))


def kernel_node(target: KeyNode) -> KeyNode:
    (node,) = [k for k in target.children if k.kind is LabelKind.KERNEL]
    return node


def kernel_object_key(target: KeyNode) -> str:
    """The key of a target's kernel object: the target tree, the kernel by its own digest."""
    inner = tuple((k.label, own_digest(k) if k.kind is LabelKind.KERNEL else k.digest)
                  for k in target.children)
    return digest_of(("kernel-object", KEY_SCHEMA, inner))


def link_context(target: KeyNode) -> str:
    """What a device function's object shares with the kernel that links it: the arch,
    the toolchain, numba's codegen config and the kernel's NVVM options (numba compiles
    callees with the kernel's options)."""
    shared = [(k.label, k.digest) for k in target.children if k.kind in _CONTEXT]
    shared += [(k.label, k.digest) for k in kernel_node(target).children
               if k.label in _NVVM_OPTIONS]
    return digest_of(("link-context", KEY_SCHEMA, tuple(shared)))


def device_object_key(node: KeyNode, argtypes: str, context: str) -> str:
    """The key of a device function's object for argument types `argtypes` (a digest)."""
    return digest_of(("device-object", KEY_SCHEMA, own_digest(node), argtypes, context))


@dataclass(frozen=True)
class Import:
    """A call out of an object: the symbol, whose function it is, and the types compiled against."""

    symbol: str
    ident: str
    argtypes: str
    restype: str

    def as_json(self) -> list:
        return [self.symbol, self.ident, self.argtypes, self.restype]

    @classmethod
    def from_json(cls, item) -> Import:
        return cls(*item)


def interface(manifest: dict) -> tuple:
    """What an object's bytes were compiled against beyond its key: the symbols it
    defines and calls, with their types (a callee's return type is not in the caller's
    key: it is known only once the callee is typed), and a kernel object's entry.

    Two objects under one key with other interfaces are other code: the one stored
    is replaced by the newer, and never reused for a compile of the other."""
    return tuple((name, manifest.get(name)) for name in ("exports", "imports", "entry",
                                                         "cooperative"))


@dataclass(frozen=True)
class Recipe:
    """The objects to link for one target, kernel object first: (object key, LTO-IR blob)."""

    objects: tuple
    entry: str  # the kernel's symbol
    cooperative: bool
    flags: tuple = ()  # the kernel's float flags for the link (nvJitLink options)
    lto: bool = False  # the kernel's lto option: how numba makes its cubin (`lto.cubin_of`)


@dataclass(frozen=True)
class Unresolved:
    """Why a target cannot be relinked; `missing` names an object no build has made yet."""

    reason: str
    missing: tuple | None = None  # (ident, argtypes digest)


def resolve(target: KeyNode, nodes_by_ident: dict, lookup) -> Recipe | Unresolved:
    """The link recipe of `target` from stored objects, or why there is none.

    `lookup(key)` returns an object's manifest or None; `nodes_by_ident` maps a
    device function's identity to its current function trees (one per set of options
    the function is jitted with): the one whose stored object exports the symbol the
    import names is linked.
    """
    first = kernel_object_key(target)
    manifest = lookup(first)
    if manifest is None:
        return Unresolved("the kernel's own object is not stored")
    if made.stored_fills(manifest) is not None:
        # Its compile filled state later compiles read: linked (or waiting for a callee's
        # new object) its compile-time code would not run before theirs. Compiled.
        return Unresolved("its compile fills state later compiles read")
    context = link_context(target)
    found = {first: manifest}
    pending = list(manifest.get("imports", ()))
    while pending:
        imp = Import.from_json(pending.pop())
        nodes = nodes_by_ident.get(imp.ident, ())
        if not nodes:
            return Unresolved(f"callee {imp.ident} is no longer reached")
        stored = {}
        for node in nodes:
            key = device_object_key(node, imp.argtypes, context)
            stored[key] = found[key] if key in found else lookup(key)
        exporting = [k for k, m in stored.items()
                     if m is not None and [imp.symbol, imp.restype] in m.get("exports", ())]
        if not exporting:
            if all(m is None for m in stored.values()):
                return Unresolved(f"callee {imp.ident} changed", (imp.ident, imp.argtypes))
            return Unresolved(f"the interface of callee {imp.ident} changed")
        key = exporting[0]
        if key not in found:
            found[key] = stored[key]
            pending += found[key].get("imports", ())
    blobs = {key: found[key]["artifacts"]["ltoir"] for key in found}
    ordered = tuple((key, blobs[key]) for key in link_order(first, blobs))
    return Recipe(ordered, manifest["entry"], bool(manifest["cooperative"]),
                  tuple(manifest.get("link_flags", ())), bool(manifest.get("lto", False)))


def link_order(first: str, blobs: dict) -> list:
    """The objects' keys in link order, from key -> the digest of the object's LTO-IR:
    the kernel object first, then the others by their bytes' digest (then key). One order
    however the objects were made or found (the linked bytes depend on it), and the same
    for the same bytes under other keys: an edit that recompiles a device function into
    the bytes it had links as before (early cutoff, see `cutoff`)."""
    return [first] + sorted((k for k in blobs if k != first), key=lambda k: (blobs[k], k))
