"""kbuild.toml: find it, read it, validate it into a `ProjectConfig`."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

CONFIG_NAME = "kbuild.toml"

# Real GPU architectures; anything else is checked against NVRTC's list (slow, rare).
KNOWN_CCS = {(5, 0), (5, 2), (5, 3), (6, 0), (6, 1), (6, 2), (7, 0), (7, 2), (7, 5),
             (8, 0), (8, 6), (8, 7), (8, 8), (8, 9), (9, 0), (10, 0), (10, 1), (10, 3),
             (11, 0), (12, 0), (12, 1)}
_ARCH = re.compile(r"^sm_(\d+)(\d)([af]?)$")


@dataclass(frozen=True)
class KernelSpec:
    """One `[kernels."module:attr"]` table."""

    name: str
    signatures: tuple[str, ...]
    archs: tuple[str, ...]


@dataclass(frozen=True)
class ProjectConfig:
    """A validated kbuild.toml. Paths are absolute; none of them ever enters a key."""

    path: Path
    name: str
    paths: tuple[Path, ...]
    archs: tuple[str, ...]
    store: Path | None
    kernels: tuple[KernelSpec, ...]
    max_size: int | None = None  # [store] max_size, in bytes
    remote: str | None = None  # [store] remote: a shared cache URL (see remote.py)
    remote_timeout: float | None = None  # [store] remote_timeout, seconds per remote call
    signing_key_env: str | None = None  # [store] signing_key_env: the variable holding the key

    @property
    def root(self) -> Path:
        return self.path.parent


def find_config(start: Path | None = None) -> Path:
    """kbuild.toml in `start` (default: the current directory) or its nearest parent."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / CONFIG_NAME
        if candidate.is_file():
            return candidate
    raise ConfigError(f"no {CONFIG_NAME} in {here} or any parent directory; "
                      "create one or pass --config PATH")


def load_config(path: Path | str | None = None) -> ProjectConfig:
    """Read and validate a project file (found as `find_config` does when `path` is None)."""
    path = Path(path).resolve() if path else find_config()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    return _parse(path, data)


def _parse(path: Path, data: dict) -> ProjectConfig:
    project = _table(data, "project", path, required=False)
    name = _typed(project, "name", str, path, "project", default=path.parent.name)
    paths = _string_list(project, "paths", path, "project", default=["."])
    archs = tuple(validate_arch(a, f"{path}: [project] arch") for a in
                  _string_list(project, "arch", path, "project", default=["sm_80"]))
    store = _typed(project, "store", str, path, "project", default=None)
    store_table = _table(data, "store", path, required=False)
    max_size = _max_size(path, store_table)
    remote = _typed(store_table, "remote", str, path, "store", default=None)
    remote_timeout = store_table.get("remote_timeout")
    if remote_timeout is not None:
        from .store.remote import parse_timeout

        remote_timeout = parse_timeout(remote_timeout, f"{path}: [store] remote_timeout")
    signing_key_env = _typed(store_table, "signing_key_env", str, path, "store", default=None)
    kernels_table = _table(data, "kernels", path, required=True)
    if not kernels_table:
        raise ConfigError(f"{path}: [kernels] declares no kernel; "
                          'add a table like [kernels."pkg.module:kernel"]')
    kernels = tuple(_kernel(path, name_, spec, archs) for name_, spec in kernels_table.items())
    return ProjectConfig(
        path=path, name=name,
        paths=tuple((path.parent / p).resolve() for p in paths),
        archs=archs,
        store=(path.parent / store).resolve() if store else None,
        max_size=max_size,
        kernels=kernels,
        remote=remote or None,
        remote_timeout=remote_timeout,
        signing_key_env=signing_key_env or None,
    )


def _max_size(path: Path, table: dict) -> int | None:
    value = table.get("max_size")
    if value is None:
        return None
    from .store.maintenance import parse_size

    return parse_size(value, f"{path}: [store] max_size")


def _kernel(path: Path, name: str, spec, default_archs) -> KernelSpec:
    where = f'kernels."{name}"'
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: {where} must be a table with 'signatures'")
    if ":" not in name or not all(name.partition(":")[::2]):
        raise ConfigError(f"{path}: target '{name}' must be written 'module:attr.path' "
                          "(for example 'examples.saxpy:saxpy')")
    if "signatures" not in spec:
        raise ConfigError(f"{path}: target '{name}' has no 'signatures'; "
                          'add signatures = ["void(float32[::1])"]')
    signatures = _string_list(spec, "signatures", path, where, default=None)
    if not signatures:
        raise ConfigError(f"{path}: target '{name}' has an empty 'signatures' list")
    archs = spec.get("arch")
    archs = tuple(validate_arch(a, f"{path}: target '{name}' arch")
                  for a in _string_list(spec, "arch", path, where, default=None)) \
        if archs is not None else default_archs
    return KernelSpec(name=name, signatures=tuple(signatures), archs=archs)


def validate_arch(arch: str, where: str) -> str:
    """`arch` if it names a real GPU architecture (sm_XY, sm_XYa, sm_XYf), else ConfigError."""
    if not isinstance(arch, str) or not _ARCH.match(arch):
        raise ConfigError(f"{where}: unknown arch {arch!r}; write it like 'sm_80' or 'sm_90'")
    cc = arch_cc(arch)[:2]
    if cc not in KNOWN_CCS and cc not in _nvrtc_ccs():
        known = ", ".join(f"sm_{a}{b}" for a, b in sorted(KNOWN_CCS))
        raise ConfigError(f"{where}: unknown arch {arch!r}; known: {known}")
    return arch


def arch_cc(arch: str) -> tuple:
    """'sm_90' -> (9, 0); 'sm_90a' -> (9, 0, 'a')."""
    major, minor, suffix = _ARCH.match(arch).groups()
    return (int(major), int(minor), suffix) if suffix else (int(major), int(minor))


def _nvrtc_ccs():
    try:
        from numba.cuda.cudadrv import nvrtc

        return set(nvrtc.get_supported_ccs())
    except Exception:  # noqa: BLE001 - no NVRTC: only the known table counts
        return set()


def default_store(config: ProjectConfig | None, override: str | None) -> Path:
    """--store, else the file's `store`, else $KBUILD_STORE, else the per-user cache."""
    if override:
        return Path(override).resolve()
    if config is not None and config.store is not None:
        return config.store
    env = os.environ.get("KBUILD_STORE")
    if env:
        return Path(env).resolve()
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache_home) / "kbuild"


def _table(data: dict, key: str, path: Path, *, required: bool) -> dict:
    value = data.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{path}: missing [{key}] table")
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: '{key}' must be a table, not {_kind(value)}")
    return value


def _typed(table: dict, key: str, kind, path: Path, where: str, *, default):
    value = table.get(key, default)
    if value is not default and not isinstance(value, kind):
        raise ConfigError(f"{path}: [{where}] {key} must be a {kind.__name__}, not {_kind(value)}")
    return value


def _string_list(table: dict, key: str, path: Path, where: str, *, default):
    value = table.get(key, default)
    if value is default:
        return default
    if not isinstance(value, list):
        raise ConfigError(f"{path}: [{where}] {key} must be a list of strings, not {_kind(value)}")
    for i, item in enumerate(value, 1):
        if not isinstance(item, str):
            raise ConfigError(f"{path}: [{where}] {key} must be a list of strings; "
                              f"item {i} is {_kind(item)}")
    return value


def _kind(value) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
            list: "a list", dict: "a table"}.get(type(value), type(value).__name__)
