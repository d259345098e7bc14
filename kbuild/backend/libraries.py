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


def is_settings(module_name, module) -> bool:
    """Whether a library module holds settings rather than code: numba's `config` (under
    each name a backend has it: numba's, numba-cuda's, a vendored copy), whose values
    come from the environment and `.numba_config.yaml` when it loads and whenever numba
    reloads it. What the project's code reads of it is state, as a module of the
    project's is, never pinned by a version."""
    if not isinstance(module_name, str) or module_name.rpartition(".")[2] != "config" or \
            module_name.partition(".")[0] not in LIBRARIES:
        return False
    namespace = getattr(module, "__dict__", None)
    return isinstance(namespace, dict) and callable(namespace.get("reload_config")) \
        and "_env_reloader" in namespace


__all__ = ["LIBRARIES", "is_library", "is_settings"]
