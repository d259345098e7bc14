"""Compile on a Dask distributed cluster: `kbuild build --executor dask://HOST:PORT`.

Dask workers share none of this process's imports (the local `-j` pool forks
them), so a job carries plain data from which a worker rebuilds its target:
the project's kbuild.toml and `.py` files (sent to every worker once per
build and unpacked there under their content hash), the job the build made
(the target, the key this machine computed for it) and this machine's
toolchain. The worker checks the toolchain, unpacks the project and runs the
build's own job function on it (`builder.cluster.run_job`, handed to `compile`
by the build: this executor runs jobs, it knows nothing of planning or
compiling). It returns bytes and strings; only this process writes to the
store (and the remote tier). Dask pickles the job between client and workers
(the job function by its module and name): that is the executor's channel,
and what travels on it is dicts, strings and bytes.
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

from ..errors import CompileError, ConfigError, KbuildError
from ..keying.encode import digest, digest_of

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

    The build asks `start(config)` first: False (after one warning) when no scheduler
    or worker answers within `timeout`, and the build compiles locally.
    """

    def __init__(self, address: str, timeout: float, warnings: list):
        self.address, self.timeout, self.warnings = address, timeout, warnings
        self.down = False
        self._client = self._bundle = self._shipped = None

    def start(self, config) -> bool:
        """Connect and send every worker the project of `config` (its kbuild.toml and
        sources); whether the cluster can take jobs."""
        from distributed import Client

        if self.down:
            return False
        try:
            self._client = Client(self.address, timeout=self.timeout, set_as_default=False)
            self._bundle = project_bundle(config)
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

    def compile(self, jobs, run):
        """Yield (target, Artifacts or CompileError, seconds) as the cluster finishes them.

        `jobs`: (target, job) pairs, a job plain data with the target's `key`; a worker
        runs `run(files, job)` (a module-level function: Dask sends it by name), which
        returns {'artifacts' (as `to_data`) | 'error', 'seconds'}.
        """
        from distributed import as_completed

        client, futures = self._client, {}
        try:
            for target, job in jobs:
                job = dict(job, bundle=self._bundle["digest"], config=self._bundle["config"],
                           fingerprint=_fingerprint())
                name = f"kbuild-{target.name}-{job['key'][:12]}-{uuid.uuid4().hex[:8]}"
                futures[client.submit(run, self._shipped, job, key=name, pure=False)] = target
            for future in as_completed(futures, loop=client.loop):
                yield (futures[future],) + _outcome(future)
        finally:
            # A caller that stops early (a failure without -k) cancels what has not run.
            client.cancel(list(futures))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = self._shipped = None


def _outcome(future):
    """(Artifacts or CompileError, seconds) from a finished job's plain result. The bytes
    must be those the worker hashed (`blob_digests`); what they are is the build's to
    check (`builder.cluster.checked`) before anything is stored."""
    try:
        result = future.result()
    except Exception as exc:  # noqa: BLE001 - a worker died or could not run the job
        return CompileError(f"dask worker failed: {type(exc).__name__}: {exc}"), 0.0
    try:
        seconds = float(result.get("seconds") or 0.0)
        if result.get("error") is not None:
            return CompileError(str(result["error"])), seconds
        data = result["artifacts"]
        intact = result.get("digests") == blob_digests(data)
        artifacts = from_data(data)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        return CompileError(f"dask worker returned a malformed result ({type(exc).__name__}: "
                            f"{str(exc)[:200]}); nothing of it is stored"), 0.0
    if not intact:
        return CompileError("dask worker's result arrived with bytes that do not match the "
                            "hashes the worker sent; nothing of it is stored"), seconds
    return artifacts, seconds


def blob_digests(data) -> list:
    """kbuild's hash of every bytes value in `data` (a `to_data` tree), in order: a worker
    sends them beside its result, and the client checks the bytes against them."""
    if isinstance(data, bytes):
        return [digest(data)]
    if isinstance(data, dict):
        data = list(data.values())
    if isinstance(data, list):
        return [d for value in data for d in blob_digests(value)]
    return []


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
_state: dict = {}  # the unpacked project this worker last ran jobs of: digest, root, memo


def serve_job(files: dict, job: dict, compile_job) -> dict:
    """On a worker: run one job on the project in `files`; {'artifacts'|'error', 'seconds'}.

    The toolchain must be the client's (`job['fingerprint']`); then `compile_job(root,
    job, memo)` gives (Artifacts or an exception, seconds), with `root` the unpacked
    project and `memo` a dict kept for that project's jobs (emptied for another one).
    """
    with _lock:
        try:
            return _serve_job(files, job, compile_job)
        except KbuildError as exc:
            return {"error": f"on dask worker {worker_name()}: {exc}", "seconds": 0.0}
        except Exception as exc:  # noqa: BLE001 - reported in the row, never a crash
            return {"error": f"on dask worker {worker_name()}: {type(exc).__name__}: {exc}",
                    "seconds": 0.0}


def _serve_job(files: dict, job: dict, compile_job) -> dict:
    mismatch = toolchain_mismatch(job["fingerprint"])
    if mismatch:
        return {"error": f"dask worker {worker_name()} has another toolchain than this "
                         f"machine: {mismatch}; give the workers the same versions and "
                         "NUMBA_* settings",
                "seconds": 0.0}
    root, memo = _project(files, job["bundle"])
    outcome, seconds = compile_job(root, job, memo)
    if isinstance(outcome, Exception):
        return {"error": str(outcome), "seconds": seconds}
    data = to_data(outcome)
    return {"artifacts": data, "digests": blob_digests(data), "seconds": seconds}


def _fingerprint(backend_names=None) -> dict:
    """What a worker must share with the client to compile the client's bytes: numba-cuda's
    toolchain, and that of every other backend the client loaded (`backend_names`: those)."""
    from ..backend.backends import DEFAULT, get, loaded

    numba_cuda = get(DEFAULT)
    found = {"toolchain": numba_cuda.toolchain(),
             "codegen": _plain(numba_cuda.process_config())}
    others = loaded() if backend_names is None else [get(n) for n in backend_names]
    for backend in others:
        if backend.name != DEFAULT:
            found[f"toolchain {backend.name}"] = backend.toolchain()
            found[f"codegen {backend.name}"] = _plain(backend.process_config())
    return found


def toolchain_mismatch(expected: dict) -> str | None:
    """"numba-cuda '0.30.4' on the worker, '0.29.0' on the client"; ...: what differs, or None."""
    from ..backend.backends import KNOWN, MissingBackend

    names = [n for n in KNOWN if f"toolchain {n}" in expected]
    try:
        ours = _fingerprint(names)
    except MissingBackend as exc:
        return str(exc)
    diffs = [f"{name} {mine[name]!r} on the worker, {theirs.get(name)!r} on the client"
             for part in sorted(set(ours) | set(expected))
             for mine, theirs in [(ours.get(part, {}), expected.get(part, {}))]
             for name in sorted(set(mine) | set(theirs)) if mine.get(name) != theirs.get(name)]
    return "; ".join(diffs) or None


def _project(files: dict, bundle_digest: str):
    """(root, memo) of the project in `files`, unpacked once per bundle; the previous
    bundle's copy and modules go when another one comes."""
    if _state.get("digest") != bundle_digest:
        root = _unpack(files, bundle_digest)
        if _state.get("root") is not None:  # this process's copy of an older bundle
            _forget_modules_under(_state["root"])
            shutil.rmtree(_state["root"], ignore_errors=True)
        _state.clear()
        _state.update(digest=bundle_digest, root=root, memo={})
    return _state["root"], _state["memo"]


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
    for name, module in sys.modules.copy().items():
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


def worker_name() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return f"pid {os.getpid()}"
