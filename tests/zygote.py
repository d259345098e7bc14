"""A fork server for the tests' `python -m kbuild ...` and `python script.py` processes.

Most of the suite's time is processes, and most of a process's start-up is importing
numba's dependencies (numpy, llvmlite, yaml, cffi, the CUDA bindings, a few hundred
standard-library modules). The zygote is one long-lived process per pytest worker that
imports those once, then forks a child per request; the child becomes the requested
process (environment, working directory, argv, import path, standard streams) and runs
the module or script with runpy, as the interpreter's `-m` / script start would.

Why a child is the process a test asked for:
- The zygote imports nothing of kbuild, of a project under test, or of numba itself:
  only what `import numba.cuda` imports besides numba (found by importing it in a
  throw-away child). kbuild's own soundness contract already allows those before it
  starts (direct mode journals a run only when nothing of numba was imported before its
  recorder started, `kbuild/direct/recorder.py`); numba reads its settings (NUMBA_*,
  `.numba_config.yaml`) in the child, from the child's environment and directory.
- A request is served only when the zygote's imports cannot differ from a fresh
  process's: the same interpreter and no interpreter options (`-m MODULE` or a script);
  every environment variable the imports could read equal to the zygote's (only
  variables read after start-up may differ: `_AFTER_START`); no KBUILD_ENABLE (the
  site's .pth would start zero-config at start-up); no folder put before site-packages
  (the script's folder or cwd, PYTHONPATH) holding a module of a pre-imported name.
  Anything else runs as a real subprocess.
- The child sets `os.environ` to exactly the requested environment, `sys.path` to what a
  fresh interpreter computes (`test_zygote.py` compares the two), the import caches
  emptied (folders are listed again, as a fresh process lists them),
  `sys.dont_write_bytecode` from PYTHONDONTWRITEBYTECODE, `random` and numpy's global
  generator reseeded; fds 0/1/2 are the caller's (its stdin, and pipes it reads to EOF,
  as `subprocess.run(capture_output=True)` does, so a grandchild holding them is waited
  for). Exit: SystemExit's code, 1 and the traceback for an exception, a re-raised
  SIGINT for KeyboardInterrupt; then threads joined, atexit handlers run, streams
  flushed (120 when that fails), as the interpreter's own exit does.
- What stays different: the hash seed is the zygote's (one per worker, not one per
  process; a test that sets PYTHONHASHSEED gets a real process), `sys.flags` and
  `sys.orig_argv` are the zygote's, and a traceback shows no `<frozen runpy>` frames.

A warm zygote (`run(..., warm=MODULES)`, asked for explicitly, never the default) also
imports MODULES (numba.cuda, kbuild; an entry `module:function` also calls the function:
numba's first-compile set-up, the index of its registries), for processes that need no
journal: the matrices'
reference builds, a fresh build of an edited project into an empty store that is only
compared with the incremental build's artifacts. Numba reads its settings at import, so a
warm zygote is started from the environment of the request that needs it and serves only
requests that could not have imported anything else:
- every environment variable equal to the zygote's start environment (NUMBA_*, CUDA_*,
  HOME, PYTHONPATH and the rest) but those that neither numba nor kbuild nor their
  dependencies read at import (`_WARM_AFTER_START`: kbuild's own KBUILD_*, the tests'
  TEST_* / HARNESS_* / PYTEST_*, PWD; test_zygote.py checks the imports read none); a
  request whose environment differs gets a warm zygote started from its own (one per
  worker and module list, started again when the environment changes);
- no `.numba_config.yaml` in its working directory, in the folder of a file or folder
  its argv names (the project's `--config`), or in `/` (the zygote's own working
  directory when it imported numba, which reads the file from there);
- no folder before the zygote's path (the working directory of `-m`, the script's
  folder) holding a module of a pre-imported name.
Why a reference it made that differed from a real process's could never hide a stale
binary: the zygote imported nothing of the project, its vendored packages or the edit,
and read its settings from the same environment and no numba config file, so nothing it
holds can make the edited project compile to the bytes from before the edit. A reference
that still differed from a real process's (numba state left by an import) differs from
what the baseline built, and the matrix's comparison fails loudly.

Tests of a fresh process itself (start-up, imports counted, `python -c`, interpreter
flags) never come here: `python -c` and options are always real. KBUILD_TEST_NO_ZYGOTE=1
runs every process for real (test_zygote.py still checks the zygote itself).
"""

from __future__ import annotations

import json
import os
import sys

OFF = "KBUILD_TEST_NO_ZYGOTE"
# Variables read only after start-up (by kbuild, numba, the tests' programs), never by
# what the zygote imported: they may differ between the zygote and a request.
_AFTER_START_PREFIXES = ("KBUILD_", "NUMBA_", "TEST_", "HARNESS_", "PYTEST_")
_AFTER_START = frozenset({"HOME", "XDG_CACHE_HOME", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE",
                          "PWD", "OLDPWD"})
_HEADER = 8
# What a warm zygote's imports (numba, kbuild) never read: its requests may differ in them.
_WARM_AFTER_START_PREFIXES = ("KBUILD_", "TEST_", "HARNESS_", "PYTEST_")
_WARM_AFTER_START = frozenset({"PWD", "OLDPWD", "PYTHONDONTWRITEBYTECODE"})
NUMBA_CONFIG = ".numba_config.yaml"


def _after_start(name: str) -> bool:
    return name in _AFTER_START or name.startswith(_AFTER_START_PREFIXES)


def _warm_after_start(name: str) -> bool:
    return name in _WARM_AFTER_START or name.startswith(_WARM_AFTER_START_PREFIXES)


def _numba_own(name: str) -> bool:
    return name.split(".")[0].startswith(("numba", "_numba"))


def _message(sock, body: dict, fds=()) -> None:
    import socket

    data = json.dumps(body).encode()
    socket.send_fds(sock, [len(data).to_bytes(_HEADER, "big")], list(fds))
    sock.sendall(data)


def _receive(sock, nfds: int = 0):
    import socket

    head, fds, _, _ = socket.recv_fds(sock, _HEADER, nfds)
    if len(head) < _HEADER:
        raise EOFError("the zygote's peer closed")
    size, data = int.from_bytes(head, "big"), b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the zygote's peer closed")
        data += chunk
    return json.loads(data), fds


# -- the zygote --------------------------------------------------------------------------------

def _discover() -> list:
    """The modules `import numba.cuda` imports besides numba's own, in import order
    (imported in a throw-away child, so this process never imports numba)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        before = set(sys.modules)
        try:
            import numba.cuda  # noqa: F401
            names = [m for m in sys.modules if m not in before and not _numba_own(m)
                     and m != "__mp_main__"]
        except BaseException:  # noqa: BLE001 - nothing to pre-import, then
            names = []
        os.write(write, json.dumps(names).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        names = json.loads(fh.read() or b"[]")
    os.waitpid(pid, 0)
    return names


def _preimport() -> None:
    import importlib

    for name in _discover():
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - a fresh process imports it, or fails, itself
                pass
    if any(_numba_own(m) and m != "_numba_cuda_redirector" for m in sys.modules):
        sys.exit("a module numba imports imported numba itself: no zygote")


def serve(fd: int, warm=()) -> None:
    """The zygote: pre-import (and import the modules `warm`), then fork a child per
    request on the socket `fd`."""
    import importlib
    import socket

    del sys.path[0]  # this script's folder (tests/): nothing is imported from it
    _preimport()
    for name in warm:  # a failure ends the zygote: its requests run for real
        module, _, call = name.partition(":")
        done = importlib.import_module(module)
        if call:  # a set-up step every child would take first, taken once here
            getattr(done, call)()
    sock = socket.socket(fileno=fd)
    zygote_path = list(sys.path)
    for stream in (sys.stdout, sys.stderr):  # nothing of the imports' reaches a child
        stream.flush()
    import site

    _message(sock, {"top": sorted({m.split(".")[0] for m in sys.modules}), "path": zygote_path,
                    "user_site": bool(site.ENABLE_USER_SITE),
                    "pythonpath": os.environ.get("PYTHONPATH", "")})
    while True:
        try:
            request, fds = _receive(sock, 3)
        except EOFError:
            return
        pid = os.fork()
        if pid == 0:
            sock.close()
            _child(request, fds, zygote_path, os.environ.get("PYTHONPATH", ""))
        for fd_ in fds:
            os.close(fd_)
        _message(sock, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _message(sock, {"status": status})


def _child(request: dict, fds, zygote_path: list, own_pythonpath: str) -> None:
    """Become the requested process and run it; never returns."""
    import importlib
    import random
    import signal

    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    signal.signal(signal.SIGINT, signal.SIG_IGN if request.get("sigint_ignored")
                  else signal.default_int_handler)
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    # A warm zygote's path already holds its PYTHONPATH's folders (the request's)
    extra = [] if env.get("PYTHONPATH", "") == own_pythonpath else \
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    path0 = os.getcwd() if request["kind"] == "module" else \
        os.path.dirname(os.path.realpath(request["main"]))
    sys.path[:] = [path0] + [os.path.abspath(p) for p in extra] + zygote_path
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    _as_started()
    random.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    code = _run(request)
    os._exit(_finish(code))


def _as_started() -> None:
    """What the interpreter's start-up computed from the zygote's environment, computed
    again from the child's: the user's site folders (HOME), sysconfig's variables."""
    import site
    import sysconfig

    site.USER_BASE = site.USER_SITE = None
    site.getusersitepackages()
    sysconfig._CONFIG_VARS = None
    if hasattr(sysconfig, "_CONFIG_VARS_INITIALIZED"):  # 3.13 recomputes only when False
        sysconfig._CONFIG_VARS_INITIALIZED = False


def _run(request: dict):
    import runpy
    import traceback

    import types

    # A fresh `__main__`, run in as the interpreter runs `-m MODULE` or a script.
    main = sys.modules["__main__"] = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    if "__mp_main__" in sys.modules:  # multiprocessing's alias of __main__
        sys.modules["__mp_main__"] = main
    sys.argv = [request["main"], *request["args"]]
    try:
        if request["kind"] == "module":
            sys.argv[0] = "-m"
            runpy._run_module_as_main(request["main"], alter_argv=True)
        else:
            from importlib.machinery import SourceFileLoader

            path = os.path.abspath(request["main"])
            with open(path, "rb") as fh:
                code = compile(fh.read(), path, "exec")
            main.__file__, main.__cached__ = path, None
            main.__loader__ = SourceFileLoader("__main__", path)
            exec(code, main.__dict__)
        return 0
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return "SIGINT"
    except BaseException as exc:  # noqa: BLE001 - as the interpreter reports it
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__):
            tb = tb.tb_next
        sys.excepthook(type(exc), exc, tb)
        return 1


def _finish(code) -> int:
    """What the interpreter does on exit: join threads, run atexit, flush the streams."""
    import atexit
    import signal
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    status = 0 if code == "SIGINT" else code
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - Python exits 120 when it cannot flush stdout
            status = status or 120
    if code == "SIGINT":
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return status & 0xFF if isinstance(status, int) else 1


# -- the tests' side ---------------------------------------------------------------------------

class _Client:
    """This worker's zygote: started on first use, one request at a time."""

    def __init__(self, env=None, warm=()):
        import socket
        import subprocess
        import threading

        import atexit

        ours, theirs = socket.socketpair()
        self.env, self.warm = (_start_env() if env is None else dict(env)), tuple(warm)
        self.proc = subprocess.Popen([sys.executable, __file__, str(theirs.fileno()),
                                      ",".join(self.warm)],
                                     pass_fds=[theirs.fileno()], env=self.env, cwd="/",
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        theirs.close()
        self.sock, self.lock, self.pid = ours, threading.Lock(), os.getpid()
        hello, _ = _receive(self.sock)
        atexit.register(self.close)
        self.top = frozenset(hello["top"])
        self.path, self.pythonpath = hello["path"], hello["pythonpath"]
        # HOME places the user's site-packages on the path when it is enabled
        self.start_names = {"HOME"} if hello["user_site"] else set()

    def close(self) -> None:
        """End the zygote (it exits when its socket closes) and reap it, so that its CPU
        time counts in this process's children's."""
        if self.pid == os.getpid():
            self.sock.close()
            try:
                self.proc.wait(10)
            except Exception:  # noqa: BLE001 - a zygote that hangs is killed
                self.proc.kill()
                self.proc.wait()

    def refusal(self, argv, cwd, env) -> str | None:
        """Why this request needs a real process (None: the zygote can run it)."""
        if argv[0] != sys.executable or len(argv) < 2:
            return "another interpreter"
        if argv[1] == "-m":
            path0 = os.path.abspath(cwd)
        elif argv[1].startswith("-"):
            return f"interpreter option {argv[1]}"
        else:
            path0 = os.path.dirname(os.path.abspath(os.path.join(cwd, argv[1])))
        if _enabled(env):
            return "KBUILD_ENABLE starts kbuild at start-up"
        differ = self.differ(env)
        if differ:
            return f"start-up variables differ: {differ[:3]}"
        extra = [p for p in str(env.get("PYTHONPATH", "")).split(os.pathsep) if p]
        if self.warm and not all(os.path.isabs(p) for p in extra):
            return "a relative PYTHONPATH folder"  # the warm zygote's is relative to /
        for folder in [path0] + [os.path.join(cwd, p) for p in extra]:
            if folder not in self.path and _holds_module(folder, self.top):
                return f"{folder} holds a module the zygote imported"
        if self.warm:
            return _numba_config_near(argv, cwd)
        return None

    def differ(self, env) -> list:
        """The variables of `env` that differ from this zygote's where its imports could
        have read them."""
        if self.warm:
            return sorted(k for k in set(env) | set(self.env)
                          if env.get(k) != self.env.get(k) and not _warm_after_start(k))
        return sorted(k for k in set(env) | set(self.env)
                      if env.get(k) != self.env.get(k)
                      and (not _after_start(k) or k in self.start_names))

    def run(self, argv, cwd, env, timeout):
        import selectors
        import subprocess
        import time

        stdin = os.dup(0)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        module = argv[1] == "-m"
        main = argv[2] if module else argv[1]
        import signal

        # A process started now inherits SIGINT ignored if this one ignores it (a suite
        # started in the background by a shell), and Python keeps it ignored; else
        # Python's own handler. The zygote was started at another moment.
        request = {"kind": "module" if module else "script", "main": main,
                   "args": list(argv[3 if module else 2:]), "cwd": str(cwd), "env": env,
                   "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN}
        try:
            _message(self.sock, request, [stdin, out_w, err_w])
        finally:
            for fd in (stdin, out_w, err_w):
                os.close(fd)
        pid = _receive(self.sock)[0]["pid"]
        chunks = {out_r: [], err_r: []}
        deadline = None if timeout is None else time.monotonic() + timeout
        timed_out = False
        with selectors.DefaultSelector() as sel:
            for fd in chunks:
                sel.register(fd, selectors.EVENT_READ)
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0 and not timed_out:
                    timed_out = True
                    os.kill(pid, 9)
                    deadline = None  # what is left in the pipes is read to EOF
                    continue
                for key, _ in sel.select(left):
                    data = os.read(key.fd, 1 << 16)
                    if data:
                        chunks[key.fd].append(data)
                    else:
                        sel.unregister(key.fd)
                        os.close(key.fd)
        status = _receive(self.sock)[0]["status"]
        out, err = b"".join(chunks[out_r]), b"".join(chunks[err_r])
        if timed_out:
            raise subprocess.TimeoutExpired(argv, timeout, out, err)
        code = os.waitstatus_to_exitcode(status)
        return subprocess.CompletedProcess(argv, code, out, err)


def _enabled(env) -> bool:
    """Whether KBUILD_ENABLE starts zero-config at start-up (the site's .pth reads it)."""
    return str(env.get("KBUILD_ENABLE", "")).strip().lower() not in ("", "0", "false", "no",
                                                                     "off")


def _holds_module(folder: str, top) -> bool:
    """Whether `folder` holds a module or package (a folder, `NAME.py`, an extension) of
    a name in `top` (a `kbuild.toml` beside a pre-imported `kbuild` is no module)."""
    import importlib.machinery

    suffixes = tuple(importlib.machinery.all_suffixes())
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    for name in names:
        stem, dot, rest = name.partition(".")
        if stem in top and (not dot or f".{rest}" in suffixes):
            return True
    return False


def _numba_config_near(argv, cwd: str) -> str | None:
    """Why a warm zygote cannot serve `argv` in `cwd` for a numba config file it did not
    read (None: there is none): in the working directory, in `/` (where the zygote
    imported numba), or beside a file the arguments name (the project's)."""
    folders = [cwd, "/"]
    for arg in argv[2:]:
        path = os.path.join(cwd, arg)
        if os.path.exists(path):
            folders.append(path if os.path.isdir(path) else os.path.dirname(path))
    for folder in folders:
        if os.path.exists(os.path.join(folder, NUMBA_CONFIG)):
            return f"{folder} holds {NUMBA_CONFIG}"
    return None


_CLIENT: list = []  # [client or None]: None when the zygote could not start
_WARM: dict = {}  # the modules a warm zygote imports -> its client (None: it could not start)
REFUSED: dict = {}  # why requests ran as real processes: reason -> count (for diagnosis)


def _start_env() -> dict:
    """What of this worker's environment a zygote started now would start with: never a
    fixed hash seed. A library a test runs may leave one in the worker's environment
    (dask's nanny sets PYTHONHASHSEED=6640 in the process that starts it); the requests
    never carry it on (`support.kbuild_env` drops it), so a zygote started with it would
    refuse every request of the worker from then on (250 real processes in one run)."""
    return {k: v for k, v in os.environ.items()
            if (not _after_start(k) or k == "HOME") and k != "PYTHONHASHSEED"}


def _client():
    if _CLIENT and _CLIENT[0] is not None and (_CLIENT[0].pid != os.getpid()
                                               or _CLIENT[0].proc.poll() is not None):
        _CLIENT.clear()  # a forked pytest process, or the zygote died: start another
    elif _CLIENT and _CLIENT[0] is not None and _CLIENT[0].env != _start_env():
        # The worker's own environment changed since (a library imported by a test sets
        # OMP_NUM_THREADS and the like at import): requests now carry it, so a zygote
        # started from it serves them where the old one would refuse them all.
        _CLIENT.pop().close()
    if not _CLIENT:
        try:
            _CLIENT.append(_Client())
        except (OSError, EOFError, ValueError):
            _CLIENT.append(None)
    return _CLIENT[0]


def _warm_client(warm: tuple, env: dict):
    """This worker's warm zygote of the modules `warm`, started from `env` unless the one
    running was started from an environment its imports could tell apart."""
    if _enabled(env):
        return _client()  # which refuses it: no zygote of its own starts zero-config
    client = _WARM.get(warm)
    if client is not None and (client.pid != os.getpid() or client.proc.poll() is not None
                               or client.differ(env)):
        if client.pid == os.getpid():
            client.close()
        del _WARM[warm]
    if warm not in _WARM:
        try:
            _WARM[warm] = _Client(env, warm)
        except (OSError, EOFError, ValueError):
            _WARM[warm] = None
    return _WARM[warm]


def own_processes() -> set[int]:
    """The pids of this worker's zygotes (a test that counts the worker's children leaves
    them out: they live as long as the worker)."""
    return {c.proc.pid for c in [*_CLIENT, *_WARM.values()]
            if c is not None and c.pid == os.getpid()}


def _log(what: str) -> None:
    """One line per request to KBUILD_TEST_ZYGOTE_LOG (when set): how many were served."""
    where = os.environ.get("KBUILD_TEST_ZYGOTE_LOG")
    if where:
        with open(where, "a") as fh:
            test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0]
            fh.write(f"{what}\t{test}\n")


def run(argv, *, cwd, env, timeout=None, text=False, warm=(), **popen):
    """`subprocess.run(argv, cwd=, env=, capture_output=True, timeout=)`, the process forked
    from this worker's zygote where it can be (see the module's docstring), a real one
    otherwise (and for any other Popen argument). `warm`: the modules (numba.cuda, kbuild)
    a warm zygote has imported, for a process that needs no journal (the docstring)."""
    import subprocess

    argv = [str(a) for a in argv]
    env = {str(k): str(v) for k, v in env.items()}
    off = os.environ.get(OFF, "") not in ("", "0")
    client = None if popen or off else _warm_client(tuple(warm), env) if warm else _client()
    reason = "off" if client is None else client.refusal(argv, str(cwd), env)
    if reason is None:
        with client.lock:
            done = client.run(argv, str(cwd), env, timeout)
        if text:  # as subprocess decodes: the locale's encoding, universal newlines
            import locale

            encoding = locale.getpreferredencoding(False)
            done.stdout, done.stderr = (
                data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")
                for data in (done.stdout, done.stderr))
        _log("served warm" if client.warm else "served")
        return done
    REFUSED[reason] = REFUSED.get(reason, 0) + 1
    _log(reason)
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=timeout,
                          text=text, **popen)


if __name__ == "__main__":
    serve(int(sys.argv[1]), [m for m in sys.argv[2].split(",") if m])
