"""The process-start hook: `KBUILD_ENABLE=1 python app.py` with no change to app.py.

kbuild installs `kbuild-enable.pth` into site-packages (a wheel's root file; see setup.py).
Python runs its one line at every start; it reads one environment variable and does
nothing else unless KBUILD_ENABLE is set (as coverage's process-start hook does). When it
is, `start()` arranges for `kbuild.enable()` to run as soon as the program imports
`numba.cuda` (a process that never does pays nothing more), with the options
KBUILD_ENABLE carries (`1`, or JSON from `kbuild run`). Nothing here may stop a program:
a problem is one line on stderr and the program runs on without kbuild.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import site
import sys

PTH = "kbuild-enable.pth"
_WATCHED = "numba.cuda"


def start() -> None:
    """Called by the .pth line when KBUILD_ENABLE is set: enable kbuild once numba.cuda
    is imported (now, if it already is)."""
    try:
        from .settings import from_environment

        options = from_environment()
    except Exception as exc:  # noqa: BLE001 - never stop a program at start-up
        _say(f"kbuild: KBUILD_ENABLE ignored: {exc}")
        return
    if options is None:
        return
    if _WATCHED in sys.modules:
        _enable(options)
    elif not any(isinstance(f, _EnableOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _EnableOnImport(options))


def stand_down() -> None:
    """kbuild's own commands compile for themselves: KBUILD_ENABLE in their environment
    (exported for a whole shell, say) must not route their compiles through a session."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _EnableOnImport)]
    if "kbuild.zeroconf.session" in sys.modules:
        from . import disable

        disable()


def _enable(options: dict) -> None:
    try:
        from . import enable

        enable(**options)
    except Exception as exc:  # noqa: BLE001
        _say(f"kbuild: KBUILD_ENABLE ignored: {type(exc).__name__}: {exc}")


class _EnableOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of numba.cuda so that, once the package has
    run, kbuild is enabled; then steps aside."""

    def __init__(self, options: dict):
        self.options = options

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _WATCHED:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Then(spec.loader, lambda: _enable(self.options))
        return spec


class _Then(importlib.abc.Loader):
    """A loader that runs `after()` once the module it loads has run."""

    def __init__(self, loader, after):
        self.loader, self.after = loader, after

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        spec = getattr(module, "__spec__", None)
        for holder, name in ((spec, "loader"), (module, "__loader__")):
            if holder is not None and getattr(holder, name, None) is self:
                setattr(holder, name, self.loader)  # the module keeps its own loader
        self.loader.exec_module(module)
        self.after()

    def __getattr__(self, name):
        return getattr(self.loader, name)


def hook_installed() -> bool:
    """Whether this Python's site-packages hold kbuild's start-up hook."""
    folders = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    return any(os.path.isfile(os.path.join(f, PTH)) for f in folders)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
