"""Target keys: a Merkle tree over everything a kernel's compiled code depends on.

This is the one documented place that lists what goes into a key
(schema `KEY_SCHEMA`). A target = kernel x signature x arch; its key is the
digest of a `KeyNode` tree, each node labelled by its `LabelKind`:

- ``kernel MOD:QUALNAME`` - the kernel function:
  - ``body``: its normalized AST (see `normalize`), positions only with lineinfo/debug,
    local names only with debug (a kernel's or device function's parameters by place:
    a call naming one is observed, `observed.Kind.PARAMETERS`), and its bytecode
    without positions, local names or docstring (what numba compiles; see `bytecode`);
  - ``option NAME``: every decorator option (fastmath, opt, lineinfo, debug,
    max_registers, launch_bounds, lto, link files by content, ...);
  - ``global NAME`` / ``closure NAME`` / ``default #N`` / ``builtin NAME``: the values
    it reads (numbers, strings, tuples, numpy arrays and scalars, dtypes, numba types,
    enums, records field by field; library functions and numba's objects by
    qualified name, other libraries' constants by value); only names read by
    the body count, scope-aware (a nested function's local hides nothing; see
    `references`);
  - ``callee MOD:QUALNAME``: the same tree for every device function (or
    jitable Python function) it reaches - through globals, module attributes,
    closure cells or default values - transitively; and for each name that
    reaches one, which function it names (``global NAME`` -> MOD:QUALNAME);
  - ``overload MOD:QUALNAME``: for a stub, each `@overload` implementation's tree;
  - ``file``: the module path, with lineinfo/debug (the binary embeds it);
- ``signature``: each ``argument N`` type by content (records by layout: ``field 'NAME'``
  and ``layout`` under ``argument N record``);
- ``arch``: the target architecture;
- ``toolchain``: the versions of numba-cuda, numba, llvmlite, numpy, cuda-bindings,
  cuda-core and the CUDA toolkit wheels (`backend.toolchain.DISTRIBUTIONS`, `CUDA_WHEELS`),
  NVVM's and nvJitLink's own, the Python implementation and version, key schema (the
  backend's: numba-cuda-mlir's names itself, its version and its libraries instead of
  numba's);
- ``config``: numba config knobs that change generated code (the backend's);
- ``launch``: only for a kernel whose code depends on its launch configuration
  (`mark_launch_config_sensitive`): the grid, block and dynamic shared memory it is
  built for (see `keying/launch.py`); other targets key none.

Keying is pure: side effects (reading source files and linked files, telling
project modules from libraries) come in through a `Sources` object, and what a
compiler's objects are (a kernel, its Python function, a declared extern function, a
record type) through an `ObjectModel` (both in `interfaces`). `keyer.Keyer` builds the
trees.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

from .encode import digest_of

KEY_SCHEMA = 10  # 2: callee bindings, bytecode fingerprints, record fields with offsets
#                3: symbol numbers from identity (separately compiled objects)
#                4: floats by bit pattern; sets, dicts, functions in containers; no
#                   annotations, dead branches or kernel argument names; builtins set
#                   by the program
#                5: objects link in the order of their bytes, not their keys
#                6: one key, one set of bytes: symbols numbered by content and flags
#                   spelled sorted (not by what a process compiled first); debug and
#                   lineinfo binaries name their files against placeholders (put back
#                   at load). Bytes built under schema 4 or 5 differ for the same inputs.
#                7: a separately compiled fastmath kernel's link gets numba's float flags
#                   (-ftz=1 -prec-div=0 -prec-sqrt=0 -fma=1): schema 6 links lost .ftz;
#                   the toolchain names every installed distribution that changes what is
#                   compiled (numpy, the CUDA bindings and toolkit wheels besides numba),
#                   and the interpreter's implementation with its version
#                8: one key, one set of bytes for shared arrays and string constants
#                   (named by their function and place, and by their bytes, not by a
#                   per-process count or hash()): bytes built under schema 7 for such
#                   kernels hold other symbol names for the same inputs
#                9: the binary numba launches, not the PTX before its link: a kernel
#                   whose `lto` option is on (numba-cuda's default) is linked with
#                   nvJitLink's float defaults, as numba's get_cubin links it (schema 7's
#                   -ftz=1 ... gave fastmath kernels a flush-to-zero numba's JIT does not
#                   have, bitwise other results on denormals on an H100), and a kernel
#                   built as one program stores the PTX of its link (numba's
#                   `get_lto_ptx`), not NVVM's PTX before it, also when it links files
#                   or cudadevrt (NVVM's PTX gave a device newer than its arch a
#                   fastmath kernel's `.ftz` in the PTX fallback)
#               10: a device function's parameters by place, as a kernel's: renaming one
#                   changes no key; a call that names one (`dev(x=1)`) is observed where
#                   numba binds it (`Kind.PARAMETERS`), and a default by its place


class LabelKind(str, enum.Enum):
    """What a key input is: the first word of its label.

    Labels stay text (manifests record flattened trees; explain, history and the graph
    read labels back from entries written by earlier builds), and that text is hashed
    into every digest above it, so it never changes: `LabelKind.label` makes it,
    `label_kind`, `label_name` and `function_name` read it back.
    """

    TARGET = "target"  # the root: kernel x signature x arch
    KERNEL = "kernel"  # kernel MOD:QUALNAME
    CALLEE = "callee"  # callee MOD:QUALNAME: a device function or jitable it reaches
    OVERLOAD = "overload"  # overload MOD:QUALNAME: an @overload implementation of a stub
    OBSERVED = "observed"  # observed MOD:QUALNAME: a function a compile consulted
    BODY = "body"
    OPTION = "option"  # option NAME
    GLOBAL = "global"  # global NAME (dotted: a module attribute read through the module)
    CLOSURE = "closure"  # closure NAME
    DEFAULT = "default"  # default #N, N the parameter's place (never its name)
    BUILTIN = "builtin"  # builtin NAME: a name the program put into builtins
    ATTRIBUTE = "attribute"  # attribute NAME: one set on the function object itself
    FILE = "file"
    SIGNATURE = "signature"
    ARGUMENT = "argument"  # argument N, from 1
    FIELD = "field"  # field 'NAME' of a record
    LAYOUT = "layout"  # a record's size, alignment and field order
    ARCH = "arch"
    TOOLCHAIN = "toolchain"
    CONFIG = "config"
    LAUNCH = "launch"  # the launch configuration a launch-config-sensitive target is built for

    def __str__(self) -> str:
        return self.value

    def label(self, name=None) -> str:
        """The label of an input of this kind: ``callee m:f``, ``field 'x'``, ``body``."""
        if name is None:
            return self.value
        if self is LabelKind.FIELD:
            return f"{self.value} '{name}'"
        return f"{self.value} {name}"


_KINDS = {kind.value: kind for kind in LabelKind}
_AS = " (as "  # see `reached_as`
_RECORD = " record"  # see `record_label`


def label_kind(text: str) -> LabelKind | None:
    """The kind of a label, or None (a toolchain or config entry: ``numba``, ``OPT``)."""
    return _KINDS.get(text.partition(" ")[0])


def label_name(text: str) -> str:
    """What a label names after its kind: ``m:f`` of ``callee m:f``, ``x`` of ``global x``."""
    return text.partition(" ")[2]


def function_name(text: str) -> str:
    """The MOD:QUALNAME of a function's label, without a `reached_as` suffix."""
    return label_name(text).split(_AS, 1)[0]


def reached_as(label: str, name: str) -> str:
    """One function reached under two names with two contents: its label under `name`."""
    return f"{label}{_AS}{name})"


def record_label(label: str) -> str:
    """The label of a type that is (or holds) a record, keyed with one child per field."""
    return f"{label}{_RECORD}"


@dataclass(frozen=True)
class KeyNode:
    """One key input: a label, a readable summary, a digest and its own inputs."""

    label: str
    summary: str
    digest: str
    children: tuple = ()
    # For a device function numba compiles into a library of its own (and so kbuild into an
    # object of its own): its identity, which names its symbols. Not part of the digest.
    ident: str | None = field(default=None, compare=False)

    @property
    def kind(self) -> LabelKind | None:
        return label_kind(self.label)

    def flatten(self, prefix=()):
        """Every node as (path of labels, summary, digest), depth first."""
        path = prefix + (self.label,)
        yield path, self.summary, self.digest
        for child in self.children:
            yield from child.flatten(path)


def leaf(label: str, value, text: str) -> KeyNode:
    """A key input whose content is the encodable `value`.

    Most leaves of a project's keys are the same few (options, toolchain versions, config
    knobs, constants, the arch): a leaf of plain values is made once per process.
    """
    memo_key = _plain(value)
    if memo_key is None:
        return KeyNode(label, text, digest_of(("leaf", KEY_SCHEMA, label, value)))
    memo_key = (label, text, memo_key)
    node = _LEAVES.get(memo_key)
    if node is None:
        if len(_LEAVES) > _LEAVES_MAX:
            _LEAVES.clear()
        node = _LEAVES[memo_key] = KeyNode(label, text,
                                           digest_of(("leaf", KEY_SCHEMA, label, value)))
    return node


_LEAVES: dict = {}
_LEAVES_MAX = 1 << 16
_FLOAT = struct.Struct("<d")


def _plain(value):
    """A key for a value of exact plain types that equal keys only for equal encodings
    (1, 1.0 and True are three keys; floats by their bits), or None."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return kind, value
    if kind is float:
        return kind, _FLOAT.pack(value)
    if kind is tuple and len(value) <= 16:
        parts = tuple(_plain(v) for v in value)
        return None if None in parts else (kind, parts)
    return None


def branch(label: str, text: str, children) -> KeyNode:
    """A key input made of other inputs; children are ordered by label."""
    kids = tuple(sorted(children, key=lambda n: n.label))
    labels = [k.label for k in kids]
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate key labels under {label!r}: {labels}")
    inner = tuple((k.label, k.digest) for k in kids)
    return KeyNode(label, text, digest_of(("node", KEY_SCHEMA, label, inner)), kids)


def own_digest(node: KeyNode) -> str:
    """A function tree's digest with each separately compiled callee by identity only.

    This keys the function's own object: what its code depends on except its callees'
    bodies, which live in their own objects (their interfaces are checked at link time).
    """
    inner = tuple((k.label, ("interface", k.ident) if k.ident and k.kind is LabelKind.CALLEE
                   else k.digest) for k in node.children)
    return digest_of(("own", KEY_SCHEMA, node.summary, inner))
