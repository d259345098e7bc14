"""The process-start hook: `KBUILD_ENABLE=1 python app.py` with no change to app.py.

kbuild installs `kbuild-enable.pth` into site-packages (a wheel's root file; see setup.py).
Python runs its one line at every start; it reads one environment variable and does
nothing else unless KBUILD_ENABLE is set (as coverage's process-start hook does). When it
is, `start()` arranges for `kbuild.enable()` to run as soon as the program imports
`numba.cuda` or `numba_cuda_mlir` (a process that never does pays nothing more), with the options
KBUILD_ENABLE carries (`1`, or JSON from `kbuild run`). Nothing here may stop a program:
a problem is one line on stderr and the program runs on without kbuild.
"""

from __future__ import annotations

import os
import site
import sys

PTH = "kbuild-enable.pth"
# kbuild is enabled when the program imports either compiler.
_WATCHED = ("numba.cuda", "numba_cuda_mlir")
_waiting: list = []  # the enabling function while it waits for an import
# Whether start() ran in this process. site.py can read one site-packages folder twice
# (a venv's `lib64` is a link to `lib`, and both are on its list of folders), and with it
# the .pth line: a second start() would say each problem twice.
_started: list = []


def start() -> None:
    """Called by the .pth line when KBUILD_ENABLE is set: enable kbuild once numba.cuda
    or numba_cuda_mlir is imported (now, if one already is). Once per process."""
    if _started:
        return
    _started.append(True)
    try:
        from .settings import from_environment

        options = from_environment()
    except Exception as exc:  # noqa: BLE001 - never stop a program at start-up
        _say(f"kbuild: KBUILD_ENABLE ignored: {exc}")
        return
    if options is None or _waiting:
        return
    from .afterimport import after_import

    def enable_once() -> None:
        if enable_once in _waiting:
            _stop_waiting()
            _enable(options)

    _waiting.append(enable_once)
    for name in _WATCHED:
        after_import(name, enable_once)


def _stop_waiting() -> None:
    from .afterimport import cancel

    while _waiting:
        cancel(_waiting.pop())


def stand_down() -> None:
    """kbuild's own commands compile for themselves: KBUILD_ENABLE in their environment
    (exported for a whole shell, say) must not route their compiles through a session."""
    _stop_waiting()
    if "kbuild.zeroconf.session" in sys.modules:
        from . import disable

        disable()


def _enable(options: dict) -> None:
    try:
        from . import enable

        enable(**options)
    except Exception as exc:  # noqa: BLE001
        _say(f"kbuild: KBUILD_ENABLE ignored: {type(exc).__name__}: {exc}")


def hook_installed() -> bool:
    """Whether this Python's site-packages hold kbuild's start-up hook."""
    folders = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    return any(os.path.isfile(os.path.join(f, PTH)) for f in folders)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
