"""Which remote a command uses, and how: the outcome of CLI > environment > kbuild.toml.

`remote_settings` resolves the URL, read-only, the timeout of each call, the build's
time budget and the signing key into one `RemoteSettings`, which `storage.open_storage`
hands to the tier (`remote.open_remote`). Nothing is contacted here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import ConfigError
from .signing import signing_key

__all__ = ["DEFAULT_BUDGET", "DEFAULT_TIMEOUT", "RemoteSettings", "parse_timeout",
           "remote_settings", "remote_timeout"]

DEFAULT_TIMEOUT = 5.0
DEFAULT_BUDGET = 30.0  # seconds one build may spend waiting on the remote, all calls together


@dataclass(frozen=True)
class RemoteSettings:
    """Which remote a command uses, and how: the outcome of CLI > env > kbuild.toml."""

    url: str
    where: str  # what named it, for error messages
    read_only: bool = False
    timeout: float = DEFAULT_TIMEOUT
    budget: float = DEFAULT_BUDGET
    signing_key: bytes | None = field(default=None, repr=False)
    paths: tuple = ()  # the project's import roots: where a `module:Class` remote is found


def remote_settings(config=None, *, url=None, no_remote=False, read_only=False, timeout=None,
                    budget=None, env=None) -> RemoteSettings | None:
    """The remote named by `url` (--remote), else $KBUILD_REMOTE, else `[store] remote`.

    None when none is named or `no_remote`. Read-only comes from --remote-read-only
    or KBUILD_REMOTE_READ_ONLY=1, the timeout from `remote_timeout`, the budget from
    `budget` (a command's own), else $KBUILD_REMOTE_BUDGET, else the default.
    """
    env = os.environ if env is None else env
    chosen = _first((url, "--remote"), (env.get("KBUILD_REMOTE"), "KBUILD_REMOTE"),
                    (getattr(config, "remote", None), f"{_toml(config)} remote"))
    if no_remote or chosen is None:
        return None
    if budget is None:
        budget = env.get("KBUILD_REMOTE_BUDGET")
        budget = parse_timeout(budget, "KBUILD_REMOTE_BUDGET") if budget else DEFAULT_BUDGET
    return RemoteSettings(url=chosen[0], where=chosen[1],
                          read_only=read_only or env.get("KBUILD_REMOTE_READ_ONLY") == "1",
                          timeout=remote_timeout(config, timeout, env),
                          budget=budget,
                          signing_key=signing_key(config, env),
                          paths=tuple(str(p) for p in getattr(config, "paths", ()) or ()))


def remote_timeout(config=None, timeout=None, env=None) -> float:
    """Seconds per remote call: --remote-timeout, $KBUILD_REMOTE_TIMEOUT, `[store] remote_timeout`."""
    env = os.environ if env is None else env
    chosen = _first((timeout, "--remote-timeout"),
                    (env.get("KBUILD_REMOTE_TIMEOUT"), "KBUILD_REMOTE_TIMEOUT"),
                    (getattr(config, "remote_timeout", None), f"{_toml(config)} remote_timeout"))
    return DEFAULT_TIMEOUT if chosen is None else parse_timeout(*chosen)


def _first(*candidates):
    """The first (value, where) whose value is set: CLI, then environment, then kbuild.toml."""
    return next(((value, where) for value, where in candidates if value not in (None, "")), None)


def _toml(config) -> str:
    return f"{config.path}: [store]" if config is not None else "kbuild.toml [store]"


def parse_timeout(value, where: str) -> float:
    """A positive number of seconds, or ConfigError naming `where`."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if isinstance(value, bool) or not 0 < seconds < float("inf"):
        raise ConfigError(f"{where}: timeout must be a positive number of seconds, not {value!r}")
    return seconds
