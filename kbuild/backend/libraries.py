"""Which modules are the toolchain's (or the language's), not the project's.

Kept apart from `registrations` (which needs numba): discovering targets and direct mode
ask it without importing numba.
"""

from __future__ import annotations

import sys

# Packages whose versions are in the toolchain key: what they hold is theirs, not the project's.
LIBRARIES = frozenset({"numba", "numba_cuda", "llvmlite", "numpy", "cuda", "kbuild",
                       "numba_cuda_mlir"})


def is_library(module_name) -> bool:
    """Whether a module's code and data are pinned by the toolchain (or the language)."""
    if not isinstance(module_name, str) or not module_name:
        return True
    top = module_name.partition(".")[0]
    return top in LIBRARIES or top in sys.stdlib_module_names or top == "builtins"


__all__ = ["LIBRARIES", "is_library"]
