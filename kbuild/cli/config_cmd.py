"""`kbuild config`: every effective setting and where it came from, as `ccache -p` shows.

Each setting is looked up in the order the commands look it up (command line, then
environment, then the project file, then the default), and reported with that origin:
`--store`, `KBUILD_STORE`, `/path/kbuild.toml: [store] max_size`, `default`. Secrets are
never printed: the signing key is reported as set or not, by the variable that holds it.
"""

from __future__ import annotations

import os

from .common import EXIT_OK, print_json


def cmd_config(args, opened) -> int:
    rows = effective_settings(args)
    if args.json:
        print_json({"settings": rows})
        return EXIT_OK
    width = max(len(r["name"]) for r in rows)
    shown = [_shown(r["value"]) for r in rows]
    room = max(len(v) for v in shown)
    for row, value in zip(rows, shown):
        print(f"{row['name']:<{width}} = {value:<{room}}  ({row['origin']})")
    return EXIT_OK


def _shown(value) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def effective_settings(args, env=None) -> list[dict]:
    """[{name, value, origin}] for every setting a build, gc or a zero-config process uses."""
    from ..config import find_config, load_config
    from ..errors import ConfigError

    env = os.environ if env is None else env
    try:
        path = args.config or find_config()
        config = load_config(path, kernels=False, check_toolchain=False)
    except ConfigError:
        if args.config:
            raise  # the file named on the command line must be readable
        config = None
    declared = _declared(config)
    rows = [_row("project_file", config and str(config.path),
                 "--config" if args.config else "found here or above" if config else "default")]
    rows += _store_rows(args, config, declared, env)
    rows += _project_rows(config, declared)
    rows += _remote_rows(config, declared, env)
    rows += _zeroconf_rows(env)
    return rows


def _row(name: str, value, origin: str) -> dict:
    return {"name": name, "value": value, "origin": origin}


def _declared(config) -> dict:
    """The tables the project file itself sets ({"project": {...}, "store": {...}, ...}),
    to tell a value it sets from a default."""
    if config is None:
        return {}
    from ..config import parse_toml

    data = parse_toml(config.path.read_text(encoding="utf-8"), config.path)
    if config.path.name == "pyproject.toml":
        data = data.get("tool", {}).get("kbuild", {})
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def _in_file(config, declared: dict, table: str, key: str, default: str = "default") -> str:
    return f"{config.path}: [{table}] {key}" if key in declared.get(table, {}) else default


def _store_rows(args, config, declared, env) -> list[dict]:
    from ..config import default_store
    from ..store.maintenance import max_size_setting
    from ..store.trust import TRUST_ENV

    if args.store:
        origin = "--store"
    elif config is not None and config.store is not None:
        origin = _in_file(config, declared, "project", "store")
    elif env.get("KBUILD_STORE"):
        origin = "KBUILD_STORE"
    else:
        origin = "default ($XDG_CACHE_HOME or ~/.cache, then kbuild)"
    cap, cap_origin = max_size_setting(None, config, env)
    return [_row("store", str(default_store(config, args.store)), origin),
            _row("max_size", cap, cap_origin),
            _row("trusted_stores", env.get(TRUST_ENV) or None,
                 TRUST_ENV if env.get(TRUST_ENV) else "default (stores you or root own)")]


def _project_rows(config, declared) -> list[dict]:
    from ..builder import default_jobs

    if config is None:
        return [_row("arch", ["sm_80"], "default (zero-config: the device's)"),
                _row("jobs", default_jobs(), "default (usable CPUs)")]
    return [_row("name", config.name, _in_file(config, declared, "project", "name",
                                               "default (the folder's name)")),
            _row("arch", list(config.archs), _in_file(config, declared, "project", "arch")),
            _row("backend", config.backend or "numba-cuda",
                 _in_file(config, declared, "project", "backend",
                          "default (what each kernel's dispatcher is)")),
            _row("paths", [str(p) for p in config.paths],
                 _in_file(config, declared, "project", "paths")),
            _row("target_timeout", config.target_timeout,
                 _in_file(config, declared, "build", "target_timeout")),
            _row("direct", config.direct, _in_file(config, declared, "build", "direct")),
            _row("jobs", default_jobs(), "default (usable CPUs; -j N per build)")]


def _remote_rows(config, declared, env) -> list[dict]:
    from ..store.remote_settings import DEFAULT_BUDGET, remote_settings, remote_timeout
    from ..store.signing import DEFAULT_ENV

    chosen = remote_settings(config, env=env)
    timeout_origin = "KBUILD_REMOTE_TIMEOUT" if env.get("KBUILD_REMOTE_TIMEOUT") else \
        _in_file(config, declared, "store", "remote_timeout") if config else "default"
    key_env = getattr(config, "signing_key_env", None) or DEFAULT_ENV
    return [_row("remote", chosen.url if chosen else None, chosen.where if chosen else "default"),
            _row("remote_timeout", remote_timeout(config, None, env), timeout_origin),
            _row("remote_budget", float(env.get("KBUILD_REMOTE_BUDGET") or DEFAULT_BUDGET),
                 "KBUILD_REMOTE_BUDGET" if env.get("KBUILD_REMOTE_BUDGET") else "default"),
            _row("remote_read_only", env.get("KBUILD_REMOTE_READ_ONLY") == "1",
                 "KBUILD_REMOTE_READ_ONLY" if env.get("KBUILD_REMOTE_READ_ONLY") else "default"),
            _row("signing_key", "set" if env.get(key_env) else None,
                 key_env if config is None or key_env == DEFAULT_ENV
                 else f"{key_env}, named by {config.path}: [store] signing_key_env")]


def _zeroconf_rows(env) -> list[dict]:
    def from_env(name: str, variable: str, default, why: str = "default"):
        return _row(name, env.get(variable) or default, variable if env.get(variable) else why)

    return [from_env("enable", "KBUILD_ENABLE", None, "default (off)"),
            from_env("on_miss", "KBUILD_ON_MISS", "build"),
            from_env("zeroconf_arch", "KBUILD_ARCH", None, "default (the device's)")]
