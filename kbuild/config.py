"""kbuild.toml (or pyproject.toml's [tool.kbuild]): find it, read it, validate it into a
`ProjectConfig`. Every key is known: a misspelt one is an error with a did-you-mean."""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

from .artifacts import ARCH, arch_cc
from .errors import ConfigError

CONFIG_NAME = "kbuild.toml"
# What a project builds for when its file names no `arch` (and a zero-config run none).
DEFAULT_ARCHS = ("sm_80",)
PYPROJECT = "pyproject.toml"  # its [tool.kbuild] table, when no kbuild.toml is nearer

# Every table and key a project file may hold; anything else is a typo to report.
SCHEMA = {
    "": ("project", "store", "build", "kernels"),
    "project": ("name", "paths", "arch", "store", "backend"),
    "store": ("max_size", "remote", "remote_timeout", "signing_key_env"),
    "build": ("target_timeout", "direct"),
    "kernel": ("signatures", "arch", "launch", "backend"),
    "launch": ("grid", "block", "shared"),
}

# Real GPU architectures, for messages and for when the toolchain cannot be asked
# (backend.toolchain.supported_ccs decides what is accepted).
KNOWN_CCS = {(5, 0), (5, 2), (5, 3), (6, 0), (6, 1), (6, 2), (7, 0), (7, 2), (7, 5),
             (8, 0), (8, 6), (8, 7), (8, 8), (8, 9), (9, 0), (10, 0), (10, 1), (10, 3),
             (11, 0), (12, 0), (12, 1)}


@dataclass(frozen=True)
class KernelSpec:
    """One `[kernels."module:attr"]` table."""

    name: str
    signatures: tuple[str, ...]
    archs: tuple[str, ...]
    # Launch configurations to build each signature for (a launch-config-sensitive
    # kernel, see keying/launch.py): ((grid x,y,z), (block x,y,z), shared bytes) each.
    launches: tuple = ()
    # The backend kbuild.toml names for it (its own `backend`, else the project's); None:
    # not named, the kernel object says (numba-cuda's or numba-cuda-mlir's dispatcher).
    backend: str | None = None


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
    backend: str | None = None  # [project] backend, when the file names one
    direct: bool = True  # [build] direct: answer a no-op from the journal (see `direct`)

    @property
    def backends(self) -> tuple:
        """Every backend the file names (project's and kernels'), in a fixed order."""
        return tuple(dict.fromkeys(n for n in (self.backend, *(k.backend for k in self.kernels))
                                   if n))

    @property
    def root(self) -> Path:
        return self.path.parent


def find_config(start: Path | None = None) -> Path:
    """The nearest project file from `start` (default: the current directory) upwards:
    in each folder a kbuild.toml, else a pyproject.toml with a [tool.kbuild] table."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        found = _project_file_in(folder)
        if found is not None:
            return found
    raise ConfigError(f"no {CONFIG_NAME} (nor a {PYPROJECT} with [tool.kbuild]) in {here} or "
                      "any parent directory; run `kbuild init` to write one from the kernels in your "
                      "sources, or pass --config PATH")


def project_file(folder: Path) -> Path:
    """The project file of the package in `folder` (a build backend's source tree): its
    kbuild.toml, else its pyproject.toml's [tool.kbuild]; never a parent folder's."""
    found = _project_file_in(Path(folder).resolve())
    if found is None:
        raise ConfigError(f"no {CONFIG_NAME} (nor a {PYPROJECT} with [tool.kbuild]) in "
                          f"{folder}: kbuild's build hook builds the kernels they declare")
    return found


def _project_file_in(folder: Path) -> Path | None:
    if (folder / CONFIG_NAME).is_file():
        return folder / CONFIG_NAME
    return folder / PYPROJECT if _has_tool_kbuild(folder / PYPROJECT) else None


def _has_tool_kbuild(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        text = path.read_text(encoding="utf-8")
        return "kbuild" in parse_toml(text, path).get("tool", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
        return False  # not ours to judge: a broken pyproject without kbuild in it
    except ConfigError:
        # Too deeply nested to tell: if it may be ours, it is found, and reading it says
        # what is wrong with it (rather than "no project file").
        return "kbuild" in text


# How deeply arrays and tables may nest in a project file. kbuild's own settings nest 4
# deep at most; tomllib parses nesting by recursion, so a file nested thousands deep
# would otherwise end every command, `kbuild.enable()` and `pytest -p kbuild` in a
# RecursionError.
MAX_TOML_DEPTH = 64


def parse_toml(text: str, path: Path) -> dict:
    """`text` (the file `path`) as TOML; ConfigError naming the file when it nests deeper
    than `MAX_TOML_DEPTH`. A TOMLDecodeError is the caller's to report."""
    try:
        data = tomllib.loads(text)
    except RecursionError:
        data = None
    if data is None or _depth(data) > MAX_TOML_DEPTH:
        raise ConfigError(f"{path}: arrays or tables nested more than {MAX_TOML_DEPTH} deep; "
                          "kbuild does not read a file nested that deeply: flatten them")
    return data


def _depth(value) -> int:
    """How deeply lists and tables nest in `value`, counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_TOML_DEPTH:
            return depth
        deepest = max(deepest, depth)
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, (dict, list)))
    return deepest


_MAX_LOCATED_LINES = 4000  # past this, report tomllib's own position (locating is quadratic)


def _toml_error(path: Path, exc: Exception) -> str:
    """tomllib's message, at the line where the broken statement starts.

    tomllib reports where it noticed the error: for an array or string left open it is
    wherever parsing gave up, lines later. The statement starts after the last line up to
    which the file still parses; every longer prefix fails.
    """
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if len(lines) > _MAX_LOCATED_LINES:
        return str(exc)
    start = 0
    for n in range(1, len(lines) + 1):
        try:
            tomllib.loads("".join(lines[:n]))
            start = n
        except (tomllib.TOMLDecodeError, RecursionError):
            pass
    noticed = str(exc)
    message = noticed.split(" (at ", 1)[0]
    if f"(at line {start + 1}," in noticed:
        return noticed
    return f"{message} at line {start + 1} (noticed at {noticed.rpartition('(at ')[2]}"


def load_config(path: Path | str | None = None, *, kernels: bool = True,
                check_toolchain: bool = True) -> ProjectConfig:
    """Read and validate a project file (found as `find_config` does when `path` is None).

    `kernels=False` accepts a file that declares none yet (`kbuild run --record` fills it).
    `check_toolchain=False` checks architectures by their spelling only, without asking
    the toolchain (NVRTC) which it compiles for: direct mode (`direct`) reads the file
    so, and trusts it only when its bytes are those a full run validated.
    """
    path = Path(path).resolve() if path else find_config()
    try:
        data = parse_toml(path.read_text(encoding="utf-8"), path)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; pass the path of a "
                          "kbuild.toml, or run `kbuild init` to write one") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {_toml_error(path, exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    if path.name == PYPROJECT:
        return _parse(path, _tool_table(path, data), prefix="tool.kbuild.", kernels=kernels,
                      default_name=_typed(_table(data, "project", path, required=False), "name",
                                          str, path, "project", default=path.parent.name),
                      check=check_toolchain)
    return _parse(path, data, kernels=kernels, check=check_toolchain)


def _tool_table(path: Path, data: dict) -> dict:
    tool = data.get("tool")
    if not isinstance(tool, dict) or "kbuild" not in tool:
        raise ConfigError(f"{path}: no [tool.kbuild] table; add one with the tables of a "
                          f"{CONFIG_NAME} under it ([tool.kbuild.kernels.\"pkg.mod:k\"] ...)")
    if not isinstance(tool["kbuild"], dict):
        raise ConfigError(f"{path}: 'tool.kbuild' must be a table, not {_kind(tool['kbuild'])}")
    return tool["kbuild"]


def _parse(path: Path, data: dict, prefix: str = "",
           default_name: str | None = None, kernels: bool = True,
           check: bool = True) -> ProjectConfig:
    _check_keys(path, data, SCHEMA[""], prefix.rstrip(".") or None, tables=True)
    project = _table(data, "project", path, required=False, prefix=prefix)
    _check_keys(path, project, SCHEMA["project"], f"{prefix}project")
    store_table = _table(data, "store", path, required=False, prefix=prefix)
    _check_keys(path, store_table, SCHEMA["store"], f"{prefix}store")
    name = _typed(project, "name", str, path, f"{prefix}project",
                  default=default_name or path.parent.name)
    paths = _string_list(project, "paths", path, f"{prefix}project", default=["."])
    archs = tuple(validate_arch(a, f"{path}: [{prefix}project] arch", check) for a in
                  _string_list(project, "arch", path, f"{prefix}project", default=list(DEFAULT_ARCHS)))
    store = _typed(project, "store", str, path, f"{prefix}project", default=None)
    backend = _backend(path, project, f"{prefix}project", f"{path.name} ([{prefix}project])")
    max_size = _max_size(path, store_table)
    remote = _typed(store_table, "remote", str, path, f"{prefix}store", default=None)
    remote_timeout = store_table.get("remote_timeout")
    if remote_timeout is not None:
        from .store.remote_settings import parse_timeout

        remote_timeout = parse_timeout(remote_timeout,
                                       f"{path}: [{prefix}store] remote_timeout")
    signing_key_env = _typed(store_table, "signing_key_env", str, path, f"{prefix}store",
                             default=None)
    build_table = _table(data, "build", path, required=False, prefix=prefix)
    _check_keys(path, build_table, SCHEMA["build"], f"{prefix}build")
    target_timeout = _seconds(build_table, "target_timeout", path, f"{prefix}build")
    direct = _typed(build_table, "direct", bool, path, f"{prefix}build", default=True)
    kernels_table = _table(data, "kernels", path, required=kernels, prefix=prefix)
    if not kernels_table and kernels:
        raise ConfigError(f"{path}: [{prefix}kernels] declares no kernel; "
                          f'add a table like [{prefix}kernels."pkg.module:kernel"]')
    kernels = tuple(_kernel(path, name_, spec, archs, prefix, backend, check)
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
        backend=backend,
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
            default_backend: str | None = None, check: bool = True) -> KernelSpec:
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
    launches = _launches(path, spec.get("launch"), f"{where} launch")
    backend = _backend(path, spec, where, f"target '{name}' in {path.name}") or default_backend
    return KernelSpec(name=name, signatures=tuple(signatures), archs=archs, launches=launches,
                      backend=backend)


def _launches(path: Path, value, where: str) -> tuple:
    """`launch = [{grid = 64, block = 128}, {grid = [8, 8], block = [16, 16], shared = 1024}]`:
    the launch configurations a launch-config-sensitive kernel is built for, normalized as
    numba normalizes them (3-tuples; shared memory in bytes, default 0)."""
    if value is None:
        return ()
    example = "launch = [{grid = 64, block = 128}]"
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{path}: [{where}] must be a non-empty list of tables like {example}")
    found = []
    for i, item in enumerate(value, 1):
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: [{where}] item {i} is {_kind(item)}; write {example}")
        _check_keys(path, item, SCHEMA["launch"], f"{where} item {i}")
        for key in ("grid", "block"):
            if key not in item:
                raise ConfigError(f"{path}: [{where}] item {i} has no '{key}'; write {example}")
        shared = item.get("shared", 0)
        if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
            raise ConfigError(f"{path}: [{where}] item {i}: shared must be a number of bytes "
                              f"(0 or more), not {shared!r}")
        launch = (_dims(path, item["grid"], f"{where} item {i} grid"),
                  _dims(path, item["block"], f"{where} item {i} block"), shared)
        if launch not in found:
            found.append(launch)
    return tuple(found)


def _dims(path: Path, value, where: str) -> tuple:
    """A grid or block: a positive integer or a list of 1 to 3, as a 3-tuple (numba's form)."""
    dims = value if isinstance(value, list) else [value]
    if not 1 <= len(dims) <= 3 or not all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        raise ConfigError(f"{path}: [{where}] must be a positive integer or a list of 1 to 3 "
                          f"of them (like 128 or [16, 16]), not {value!r}")
    return tuple(dims) + (1,) * (3 - len(dims))


def _backend(path: Path, table: dict, where: str, who: str) -> str | None:
    """A `backend = "..."` key: a backend kbuild knows whose package is installed (else
    one error naming the pip extra that installs it), or None when absent."""
    from .backend.backends import KNOWN, installed, missing_message

    name = _typed(table, "backend", str, path, where, default=None)
    if name is None:
        return None
    if name not in KNOWN:
        close = difflib.get_close_matches(name, list(KNOWN), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else \
            f"known: {', '.join(repr(k) for k in KNOWN)}"
        raise ConfigError(f"{path}: [{where}] unknown backend {name!r}; {hint}")
    if not installed(name):
        raise ConfigError(missing_message(name, who))
    return name


def validate_arch(arch: str, where: str, check_toolchain: bool = True) -> str:
    """`arch` if it names a GPU architecture the installed toolchain compiles for
    (sm_XY, sm_XYa, sm_XYf), else ConfigError naming the ones it does (with
    `check_toolchain=False`: one this kbuild knows, without asking the toolchain)."""
    if not isinstance(arch, str) or not ARCH.match(arch):
        raise ConfigError(f"{where}: unknown arch {arch!r}; write it like 'sm_80' or 'sm_90'")
    cc = arch_cc(arch)[:2]
    if not check_toolchain:
        if cc not in KNOWN_CCS:
            raise ConfigError(f"{where}: unknown arch {arch!r}; known: {_names(KNOWN_CCS)}")
        return arch
    from .backend import cuda_release, supported_ccs

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
