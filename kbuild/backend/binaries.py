"""The symbol numba-cuda gives a kernel, so a stored entry can be checked to hold the
kernel that asked for it (the store compares it with `artifacts.names_kernel`).

numba's mangling scheme is the backend's knowledge; what a binary says is read in
`kbuild.artifacts`, below the store and the backend both.
"""

from __future__ import annotations

import re

_INVALID = re.compile(r"[^a-z0-9_]", re.IGNORECASE)


def entry_prefix(modname: str, qualname: str) -> str:
    """The start of the symbol numba-cuda gives a kernel: its module and qualified name in
    numba's Itanium mangling (`itanium_mangler.mangle_identifier`: each dotted part
    hex-escaped and length-prefixed, inside N...E), up to its ABI tags."""
    parts = []
    for part in f"{modname}.{qualname}".split("."):
        escaped = _INVALID.sub(lambda m: "".join(f"_{b:02x}" for b in m.group(0).encode()), part)
        escaped = "_" + escaped if escaped[:1].isdigit() else escaped
        parts.append(f"{len(escaped)}{escaped}")
    return "_ZN" + "".join(parts)


def kernel_entry_prefix(kernel) -> str | None:
    """`entry_prefix` of a numba-cuda dispatcher's Python function (None when it has none)."""
    import inspect

    func = getattr(kernel, "py_func", None)
    qualname = getattr(func, "__qualname__", None)
    if func is None or qualname is None:
        return None
    module = inspect.getmodule(func)
    return entry_prefix(module.__name__ if module is not None else "<dynamic>", qualname)
