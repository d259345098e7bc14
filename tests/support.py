"""What the test modules share: `kbuild` in a subprocess, and projects built once per run.

Every kbuild process a test starts goes through `kbuild_env` (and `run`, or `kbuild_argv`
for a test that needs Popen): HOME, XDG_CACHE_HOME and NUMBA_CACHE_DIR inside a temp
folder, no KBUILD_*, NUMBA_* or PYTHONHASHSEED inherited from whoever runs the suite, and
this checkout first on PYTHONPATH, so a subprocess runs the kbuild under test even when
another one is installed.

`Template` is a project built once for the whole test run (every pytest-xdist worker
shares it) under a file lock; tests only ever get copies of its project and store.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest

import zygote

REPO_ROOT = Path(__file__).resolve().parent.parent

# Inherited variables that change what kbuild does or keys: never passed on.
_DROPPED_PREFIXES = ("KBUILD_", "NUMBA_")
_DROPPED = ("PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE")


# -- running kbuild ---------------------------------------------------------------------------

class Result(NamedTuple):
    """What one `kbuild` run gave back."""

    returncode: int
    stdout: str
    stderr: str
    json: object  # parsed stdout when --json was given, else None
    stdout_bytes: bytes


def kbuild_env(home: Path, *, store=None, env=None, bytecode: bool = True) -> dict:
    """The environment of one kbuild process, nothing of the user's cache or settings.

    `store`: KBUILD_STORE. `env`: variables to add (a value of None removes one; a
    PYTHONPATH given here comes after this checkout). `bytecode=False` turns .pyc writing
    off (an edit that keeps a file's size within the same second must never meet a stale
    .pyc); on, as a user has it, otherwise.
    """
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(_DROPPED_PREFIXES) and k not in _DROPPED}
    full.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
                NUMBA_CACHE_DIR=str(home / "numba-cache"))
    # Progress lines on a pipe come by the clock (every 5 s): a test that reads stderr must
    # not see them on a slow day. Tests of them set the interval (0: one per event).
    full["KBUILD_PROGRESS_INTERVAL"] = "3600"
    if not bytecode:
        full["PYTHONDONTWRITEBYTECODE"] = "1"
    if store is not None:
        full["KBUILD_STORE"] = str(store)
    extra = dict(env or {})
    path = [str(REPO_ROOT)] + [p for p in str(extra.pop("PYTHONPATH", "") or "").split(os.pathsep)
                               if p] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                        if p]
    full["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    for name, value in extra.items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = str(value)
    return full


def kbuild_argv(*args, launcher=("-m", "kbuild")) -> list[str]:
    """`python -m kbuild ARGS`; `launcher` replaces `-m kbuild` (`("-c", CODE)`, a script)."""
    return [sys.executable, *map(str, launcher), *map(str, args)]


# What a warm zygote imports for `run(..., warm=True)`: numba-cuda and the kbuild modules
# a `kbuild build` imports; then it takes numba's first-compile set-up (its typing and
# lowering registries loaded, what a first compile imports: `compiler.prepare`, as a
# `-j` build does before forking its workers) and indexes numba's registries (what each
# registration holds is worked out once; a child works out only the project's).
WARM = ("numba.cuda", "kbuild.cli.entry", "kbuild.cli.build_cmds", "kbuild.cli.buildflow",
        "kbuild.project", "kbuild.builder.run", "kbuild.backend.numbacuda",
        "kbuild.backend.compiler:prepare", "kbuild.backend.registrations:index")
# The same for a numba-cuda-mlir project's reference builds: numba-cuda-mlir imported too.
# Not its one-time set-up (`mlir.compiler.prepare`): its typing context, once initialized,
# never sees a registration made later (the project's overloads, registered at its import).
WARM_MLIR = WARM + ("numba_cuda_mlir", "kbuild.backend.mlir.backend")


def run(*args, cwd, home, env=None, store=None, timeout=300, launcher=("-m", "kbuild"),
        bytecode: bool = True, warm: bool | tuple = False, **popen) -> Result:
    """Run kbuild (or `launcher`) with `args` in `cwd`; see `kbuild_env` for the rest.

    A fresh process's behaviour, forked from this worker's zygote where it can be
    (`zygote.run`: `-m kbuild` and scripts; `-c`, interpreter options and Popen
    arguments run a real process). `warm=True`: from a zygote that has numba-cuda and
    kbuild imported already (`WARM`; a tuple: those modules, e.g. `WARM_MLIR`), for a
    command that needs no journal and whose output is only compared with a real
    process's (a reference build: see `zygote`'s docstring for when it serves and why
    that is sound)."""
    proc = zygote.run(kbuild_argv(*args, launcher=launcher), cwd=str(cwd),
                      env=kbuild_env(home, store=store, env=env, bytecode=bytecode),
                      timeout=timeout,
                      warm=WARM if warm is True else tuple(warm or ()), **popen)
    stdout = proc.stdout.decode("utf-8", "replace")
    parsed = json.loads(stdout) if "--json" in map(str, args) and proc.stdout.strip() else None
    return Result(proc.returncode, stdout, proc.stderr.decode("utf-8", "replace"), parsed,
                  proc.stdout)


# -- running kbuild in this process ------------------------------------------------------------

# The warning filters of a fresh interpreter (no -W, no PYTHONWARNINGS): what a `kbuild`
# process shows on stderr, where pytest would record them instead.
_FRESH_FILTERS = [("default", None, DeprecationWarning, "__main__", 0),
                  ("ignore", None, DeprecationWarning, None, 0),
                  ("ignore", None, PendingDeprecationWarning, None, 0),
                  ("ignore", None, ImportWarning, None, 0),
                  ("ignore", None, ResourceWarning, None, 0)]

# What cannot be set for a command run in this process: read once when this process
# started (numba's configuration, the hash seed, the import path).
_FIXED_AT_START = ("NUMBA_", "PYTHONHASHSEED", "PYTHONPATH", "PYTHONSAFEPATH", "PYTHONWARNINGS")


def run_in_process(*args, cwd, home, env=None, store=None, bytecode: bool = True,
                   timeout=None) -> Result:
    """`run`, without a new process: `kbuild.cli.main(args)` here, with the environment
    `kbuild_env` gives a subprocess, `cwd` as the working directory, and stdout/stderr
    captured as a pipe would (not a terminal). Everything the command changed in this
    process is put back afterwards: the environment, the working directory, `sys.path`,
    the project's modules (as `kbuild watch` drops them between builds), the objects the
    backend compiled, lock descriptors still open (a process's exit would close them),
    signal handlers and the warning filters.

    For what a subprocess proves nothing more about: exit codes, messages, JSON, store
    contents. Keep `run` for a fresh process: start-up, direct mode (the journal answers
    only a run that imported no numba before it started), hash seeds, signals, bytecode,
    a file edited back to its size and mtime. A NUMBA_* or PYTHON* variable in `env` (read
    when this process started) sends the command to `run`, as does a call from another
    thread. `timeout` is not enforced here.
    """
    import threading

    # The environment and the working directory are the process's: one command at a time,
    # from the main thread (signal handlers can only be set there).
    if any(k.startswith(_FIXED_AT_START) for k in (env or {})) or \
            threading.current_thread() is not threading.main_thread():
        return run(*args, cwd=cwd, home=home, env=env, store=store, bytecode=bytecode,
                   timeout=timeout or 300)
    # NUMBA_CACHE_DIR, PYTHONPATH and the like: as this process has them (and numba read them)
    full = {k: v for k, v in kbuild_env(home, store=store, env=env, bytecode=bytecode).items()
            if not k.startswith(_FIXED_AT_START)}
    full.update({k: v for k, v in os.environ.items() if k.startswith(_FIXED_AT_START)})
    out, err = _captured(), _captured(errors="backslashreplace")
    with _isolated(full, cwd, bytecode, out, err):
        from kbuild.cli import main

        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # what `run()` would exit with
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    stdout_bytes, stderr = _read(out), _read(err).decode("utf-8", "replace")
    stdout = stdout_bytes.decode("utf-8", "replace")
    parsed = json.loads(stdout) if "--json" in map(str, args) and stdout.strip() else None
    return Result(code, stdout, stderr, parsed, stdout_bytes)


@pytest.fixture(scope="module", name="run_kbuild")
def run_kbuild_in_process(kbuild_here):
    """`run_kbuild` for a module whose commands need no fresh process: imported by name
    (`from support import run_kbuild_in_process`), it replaces conftest's `run_kbuild`
    with `kbuild_here` (in this process) for that module's tests and fixtures."""
    return kbuild_here


def _captured(errors: str = "strict"):
    import io

    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors=errors, newline=None,
                            write_through=True)


def _read(stream) -> bytes:
    stream.flush()
    return stream.buffer.getvalue()


@contextmanager
def _isolated(environ: dict, cwd, bytecode: bool, out, err):
    import gc
    import signal
    import warnings

    saved_env, saved_cwd, saved_path = dict(os.environ), os.getcwd(), list(sys.path)
    saved_modules = set(sys.modules)
    saved_streams = (sys.stdout, sys.stderr)
    saved_bytecode = sys.dont_write_bytecode
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGALRM,
                                                     signal.SIGTERM)}
    original_environ = os.environ
    try:
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        sys.dont_write_bytecode = not bytecode
        sys.stdout, sys.stderr = out, err
        with warnings.catch_warnings():
            warnings.filters[:] = list(_FRESH_FILTERS)
            warnings.showwarning = _show_warning
            yield
    finally:
        sys.stdout, sys.stderr = saved_streams
        os.environ = original_environ  # a journal recorder swaps it while it runs
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.path[:] = saved_path
        sys.dont_write_bytecode = saved_bytecode
        for sig, handler in saved_signals.items():
            signal.signal(sig, handler)
        _forget_what_the_command_left(saved_modules)
        gc.collect()


def _show_warning(message, category, filename, lineno, file=None, line=None):
    import warnings

    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _forget_what_the_command_left(saved_modules: set) -> None:
    """What a `kbuild` process leaves behind only by exiting: the project's modules, the
    objects the backend compiled (reused by the next compile of the process), lock
    descriptors."""
    from kbuild.discover import forget_project_modules
    from kbuild.store import locks

    forget_project_modules()
    ours = (sys.prefix, sys.base_prefix, str(REPO_ROOT / "kbuild"))
    for name in set(sys.modules) - saved_modules:
        module = sys.modules.get(name)
        where = getattr(module, "__file__", None) or ""
        if where and not where.startswith(ours):  # the project's, or a plugin of a test's
            del sys.modules[name]
    lto = sys.modules.get("kbuild.backend.lto")
    if lto is not None:
        lto.forget(lto.made_keys())
    for fd in list(locks.HELD):
        locks.HELD.discard(fd)
        os.close(fd)


# -- counting work in a kbuild process ----------------------------------------------------------

# `python -c COUNTING ARGS` runs the CLI with `module:attribute` callables (named in
# TEST_COUNT_WHAT, comma-separated) wrapped to append their name to TEST_COUNT_FILE when
# called, in this process and in the workers it forks. A count of work, never a clock.
COUNTING = """
import importlib, os

_FILE = os.environ["TEST_COUNT_FILE"]  # read now: a read during a compile would be keyed

def _wrap(spec):
    module_name, _, dotted = spec.partition(":")
    owner = importlib.import_module(module_name)
    *path, name = dotted.split(".")
    for part in path:
        owner = getattr(owner, part)
    real = getattr(owner, name)

    def counted(*args, **kwargs):
        fd = os.open(_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, (spec + "\\n").encode())
        finally:
            os.close(fd)
        return real(*args, **kwargs)

    setattr(owner, name, counted)

for _spec in filter(None, os.environ["TEST_COUNT_WHAT"].split(",")):
    _wrap(_spec)
import runpy
runpy.run_module("kbuild", run_name="__main__", alter_sys=True)  # python -m kbuild ARGS
"""

NVVM_COMPILE = "numba.cuda.cudadrv.nvvm:compile_ir"


def counting(file: Path, *what: str) -> dict:
    """The `launcher` and `env` of a kbuild run that counts calls of `what` into `file`."""
    return {"launcher": ("-c", COUNTING),
            "env": {"TEST_COUNT_FILE": str(file), "TEST_COUNT_WHAT": ",".join(what)}}


def counts(file: Path) -> dict:
    """name -> how many times it was called, from a file `counting` wrote (none: {})."""
    found: dict = {}
    if file.exists():
        for line in file.read_text().split():
            found[line] = found.get(line, 0) + 1
    return found


# -- built once per test run --------------------------------------------------------------------

# The HOME every edit-matrix run shares (set by conftest for the whole test run): HOME and
# NUMBA_CACHE_DIR below it are read while keying, so runs that differ in them could never
# answer from one another's journal (direct mode).
SHARED_HOME = "KBUILD_TESTS_SHARED_HOME"


def shared_home() -> Path | None:
    """The HOME the test run's kbuild processes share, where they should (None: unset)."""
    value = os.environ.get(SHARED_HOME)
    return Path(value) if value else None


def shared_dir(tmp_path_factory) -> Path:
    """A folder every pytest-xdist worker of this run shares (pytest's own under -n 0)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder; each worker's basetemp is a folder in it
    return base / "kbuild-templates"


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@dataclass(frozen=True)
class Template:
    """A project and the store one cold build of it filled, with what the build printed.
    Read-only: tests take copies (`copy_to`)."""

    project: Path
    store: Path
    result: Result

    @property
    def json(self) -> dict:
        return self.result.json

    def copy_to(self, project: Path, store: Path) -> tuple[Path, Path]:
        """A private copy of the project (without bytecode caches) and of the store."""
        shutil.copytree(self.project, project, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copytree(self.store, store, symlinks=True)
        return project, store


def template(shared: Path, name: str, make, expect_rc: int = 0) -> Template:
    """The template `name`, built by `make(project_dir, store_dir) -> Result` the first time
    any worker of this run asks for it; the others wait for it, then reuse it.

    A build that does not exit `expect_rc` raises (in every worker that asks) and leaves no
    template behind.
    """
    where = shared / name
    done = where / "done.json"
    with _locked(shared / f"{name}.lock"):
        if not done.exists():
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir(parents=True)
            result = make(where / "project", where / "store")
            assert result.returncode == expect_rc, \
                f"building template {name} exited {result.returncode}:\n{result.stderr}"
            done.write_text(json.dumps({"returncode": result.returncode,
                                        "stdout": result.stdout, "stderr": result.stderr}))
            with open(shared / "cold-builds.log", "a") as log:  # how often the suite built
                log.write(f"{name} {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\n")
    saved = json.loads(done.read_text())
    stdout = saved["stdout"]
    parsed = json.loads(stdout) if stdout.lstrip().startswith("{") else None
    return Template(where / "project", where / "store",
                    Result(saved["returncode"], stdout, saved["stderr"], parsed,
                           stdout.encode()))
