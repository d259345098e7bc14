"""Compile on a Dask distributed cluster: `kbuild build --executor dask://HOST:PORT`.

Dask workers share none of this process's imports (the local `-j` pool forks
them), so a job carries plain data from which a worker rebuilds its target:
the project's kbuild.toml and `.py` files (sent to every worker once per
build and unpacked there under their content hash), the target, the key this
machine computed for it and this machine's toolchain. The worker checks the
toolchain, plans the target, checks that it computes the same key and
compiles it with `build.compile_target`, the code path of a local build. It
returns bytes and strings; only this process writes to the store (and the
remote tier). Dask pickles the job between client and workers: that is the
executor's channel, and what travels on it is dicts, strings and bytes.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
import shutil
import sys
import threading
import uuid
from pathlib import Path

from ..keying.encode import digest_of
from ..errors import CompileError, ConfigError, KbuildError

_URL = re.compile(r"^dask://(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})/?$")
# Folders under an import root that hold no project source.
_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}


def parse_executor(text: str | None, *, timeout: float, warnings: list):
    """None for the local executor ('local' or unset), a `DaskExecutor` for dask://HOST:PORT."""
    if text in (None, "", "local"):
        return None
    match = _URL.match(text)
    if not match or not 0 < int(match["port"]) < 65536:
        raise ConfigError(f"--executor: cannot read {text!r}; write 'local' or "
                          "'dask://HOST:PORT' (for example dask://scheduler:8786)")
    if importlib.util.find_spec("distributed") is None:
        raise ConfigError(f"--executor {text} needs Dask's distributed package; "
                          "pip install 'kbuild[dask]'")
    return DaskExecutor(f"tcp://{match['host']}:{match['port']}", timeout, warnings)


class DaskExecutor:
    """Sends a build's compile jobs to the scheduler at `address`.

    `build._compile_all` asks `start(plan)` first: False (after one warning) when no
    scheduler or worker answers within `timeout`, and the build compiles locally.
    """

    def __init__(self, address: str, timeout: float, warnings: list):
        self.address, self.timeout, self.warnings = address, timeout, warnings
        self.down = False
        self._client = self._bundle = self._shipped = None

    def start(self, the_plan) -> bool:
        """Connect and send every worker the project; whether the cluster can take jobs."""
        from distributed import Client

        if self.down:
            return False
        try:
            self._client = Client(self.address, timeout=self.timeout, set_as_default=False)
            self._bundle = project_bundle(the_plan.config)
            # Every worker gets the project once, now; the jobs only name it.
            [self._shipped] = self._client.scatter([self._bundle["files"]], broadcast=True,
                                                   hash=False, timeout=self.timeout)
        except (OSError, TimeoutError) as exc:
            self.down = True
            self.close()
            self.warnings.append(f"dask scheduler {self.address} unreachable or without "
                                 f"workers ({type(exc).__name__}: {exc}); compiling here instead")
            return False
        return True

    def compile(self, the_plan, todo):
        """Yield (target, Artifacts or CompileError, seconds) as the cluster finishes them."""
        from distributed import as_completed

        client, futures = self._client, {}
        try:
            for target in todo:
                job = _job(the_plan, target, self._bundle)
                name = f"kbuild-{target.name}-{job['key'][:12]}-{uuid.uuid4().hex[:8]}"
                futures[client.submit(run_job, self._shipped, job, key=name, pure=False)] = target
            for future in as_completed(futures, loop=client.loop):
                yield (futures[future],) + _outcome(future)
        finally:
            # A caller that stops early (a failure without -k) cancels what has not run.
            client.cancel(list(futures))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = self._shipped = None


def _job(the_plan, target, bundle) -> dict:
    """One target's job, as plain data."""
    return {"bundle": bundle["digest"], "config": bundle["config"],
            "names": list(the_plan.kernels), "archs": sorted({t.arch for t in the_plan.targets}),
            # Plain-valued plan settings (such as how to link) hold on the worker too.
            "options": {f.name: getattr(the_plan, f.name) for f in dataclasses.fields(the_plan)
                        if isinstance(getattr(the_plan, f.name), (bool, int, float, str))},
            "target": [target.name, target.signature, target.arch,
                       [list(d) if isinstance(d, tuple) else d for d in target.launch]
                       if target.launch is not None else None],
            "key": the_plan.keys[target].digest,
            "fingerprint": _fingerprint()}


def _outcome(future):
    """(Artifacts or CompileError, seconds) from a finished job's plain result."""
    try:
        result = future.result()
    except Exception as exc:  # noqa: BLE001 - a worker died or could not run the job
        return CompileError(f"dask worker failed: {type(exc).__name__}: {exc}"), 0.0
    if result.get("error") is not None:
        return CompileError(result["error"]), result["seconds"]
    return from_data(result["artifacts"]), result["seconds"]


def to_data(value):
    """`value` as dicts, lists, strings, bytes and numbers: kbuild's dataclasses (the
    compiler's `Artifacts` and what it holds) by class name and fields, tuples tagged."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        return {"dataclass": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {f.name: to_data(getattr(value, f.name))
                           for f in dataclasses.fields(value)}}
    if isinstance(value, tuple):
        return {"tuple": [to_data(v) for v in value]}
    if isinstance(value, list):
        return [to_data(v) for v in value]
    if isinstance(value, dict):
        return {"dict": [[to_data(k), to_data(v)] for k, v in value.items()]}
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    raise TypeError(f"cannot send a {type(value).__name__} from a dask worker")


def from_data(data):
    """The inverse of `to_data`; only dataclasses defined in kbuild are made."""
    if isinstance(data, list):
        return [from_data(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "tuple" in data:
        return tuple(from_data(v) for v in data["tuple"])
    if "dict" in data:
        return {from_data(k): from_data(v) for k, v in data["dict"]}
    module, _, name = data["dataclass"].partition(":")
    if module.split(".")[0] != "kbuild":
        raise ValueError(f"refusing to make a {data['dataclass']} from a dask worker's result")
    cls = getattr(importlib.import_module(module), name)
    if not dataclasses.is_dataclass(cls):
        raise ValueError(f"{data['dataclass']} is not a dataclass")
    return cls(**{k: from_data(v) for k, v in data["fields"].items()})


def _plain(value):
    """Built-in types only (numba's `_OptLevel` is an int), so a job carries data, not objects."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return None if value is None else repr(value)


# -- the project, as data ------------------------------------------------------------------

def project_bundle(config) -> dict:
    """{'files': relative path -> bytes, 'config': kbuild.toml's relative path, 'digest'}.

    Paths are relative to the deepest folder holding kbuild.toml and every import
    root, so the roots keep their places relative to the file that names them.
    """
    base = Path(os.path.commonpath([config.root, *config.paths]))
    files = {config.path.relative_to(base).as_posix(): config.path.read_bytes()}
    for root in config.paths:
        for path in _python_files(root):
            files.setdefault(path.relative_to(base).as_posix(), path.read_bytes())
    return {"files": files, "config": config.path.relative_to(base).as_posix(),
            "digest": digest_of(tuple(sorted(files.items())))}


def _python_files(root: Path):
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS
                         and not os.path.exists(os.path.join(folder, d, "pyvenv.cfg")))
        for name in sorted(names):
            if name.endswith(".py"):
                yield Path(folder) / name


# -- on the worker -------------------------------------------------------------------------

_lock = threading.Lock()  # one job at a time per worker process: numba's compiler is global
_state: dict = {}  # the unpacked bundle this worker last planned: digest, root, config, keyer


def run_job(files: dict, job: dict) -> dict:
    """Plan and compile one target from plain data; {'artifacts'|'error', 'seconds'}."""
    with _lock:
        try:
            return _run_job(files, job)
        except KbuildError as exc:
            return {"error": f"on dask worker {_worker_name()}: {exc}", "seconds": 0.0}
        except Exception as exc:  # noqa: BLE001 - reported in the row, never a crash
            return {"error": f"on dask worker {_worker_name()}: {type(exc).__name__}: {exc}",
                    "seconds": 0.0}


def _run_job(files: dict, job: dict) -> dict:
    from ..build import compile_target
    from ..discover import Target

    mismatch = toolchain_mismatch(job["fingerprint"])
    if mismatch:
        return {"error": f"dask worker {_worker_name()} has another toolchain than this "
                         f"machine: {mismatch}; give the workers the same versions and "
                         "NUMBA_* settings",
                "seconds": 0.0}
    the_plan = _plan(files, job)
    name, signature, arch, launch = (list(job["target"]) + [None])[:4]
    launch = (tuple(launch[0]), tuple(launch[1]), launch[2]) if launch else None
    target = Target(name, signature, arch, launch)
    key = the_plan.keys[target].digest if target in the_plan.keys else None
    if key != job["key"]:
        return {"error": f"dask worker {_worker_name()} computes key {key} for {target.label}, "
                         f"this machine {job['key']}: the worker imports other code (a module "
                         "outside the project's import roots, or a data file?)",
                "seconds": 0.0}
    outcome, seconds = compile_target(the_plan, target)
    if isinstance(outcome, Exception):
        return {"error": str(outcome), "seconds": seconds}
    return {"artifacts": to_data(outcome), "seconds": seconds}


def _fingerprint() -> dict:
    """What a worker must share with the client to compile the client's bytes."""
    from ..backend.toolchain import codegen_config, toolchain

    return {"toolchain": toolchain(), "codegen": _plain(codegen_config())}


def toolchain_mismatch(expected: dict) -> str | None:
    """"numba-cuda '0.30.4' on the worker, '0.29.0' on the client"; ...: what differs, or None."""
    ours = _fingerprint()
    diffs = [f"{name} {mine[name]!r} on the worker, {theirs.get(name)!r} on the client"
             for part in ("toolchain", "codegen")
             for mine, theirs in [(ours[part], expected.get(part, {}))]
             for name in sorted(set(mine) | set(theirs)) if mine.get(name) != theirs.get(name)]
    return "; ".join(diffs) or None


def _plan(files: dict, job: dict):
    """The client's plan, made again here once per bundle and selection.

    All of the client's kernels are planned, in its order, before anything is
    compiled, as a local build does: the keyer hands out symbol numbers as it
    meets functions (two functions of one identity keep numba's own numbering),
    so keying in another order could give the same key other bytes.
    """
    from ..build import plan
    from ..config import load_config
    from ..keying.keys import Keyer
    from ..sources import ProjectSources

    if _state.get("digest") != job["bundle"]:
        root = _unpack(files, job["bundle"])
        if _state.get("root") is not None:  # this process's copy of an older bundle
            _forget_modules_under(_state["root"])
            shutil.rmtree(_state["root"], ignore_errors=True)
        config = load_config(root / job["config"])
        _state.clear()
        _state.update(digest=job["bundle"], root=root, config=config, plans={},
                      keyer=Keyer(ProjectSources(config.paths)))
    selection = (tuple(job["names"]), tuple(job["archs"]), tuple(sorted(job["options"].items())))
    if selection not in _state["plans"]:
        the_plan = plan(_state["config"], *selection[:2], _state["keyer"])
        for name, value in job["options"].items():
            setattr(the_plan, name, value)
        _state["plans"][selection] = the_plan
    return _state["plans"][selection]


def _unpack(files: dict, bundle_digest: str) -> Path:
    root = (_scratch() / bundle_digest).resolve()  # module __file__s are real paths
    if root.is_dir():
        return root
    bad = [rel for rel in files if rel.startswith("/") or ".." in rel.split("/")]
    if bad:
        raise KbuildError(f"refusing bundle path {bad[0]!r} (absolute or '..')")
    tmp = root.with_name(f"{bundle_digest}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for rel, data in files.items():
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    try:
        os.rename(tmp, root)  # complete or absent: another worker's copy may win
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _forget_modules_under(root: Path) -> None:
    """Drop the previous bundle's modules, so the next import reads the new sources."""
    prefix = str(root) + os.sep
    for name, module in list(sys.modules.items()):
        if (getattr(module, "__file__", None) or "").startswith(prefix):
            del sys.modules[name]
    sys.path[:] = [p for p in sys.path if not (p + os.sep).startswith(prefix)]


def _scratch() -> Path:
    """The worker's own local directory (Dask removes it), else a private temp folder."""
    try:
        from distributed import get_worker

        base = Path(get_worker().local_directory)
    except (ImportError, ValueError):
        import tempfile

        base = Path(tempfile.gettempdir()) / f"kbuild-dask-{os.getuid()}"
    path = base / "kbuild-projects"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _worker_name() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return f"pid {os.getpid()}"
