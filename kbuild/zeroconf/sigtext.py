"""Signatures as kbuild.toml writes them: `void(float32, float32[:, ::1])` from numba types.

numba's own `str()` of a type (`array(float32, 2d, C)`) does not evaluate back. A
signature kbuild writes must: `text()` spells each argument type in the vocabulary
`kbuild build` evaluates (`numba.types`, `from_dtype`, the kernel module's globals, so
a record dtype kept in the module is named by its global), and `checked_text()` only
returns a text that evaluates, in that namespace, to exactly the types it came from.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

from numba.core import types as numba_types


def text(argtypes, namespace=None) -> str | None:
    """The signature text of a kernel taking `argtypes`, or None when one cannot be
    spelled (`namespace`: the kernel module's globals, for record and enum names)."""
    try:
        return "void(" + ", ".join(_type(t, namespace or {}) for t in argtypes) + ")"
    except Exception:  # noqa: BLE001 - _Unspellable, or a type numba made that we do not know
        return None


def checked_text(argtypes, module, backend=None) -> str | None:
    """`text()`, when it evaluates in `module`'s signature namespace (of `backend`, default
    numba-cuda) back to `argtypes`."""
    # The globals are read (copied) only when a type is named by one (`_global_name`).
    found = text(argtypes, vars(module) if module else {})
    if found is None:
        return None
    return found if _parsed(found, module, backend) == tuple(argtypes) else None


def matching_text(texts, argtypes, module, backend=None) -> str | None:
    """The first of `texts` (signatures as a project file writes them) that evaluates, in
    `module`'s signature namespace, to exactly `argtypes`; None."""
    if module is None:
        return None
    for candidate in texts:
        if _parsed(candidate, module, backend) == tuple(argtypes):
            return candidate
    return None


def spelled(argtypes, module, backend, declared=()) -> str:
    """The text a served kernel's signature is named by: the project file's own for these
    types (`declared`: the texts it declares for the kernel: the entry it builds names
    that text), else `checked_text()`, else `text()`, else numba's own names."""
    return (matching_text(declared, argtypes, module, backend) if declared else None) or \
        checked_text(argtypes, module, backend) or text(argtypes) or \
        "void(" + ", ".join(str(t) for t in argtypes) + ")"


def _parsed(signature: str, module, backend):
    """The argument types `signature` names for a kernel of `module`, as `kbuild build`
    parses it (the backend's types, the module's globals), or None."""
    if backend is None:
        from ..backend.backends import DEFAULT, get

        backend = get(DEFAULT)
    try:
        if module is None:
            argtypes, _ = backend.parse_signature(signature, _NO_MODULE)
        else:
            argtypes, _ = backend.parse_signature(signature, module)
    except Exception:  # noqa: BLE001 - not evaluable: not written, or not this one
        return None
    return tuple(argtypes)


class _NoModule:
    """A module with no globals (a kernel whose module is gone)."""


_NO_MODULE = _NoModule()


class _Unspellable(Exception):
    pass


def _types_of(t):
    """The vocabulary `t` is of (numba-cuda's types, or numba-cuda-mlir's vendored copy):
    its backend's signature namespace, with `from_dtype`."""
    from ..backend.backends import of_object

    backend = of_object(t)
    return numba_types if backend is None else _vocabulary(backend.name)


@functools.cache
def _vocabulary(backend_name: str):
    from ..backend.backends import get

    return SimpleNamespace(**get(backend_name).signature_namespace(_NO_MODULE))


def _type(t, namespace: dict) -> str:
    types = _types_of(t)
    if t == types.boolean:
        return "boolean"
    if isinstance(t, (types.Integer, types.Float, types.Complex)):
        return str(t)
    if isinstance(t, types.Array):
        return _array(t, namespace)
    if isinstance(t, types.UniTuple):
        return f"UniTuple({_type(t.dtype, namespace)}, {t.count})"
    if isinstance(t, types.Tuple):
        inner = ", ".join(_type(e, namespace) for e in t.types)
        return f"Tuple(({inner},))"
    if isinstance(t, types.Record):
        return _global_name(namespace, lambda v: _is_dtype_of(v, t))
    if isinstance(t, (types.NPDatetime, types.NPTimedelta)):
        return f"{type(t).__name__}({t.unit!r})"
    if isinstance(t, (types.IntEnumMember, types.EnumMember)):
        cls = _global_name(namespace, lambda v: v is t.instance_class)
        return f"{type(t).__name__}({cls}, {_type(t.dtype, namespace)})"
    raise _Unspellable(t)


def _array(t, namespace: dict) -> str:
    dtype = _type(t.dtype, namespace)
    readonly = not t.mutable
    if t.ndim >= 1 and not readonly and t.aligned and t.layout in "CFA":
        dims = [":"] * t.ndim
        if t.layout == "C":
            dims[-1] = "::1"
        elif t.layout == "F":
            dims[0] = "::1"
        return f"{dtype}[{', '.join(dims)}]"
    extra = (", readonly=True" if readonly else "") + ("" if t.aligned else ", aligned=False")
    return f"Array({dtype}, {t.ndim}, {t.layout!r}{extra})"


def _global_name(namespace: dict, matches) -> str:
    namespace = dict(namespace)  # a module's globals, as they are now
    for name in sorted(namespace):
        if name.isidentifier() and not name.startswith("__"):
            try:
                if matches(namespace[name]):
                    return name
            except Exception:  # noqa: BLE001 - a global that cannot be compared is not it
                continue
    raise _Unspellable("no global names it")


def _is_dtype_of(value, record) -> bool:
    import numpy as np

    vocabulary = _types_of(record)
    if vocabulary is numba_types:
        from numba import from_dtype
    else:
        from_dtype = vocabulary.from_dtype
    return isinstance(value, np.dtype) and from_dtype(value) == record
