"""What numba's registries hold for a function: the look-ups keying needs, behind the backend.

Keying asks these through its `ObjectModel` (see `backend.objectmodel`), so the
keying core names no numba internals beyond its type objects.
"""

from __future__ import annotations

import types as pytypes


def registries() -> list:
    """numba's typing registries that hold `@overload`s and typed globals (generic, CUDA)."""
    from numba.core.typing import templates as core_templates
    from numba.cuda.typing import templates as cuda_templates

    return [getattr(m, "builtin_registry", None) for m in (core_templates, cuda_templates)]


def known_to_numba(value, among=None) -> bool:
    """Whether `value` is registered as a global with numba's typing (`@type_callable`,
    `@overload`, a structref constructor, ...): then compiled code can use it. `among`:
    the typing registries to look in (default numba-cuda's, `registries()`)."""
    return any(key is value for registry in (registries() if among is None else among)
               for key, _ in getattr(registry, "globals", ()))


def overload_implementations(func, among=None) -> list:
    """(implementation, options) of each `@overload(func)` registered with numba, generic
    and CUDA targets (or in the typing registries `among`). The options are how the
    overload was registered (`strict`, `inline`, `prefer_literal`, `jit_options` and
    the rest of `@overload`'s keywords): typing and code depend on them as on the body."""
    found = []
    for registry in (registries() if among is None else among):
        for key, fntype in getattr(registry, "globals", ()):
            if key is not func:
                continue
            for template in getattr(fntype, "templates", ()):
                impl = getattr(template, "_overload_func", None)
                if not isinstance(impl, pytypes.FunctionType) or not for_cuda(template):
                    continue
                options = _overload_options(template)
                if not any(impl is f and options == o for f, o in found):
                    found.append((impl, options))
    return found


# The targets whose templates numba-cuda (and numba-cuda-mlir) type with: a template
# registered with no target is "generic" (numba-cuda's `utils.order_by_target_specificity`
# and its typing context's `is_for_this_target` drop every other one).
_CUDA_TARGETS = ("generic", "cuda")


def for_cuda(template) -> bool:
    """Whether CUDA typing ever tries `template`: an `@overload(f, target="cpu")` of a
    stub is never run for a kernel, so it is no part of what the kernel compiles."""
    metadata = getattr(template, "metadata", None) or {}
    return metadata.get("target", "generic") in _CUDA_TARGETS


def _overload_options(template) -> dict:
    inline = getattr(template, "_inline", None)
    options = {"strict": getattr(template, "_strict", None),
               "inline": getattr(inline, "value", inline),
               "prefer_literal": getattr(template, "prefer_literal", None),
               "jit_options": dict(getattr(template, "_jit_options", None) or {})}
    options.update(getattr(template, "metadata", None) or {})
    return options


def extern_link_files(extfn) -> list[str]:
    """The files `declare_device(..., link=...)` registered for `extfn` with numba's target."""
    from numba.cuda.descriptor import cuda_target

    defns = getattr(cuda_target.target_context, "_defns", {})
    paths = []
    for _sig, impl in getattr(defns.get(extfn), "versions", ()):
        for lib in getattr(impl, "libs", ()):
            paths += [p for p in getattr(lib, "_linking_files", ()) if isinstance(p, str)]
    return paths
