"""Signatures as kbuild.toml writes them: `void(float32, float32[:, ::1])` from numba types.

numba's own `str()` of a type (`array(float32, 2d, C)`) does not evaluate back. A
signature kbuild writes must: `text()` spells each argument type in the vocabulary
`kbuild build` evaluates (`numba.types`, `from_dtype`, the kernel module's globals, so
a record dtype kept in the module is named by its global), and `checked_text()` only
returns a text that evaluates, in that namespace, to exactly the types it came from.
"""

from __future__ import annotations

from numba.core import types


def text(argtypes, namespace=None) -> str | None:
    """The signature text of a kernel taking `argtypes`, or None when one cannot be
    spelled (`namespace`: the kernel module's globals, for record and enum names)."""
    try:
        return "void(" + ", ".join(_type(t, namespace or {}) for t in argtypes) + ")"
    except Exception:  # noqa: BLE001 - _Unspellable, or a type numba made that we do not know
        return None


def checked_text(argtypes, module) -> str | None:
    """`text()`, when it evaluates in `module`'s signature namespace back to `argtypes`."""
    from ..discover import signature_namespace
    from numba.core import sigutils

    namespace = signature_namespace(module) if module is not None else dict(vars(types))
    found = text(argtypes, {k: v for k, v in (vars(module) if module else {}).items()})
    if found is None:
        return None
    try:
        parsed, _ = sigutils.normalize_signature(
            eval(found, {"__builtins__": {}}, namespace))  # noqa: S307 - our own text
    except Exception:  # noqa: BLE001 - not evaluable: not written
        return None
    return found if tuple(parsed) == tuple(argtypes) else None


def matching_text(texts, argtypes, module) -> str | None:
    """The first of `texts` (signatures as a project file writes them) that evaluates, in
    `module`'s signature namespace, to exactly `argtypes`; None."""
    from ..discover import signature_namespace
    from numba.core import sigutils

    if module is None:
        return None
    namespace = signature_namespace(module)
    for candidate in texts:
        try:
            parsed, _ = sigutils.normalize_signature(
                eval(candidate, {"__builtins__": {}}, namespace))  # noqa: S307 - numba's format
        except Exception:  # noqa: BLE001 - a bad declared signature is kbuild build's to report
            continue
        if tuple(parsed) == tuple(argtypes):
            return candidate
    return None


class _Unspellable(Exception):
    pass


_SCALARS = {types.boolean: "boolean"}


def _type(t, namespace: dict) -> str:
    if t in _SCALARS:
        return _SCALARS[t]
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
    from numba import from_dtype

    return isinstance(value, np.dtype) and from_dtype(value) == record
