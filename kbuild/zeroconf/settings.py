"""Where zero-config caching keeps and finds kernels: the settings of `kbuild.enable()`.

Each setting comes from `enable()`'s argument, else the environment, else the nearest
kbuild.toml (or pyproject.toml's [tool.kbuild]) if there is one, else a default, as
`Project.load()` finds them: the store is `store=`, else the file's `store`, else
$KBUILD_STORE, else ~/.cache/kbuild; the remote `remote=` (False: none), else
$KBUILD_REMOTE, else the file's `[store] remote`; `on_miss` `on_miss=`, else
$KBUILD_ON_MISS, else "build"; extra archs `archs=`, else $KBUILD_ARCH (never the file's
`arch`: a program compiles for its own device; CI builds the others ahead of time).

`kbuild run` hands its options to the programs it runs in one variable, KBUILD_ENABLE,
as JSON (`{"store": ..., "on_miss": ..., "record": ...}`); `KBUILD_ENABLE=1` is all
defaults.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, KbuildError

ENV = "KBUILD_ENABLE"
ON_MISS = ("build", "error", "jit")
_OFF = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Settings:
    store: Path
    on_miss: str = "build"
    archs: tuple = ()  # also built for these architectures (the device's always is)
    remote: object = None  # a URL, False for none, None: $KBUILD_REMOTE / the file's
    record: Path | None = None  # a folder the (kernel, signature) pairs launched go to
    config: object = None  # the nearest project file's ProjectConfig, if any
    roots: tuple = ()  # import roots: what is the project's (keyed by content)
    root: Path = field(default_factory=Path.cwd)  # where observed files are named from
    name: str = ""  # the project name entries are stored under
    warnings: tuple = ()  # what was ignored on the way (an unreadable kbuild.toml, ...)


def from_environment(env=None) -> dict | None:
    """`enable()`'s keyword arguments from KBUILD_ENABLE, or None when it is unset or off."""
    env = os.environ if env is None else env
    value = env.get(ENV, "").strip()
    if value.lower() in _OFF:
        return None
    if not value.startswith("{"):
        return {}
    try:
        found = json.loads(value)
    except ValueError:
        raise ConfigError(f"{ENV}={value[:80]!r} is neither 1 nor a JSON object") from None
    if not isinstance(found, dict):
        raise ConfigError(f"{ENV} must be 1 or a JSON object, not {value[:80]!r}")
    return found


def resolve(store=None, archs=None, remote=None, on_miss=None, record=None, config=None,
            env=None) -> Settings:
    """The settings for these `enable()` arguments (None: not given)."""
    from ..config import default_store, validate_arch

    env = os.environ if env is None else env
    on_miss = on_miss or env.get("KBUILD_ON_MISS") or "build"
    if on_miss not in ON_MISS:
        raise ConfigError(f"on_miss must be one of {', '.join(ON_MISS)}, not {on_miss!r}")
    if isinstance(archs, str):
        archs = archs.split(",")
    if archs is None and env.get("KBUILD_ARCH"):
        archs = env["KBUILD_ARCH"].split(",")
    archs = tuple(validate_arch(a.strip(), "kbuild.enable() archs") for a in archs or ()
                  if a.strip())
    warnings = []
    project = _nearest_project(config or env.get("KBUILD_CONFIG") or None, warnings)
    root = project.root if project is not None else Path.cwd()
    return Settings(
        store=default_store(project, str(store) if store else None), on_miss=on_miss,
        archs=archs, remote=remote, record=Path(record).resolve() if record else None,
        config=project, roots=project.paths if project is not None else _default_roots(),
        root=root, name=project.name if project is not None else root.name or "zeroconfig",
        warnings=tuple(warnings))


def _nearest_project(path, warnings: list):
    """The project file named, else the nearest one, else None; one that cannot be read is
    a warning here (zero-config caching never stops a program), not an error."""
    from ..config import find_config, load_config

    try:
        found = Path(path) if path else find_config()
    except KbuildError:
        return None  # no project file: zero configuration
    try:
        return load_config(found, kernels=False)
    except KbuildError as exc:
        warnings.append(f"kbuild: ignoring {found}: {exc}")
        return None


def _default_roots() -> tuple:
    """Without a project file: the current folder and the script's (sys.path[0]); modules
    under them are the project's, keyed by content."""
    roots = [Path.cwd()]
    first = sys.path[0] if sys.path else ""
    if first and os.path.isdir(first):
        roots.append(Path(first).resolve())
    return tuple(dict.fromkeys(roots))


def verify_share() -> float:
    """KBUILD_VERIFY as a share of served kernels to check: `1` all, `10%` or `0.1` a
    random tenth, unset or `0` none (a value that does not parse checks all: asked for
    checking, a typo must not turn it off)."""
    text = os.environ.get("KBUILD_VERIFY", "").strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return 0.0
    if text in ("1", "true", "yes", "on"):
        return 1.0
    try:
        share = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        return 1.0
    return min(max(share, 0.0), 1.0)
