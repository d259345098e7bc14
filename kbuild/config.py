"""kbuild.toml (or pyproject.toml's [tool.kbuild]): find it, read it, validate it into a
`ProjectConfig`. Every key is known: a misspelt one is an error with a did-you-mean."""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

CONFIG_NAME = "kbuild.toml"
PYPROJECT = "pyproject.toml"  # its [tool.kbuild] table, when no kbuild.toml is nearer

# Every table and key a project file may hold; anything else is a typo to report.
SCHEMA = {
    "": ("project", "store", "build", "kernels"),
    "project": ("name", "paths", "arch", "store"),
    "store": ("max_size", "remote", "remote_timeout", "signing_key_env"),
    "build": ("target_timeout", "direct"),
    "kernel": ("signatures", "arch"),
}

# Real GPU architectures, for messages and for when the toolchain cannot be asked
# (backend.toolchain.supported_ccs decides what is accepted).
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
    target_timeout: float | None = None  # [build] target_timeout: seconds a compile may take
    direct: bool = True  # [build] direct: answer a no-op from the journal (see `direct`)

    @property
    def root(self) -> Path:
        return self.path.parent


def find_config(start: Path | None = None) -> Path:
    """The nearest project file from `start` (default: the current directory) upwards:
    in each folder a kbuild.toml, else a pyproject.toml with a [tool.kbuild] table."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / CONFIG_NAME
        if candidate.is_file():
            return candidate
        if _has_tool_kbuild(folder / PYPROJECT):
            return folder / PYPROJECT
    raise ConfigError(f"no {CONFIG_NAME} (nor a {PYPROJECT} with [tool.kbuild]) in {here} or "
                      "any parent directory; create one or pass --config PATH")


def _has_tool_kbuild(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        return "kbuild" in tomllib.loads(path.read_text(encoding="utf-8")).get("tool", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
        return False  # not ours to judge: a broken pyproject without kbuild in it


def load_config(path: Path | str | None = None, *, check_toolchain: bool = True) -> ProjectConfig:
    """Read and validate a project file (found as `find_config` does when `path` is None).

    `check_toolchain=False` checks architectures by their spelling only, without asking
    the toolchain (NVRTC) which it compiles for: direct mode (`direct`) reads the file
    so, and trusts it only when its bytes are those a full run validated.
    """
    path = Path(path).resolve() if path else find_config()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    if path.name == PYPROJECT:
        return _parse(path, _tool_table(path, data), prefix="tool.kbuild.",
                      default_name=_typed(_table(data, "project", path, required=False), "name",
                                          str, path, "project", default=path.parent.name),
                      check=check_toolchain)
    return _parse(path, data, check=check_toolchain)


def _tool_table(path: Path, data: dict) -> dict:
    tool = data.get("tool")
    if not isinstance(tool, dict) or "kbuild" not in tool:
        raise ConfigError(f"{path}: no [tool.kbuild] table; add one with the tables of a "
                          f"{CONFIG_NAME} under it ([tool.kbuild.kernels.\"pkg.mod:k\"] ...)")
    if not isinstance(tool["kbuild"], dict):
        raise ConfigError(f"{path}: 'tool.kbuild' must be a table, not {_kind(tool['kbuild'])}")
    return tool["kbuild"]


def _parse(path: Path, data: dict, prefix: str = "",
           default_name: str | None = None, check: bool = True) -> ProjectConfig:
    _check_keys(path, data, SCHEMA[""], prefix.rstrip(".") or None, tables=True)
    project = _table(data, "project", path, required=False, prefix=prefix)
    _check_keys(path, project, SCHEMA["project"], f"{prefix}project")
    store_table = _table(data, "store", path, required=False, prefix=prefix)
    _check_keys(path, store_table, SCHEMA["store"], f"{prefix}store")
    name = _typed(project, "name", str, path, f"{prefix}project",
                  default=default_name or path.parent.name)
    paths = _string_list(project, "paths", path, f"{prefix}project", default=["."])
    archs = tuple(validate_arch(a, f"{path}: [{prefix}project] arch", check) for a in
                  _string_list(project, "arch", path, f"{prefix}project", default=["sm_80"]))
    store = _typed(project, "store", str, path, f"{prefix}project", default=None)
    max_size = _max_size(path, store_table)
    remote = _typed(store_table, "remote", str, path, f"{prefix}store", default=None)
    remote_timeout = store_table.get("remote_timeout")
    if remote_timeout is not None:
        from .store.remote import parse_timeout

        remote_timeout = parse_timeout(remote_timeout,
                                       f"{path}: [{prefix}store] remote_timeout")
    signing_key_env = _typed(store_table, "signing_key_env", str, path, f"{prefix}store",
                             default=None)
    build_table = _table(data, "build", path, required=False, prefix=prefix)
    _check_keys(path, build_table, SCHEMA["build"], f"{prefix}build")
    target_timeout = _seconds(build_table, "target_timeout", path, f"{prefix}build")
    direct = _typed(build_table, "direct", bool, path, f"{prefix}build", default=True)
    kernels_table = _table(data, "kernels", path, required=True, prefix=prefix)
    if not kernels_table:
        raise ConfigError(f"{path}: [{prefix}kernels] declares no kernel; "
                          f'add a table like [{prefix}kernels."pkg.module:kernel"]')
    kernels = tuple(_kernel(path, name_, spec, archs, prefix, check)
                    for name_, spec in kernels_table.items())
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
        target_timeout=target_timeout,
        direct=direct,
    )


def _check_keys(path: Path, table: dict, known, where: str | None, tables: bool = False):
    """ConfigError for the first key of `table` not in `known`, with a did-you-mean."""
    for key in table:
        if key in known:
            continue
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        shown = (lambda k: f"[{where + '.' if where else ''}{k}]") if tables else repr
        hint = f"did you mean {shown(close[0])}?" if close else \
            f"known: {', '.join(shown(k) for k in known)}"
        what = f"table {shown(key)}" if tables else f"key {key!r} in [{where}]"
        raise ConfigError(f"{path}: unknown {what}; {hint}")


def _seconds(table: dict, key: str, path: Path, where: str) -> float | None:
    """A positive number of seconds, or None when the key is absent."""
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{path}: [{where}] {key} must be a positive number of seconds "
                          f"(like 600), not {value!r}")
    return float(value)


def _max_size(path: Path, table: dict) -> int | None:
    value = table.get("max_size")
    if value is None:
        return None
    from .store.maintenance import parse_size

    return parse_size(value, f"{path}: [store] max_size")


def _kernel(path: Path, name: str, spec, default_archs, prefix: str = "",
            check: bool = True) -> KernelSpec:
    where = f'{prefix}kernels."{name}"'
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: {where} must be a table with 'signatures'")
    _check_keys(path, spec, SCHEMA["kernel"], where)
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
    archs = tuple(validate_arch(a, f"{path}: target '{name}' arch", check)
                  for a in _string_list(spec, "arch", path, where, default=None)) \
        if archs is not None else default_archs
    return KernelSpec(name=name, signatures=tuple(signatures), archs=archs)


def validate_arch(arch: str, where: str, check_toolchain: bool = True) -> str:
    """`arch` if it names a GPU architecture the installed toolchain compiles for
    (sm_XY, sm_XYa, sm_XYf), else ConfigError naming the ones it does (with
    `check_toolchain=False`: one this kbuild knows, without asking the toolchain)."""
    if not isinstance(arch, str) or not _ARCH.match(arch):
        raise ConfigError(f"{where}: unknown arch {arch!r}; write it like 'sm_80' or 'sm_90'")
    cc = arch_cc(arch)[:2]
    if not check_toolchain:
        if cc not in KNOWN_CCS:
            raise ConfigError(f"{where}: unknown arch {arch!r}; known: {_names(KNOWN_CCS)}")
        return arch
    from .backend.toolchain import cuda_release, supported_ccs

    supported = supported_ccs()
    if supported is None:
        if cc not in KNOWN_CCS:
            raise ConfigError(f"{where}: unknown arch {arch!r}; known: {_names(KNOWN_CCS)}")
        return arch
    toolchain = f"CUDA {cuda_release() or '?'} NVVM"
    if cc not in supported and cc not in KNOWN_CCS:
        raise ConfigError(f"{where}: unknown arch {arch!r}; {toolchain} supports "
                          f"{_names(supported)}")
    if cc not in supported:
        raise ConfigError(f"{where}: arch {arch!r} is not supported by this toolchain "
                          f"({toolchain}); supported: {_names(supported)}")
    return arch


def _names(ccs) -> str:
    return ", ".join(f"sm_{a}{b}" for a, b in sorted(ccs))


def arch_cc(arch: str) -> tuple:
    """'sm_90' -> (9, 0); 'sm_90a' -> (9, 0, 'a')."""
    major, minor, suffix = _ARCH.match(arch).groups()
    return (int(major), int(minor), suffix) if suffix else (int(major), int(minor))


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


def _table(data: dict, key: str, path: Path, *, required: bool, prefix: str = "") -> dict:
    value = data.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{path}: missing [{prefix}{key}] table")
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: '{prefix}{key}' must be a table, not {_kind(value)}")
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
