"""What keying receives from outside, so that it stays pure: two small interfaces.

- `Sources`: the side effects keying needs (source text, linked files' bytes, which
  modules are the project's). `sources.ProjectSources` implements it.
- `ObjectModel`: what a compiler's objects are - which object is a kernel, a device
  function or a jitable and what its Python function and options are, which value is a
  declared extern function, which type a record, what the compiler's registries hold for
  a function, how an observed global naming a compiler object is keyed.
  `backend.objectmodel.NUMBA_CUDA` implements it for numba-cuda (and its simulator);
  another compiler plugs in by implementing this interface alone. Keying reads no
  compiler object's attributes of its own: numba's type objects (`numba.core.types`)
  are the only compiler vocabulary it speaks.
"""

from __future__ import annotations

import enum
import types as pytypes
from dataclasses import dataclass
from typing import Protocol


class Sources(Protocol):
    """The side effects keying needs, passed in so keying stays pure.

    Optional, used when present: `function_def(func)` (a parsed `def` faster than
    `source_of`), `remembered(func, kind, compute)` (facts kept across processes) and
    `keep_body_text(digest, render)` (a body's source, for `kbuild explain`).
    """

    def source_of(self, func) -> tuple[str, int] | None:
        """(source text, first line number) of a function, or None."""

    def is_project_module(self, module_name: str) -> bool:
        """Whether a module belongs to the project (its objects are keyed by content)."""

    def file_digest(self, path: str) -> str:
        """The digest of a linked file's bytes."""

    def cuda_source_digest(self, path: str) -> str:
        """The digest of a CUDA C file by its source form (`ctext.source_digest`)."""

    def relative_path(self, path: str) -> tuple | None:
        """(root index, POSIX path below it) of a path under a project root, else None."""


class Role(str, enum.Enum):
    """What a function-like object is to the compiler."""

    KERNEL = "kernel"  # launched from the host: a target
    DEVICE = "device"  # a device function, called from kernels
    FUNCTION = "function"  # a Python function compiled into its caller (a jitable, an intrinsic)

    def __str__(self) -> str:
        return self.value


@dataclass
class Function:
    """What keying needs to know about a function-like object."""

    py_func: pytypes.FunctionType
    options: dict | None  # its compile options; None: read when keyed (`ObjectModel.options_of`)
    role: Role
    # Parameter name -> default value as the compiler folds omitted arguments (recorded
    # when the dispatcher was made); None: the function's own `__defaults__`.
    defaults: dict | None = None


@dataclass(frozen=True)
class DeclaredFunction:
    """An extern function declared to the compiler (numba-cuda's `cuda.declare_device`)."""

    name: str  # its symbol
    argtypes: tuple  # numba types
    restype: object  # a numba type
    signature_text: str  # as the compiler shows it, for summaries
    link_files: tuple  # paths of the files that define it


@dataclass(frozen=True)
class LinkedCode:
    """Code linked from memory (a `link=` item that is not a file): its kind and bytes."""

    kind: str  # the compiler's name for it (``PTXSource``, ``Cubin``, ...)
    data: bytes | str


class ObjectModel(Protocol):
    """What keying must know about a compiler's objects."""

    def function_of(self, obj) -> Function | None:
        """The Python function, options and role behind a kernel, device function, jitable
        or plain function; None for anything else."""

    def options_of(self, obj) -> dict:
        """The options of an object whose `function_of` gave None for them (read only when
        it is keyed: numba's simulator keeps none and they are read back from its source)."""

    def declared_function(self, value) -> DeclaredFunction | None:
        """`value` as a declared extern function, or None."""

    def record_of(self, value):
        """The record type (a numba `Record`) that `value` is or holds as an array's
        dtype, or None."""

    def linked_item(self, item) -> str | LinkedCode | None:
        """An item of a `link=` option: a file's path, code in memory, or None (unknown)."""

    def overloads_of(self, func) -> list:
        """(function, options) the compiler runs for `func` (numba's `@overload(func)`):
        each implementation with how it was registered (a dict of keyable values)."""

    def known_to_compiler(self, value) -> bool:
        """Whether the compiler's typing registries name `value` itself (compiled code can
        use it)."""

    def named_form(self, value) -> tuple | None:
        """A compiler object that compiled code refers to by name (a dispatcher, a declared
        extern function) as a tuple of strings naming it, with what its typing depends on
        beyond its body (an eagerly compiled dispatcher's declared signatures); None for
        anything else. What an observed global holding it is keyed by (`observed`)."""


def python_function(objects: ObjectModel, value):
    """The Python function `value` is or compiles (a dispatcher's, through `objects`),
    or None."""
    if isinstance(value, pytypes.FunctionType):
        return value
    held = objects.function_of(value) if value is not None else None
    return held.py_func if held is not None else None
