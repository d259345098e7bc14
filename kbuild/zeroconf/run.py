"""`kbuild run [--record] -- CMD ...`: run a command with zero-config caching switched on.

CMD runs with KBUILD_ENABLE set (its options as JSON, see `settings`); kbuild's startup
hook (`kbuild-enable.pth`, installed with kbuild) calls `kbuild.enable()` in CMD and in
every Python process it starts, before their own code runs. So `kbuild run -- python
app.py`, `kbuild run -- pytest -n 8` or `kbuild run -- mpirun -n 4 python solver.py` cache
every kernel they compile, with no change to the program.

With `--record`, each process also writes the (kernel, signature) pairs it launched into a
folder of the run's, and once CMD is done they are written into kbuild.toml (created or
merged: see `tomledit`), so that `kbuild build` on a CPU-only CI machine builds them ahead
of time for every architecture. Under `NUMBA_ENABLE_CUDASIM=1` (numba's simulator, no
GPU) only the recording happens: argument types come from numba's `typeof`.

kbuild's own lines go to stderr; stdout is CMD's. The exit code is CMD's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import KbuildError
from .settings import ENV


class RunError(KbuildError):
    """`kbuild run` was given no command, or cannot record into the project file."""


def handle(args) -> int:
    command = list(args.cmd or ())
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise RunError("kbuild run: name the command to run after --, like "
                       "`kbuild run -- python app.py`")
    record_dir = Path(tempfile.mkdtemp(prefix="kbuild-record-")) if args.record else None
    try:
        env = dict(os.environ, **{ENV: json.dumps(_options(args, record_dir))})
        _warn_without_hook()
        code = _run(command, env)
        if record_dir is not None:
            _write_recording(args, record_dir, code)
        return code
    finally:
        if record_dir is not None:
            shutil.rmtree(record_dir, ignore_errors=True)


def _options(args, record_dir) -> dict:
    options = {"store": _absolute(getattr(args, "store", None)),
               "config": _absolute(getattr(args, "config", None)),
               "on_miss": args.on_miss, "archs": args.arch,
               "remote": False if args.no_remote else args.remote,
               "record": str(record_dir) if record_dir else None}
    return {k: v for k, v in options.items() if v is not None}


def _absolute(path):
    return str(Path(path).resolve()) if path else None


def _run(command, env) -> int:
    try:
        return subprocess.run(command, env=env).returncode
    except FileNotFoundError:
        raise RunError(f"kbuild run: command not found: {command[0]}") from None
    except KeyboardInterrupt:
        return 130


def _warn_without_hook() -> None:
    from .startup import hook_installed

    if not hook_installed():
        _say("kbuild run: kbuild's startup hook (kbuild-enable.pth) is not installed in "
             f"{sys.prefix}; Python processes will not enable caching on their own. "
             "Reinstall kbuild (pip install kbuild), or call kbuild.enable() in the program")


def _write_recording(args, folder: Path, code: int) -> None:
    from ..config import DEFAULT_ARCHS
    from . import tomledit
    from .record import collect

    found = collect(folder)
    for why, names in _by_reason(found.skipped):
        _say(f"kbuild run: not recorded: {', '.join(names)}: {why}")
    if not found.kernels:
        _say("kbuild run: recorded nothing new" + ("" if code == 0 else
                                                   f" (the command exited with {code})"))
        return
    path = _project_file(getattr(args, "config", None))
    roots = sorted({_relative(r, path.parent) for r in found.roots}) or ["."]
    served = sorted(found.archs | set(filter(None, (args.arch or "").split(","))))
    result = tomledit.merge(path, found.kernels, name=path.parent.name or "project",
                            paths=roots, archs=served or DEFAULT_ARCHS, served=served)
    kernels = {k for k, _ in result["added"]} | {k for k, _ in result["launches"]}
    verb = "wrote" if result["created"] else "recorded into"
    _say(f"kbuild run: {verb} {path}: {len(result['added'])} new signatures of "
         f"{len(kernels)} kernels" + (f", {len(result['launches'])} launch configurations"
                                      if result["launches"] else "")
         + ("" if code == 0 else f" (the command exited with {code})"))
    for kernel, signature in result["added"]:
        _say(f"  {kernel} {signature}")
    if result["archs"]:  # what the launches looked up (sm_90a on an sm_90), not declared
        _say(f"kbuild run: added arch {', '.join(result['archs'])} to {path}: the launches "
             "looked it up")
    _say("next: kbuild build (the archs declared, which a launch here looks up; on any "
         "machine, no GPU needed)")


def _project_file(config) -> Path:
    """`--config`, else the nearest kbuild.toml (or pyproject.toml with [tool.kbuild]),
    else a new kbuild.toml here."""
    from ..config import CONFIG_NAME, find_config

    if config:
        return Path(config).resolve()
    try:
        return find_config()
    except KbuildError:
        return Path.cwd() / CONFIG_NAME


def _relative(root: str, base: Path) -> str:
    try:
        return Path(os.path.relpath(root, base)).as_posix()
    except ValueError:  # another drive
        return root


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _by_reason(skipped: dict) -> list:
    """(why, names) for each reason, names sorted: a notebook's dozen cell kernels are told
    once, not a line each."""
    grouped: dict = {}
    for name, why in sorted(skipped.items()):
        grouped.setdefault(why, []).append(name)
    return sorted(grouped.items(), key=lambda item: item[1])
