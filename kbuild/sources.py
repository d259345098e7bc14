"""The side effects keying needs: source text, linked files, project membership."""

from __future__ import annotations

import inspect
import os
import sys
from functools import lru_cache

from .encode import digest


class ProjectSources:
    """`keys.Sources` for a project whose import roots are `roots` (absolute paths).

    A module is the project's when its file lies under a root and not inside an
    installed package (site-packages), so device functions in libraries are
    still keyed by content but library helpers (``math.sqrt``) by name.
    """

    def __init__(self, roots):
        self._roots = tuple(os.path.realpath(r) + os.sep for r in roots)
        self._project_cache: dict[str, bool] = {}

    def source_of(self, func):
        try:
            lines, first = inspect.getsourcelines(func)
        except (OSError, TypeError):
            return None
        return "".join(lines), first

    def is_project_module(self, module_name: str) -> bool:
        cached = self._project_cache.get(module_name)
        if cached is None:
            cached = self._project_cache[module_name] = self._in_roots(module_name)
        return cached

    def _in_roots(self, module_name: str) -> bool:
        module = sys.modules.get(module_name)
        path = getattr(module, "__file__", None)
        if not path:
            return False
        path = os.path.realpath(path)
        if "site-packages" in path.split(os.sep) or "dist-packages" in path.split(os.sep):
            return False
        return path.startswith(self._roots)

    def file_digest(self, path: str) -> str:
        return _file_digest(os.path.realpath(path), os.stat(path).st_mtime_ns)


@lru_cache(maxsize=None)
def _file_digest(path: str, _mtime_ns: int) -> str:
    with open(path, "rb") as fh:
        return digest(fh.read())
