"""Zero-config caching: every kernel a program compiles, kept in kbuild's store and keyed as
`kbuild build` keys it. One line turns it on::

    import kbuild; kbuild.enable()

or, with no change to the program, `kbuild run -- python app.py`, `KBUILD_ENABLE=1 python
app.py` (a startup hook installed with kbuild) or `pytest -p kbuild`. See `session` for
what happens at each compile and `settings` for where the store is.
"""

from __future__ import annotations

__all__ = ["ZeroConfigWarning", "current", "disable", "enable"]

_current = {"session": None, "serving": []}  # serving: the backends serving the session


def enable(store=None, archs=None, remote=None, on_miss=None, *, config=None, record=None,
           journal=None, background=None):
    """From now on every `@cuda.jit` kernel this process compiles (numba-cuda's, and
    numba-cuda-mlir's once the program imports it) comes from
    kbuild's store: keyed as `kbuild build` keys a declared target, looked up (and in the
    remote), else compiled by kbuild and stored (`on_miss="build"`, the default), else
    an error (`"error"`) or numba's own compile, not stored (`"jit"`).

    `store`: the store folder (default: the nearest kbuild.toml's, else $KBUILD_STORE, else
    ~/.cache/kbuild); `archs`: also build each kernel for these architectures (the current
    device's always is); `remote`: a shared cache URL, or False for none (default:
    $KBUILD_REMOTE, else the project file's); `config`: the project file (default: the
    nearest, if any); `record`: a folder where the (kernel, signature) pairs launched are
    written, for `kbuild run --record`; `journal`: False to key every compile in full
    (default: on unless $KBUILD_JOURNAL is 0; see `journal`); `background`: False to
    compile every kernel when the program launches it, a number for that many worker
    processes (default: $KBUILD_BACKGROUND, else on from 4 cores, one per core): after an
    edit, the kernels the program launched last time are rebuilt in the background (see
    `background`). Returns the session; calling it again replaces it.
    """
    from . import settings as _settings
    from .session import Session

    found = _settings.resolve(store=store, archs=archs, remote=remote, on_miss=on_miss,
                              record=record, config=config)
    session = Session(found, journal=journal, background=background)
    from ..backend.backends import DEFAULT, get

    _current["session"] = session
    backend = get(DEFAULT)
    if backend.simulating():
        _enable_simulated(session, backend)
    else:
        from .afterimport import after_import

        _serve(backend, session)
        # numba-cuda-mlir's dispatchers too, once (if ever) the program imports it.
        after_import("numba_cuda_mlir", _serve_mlir)
    return session


def _serve(backend, session) -> None:
    backend.serve(session)
    if backend not in _current["serving"]:
        _current["serving"].append(backend)


def _serve_mlir() -> None:
    """Run right after the program imports numba-cuda-mlir: its kernels are served too.
    Whatever goes wrong here is a warning: the program's import must go on."""
    session = _current["session"]
    if session is None:
        return
    try:
        from ..backend.backends import MLIR_NAME, get

        _serve(get(MLIR_NAME), session)
    except Exception as exc:  # noqa: BLE001 - numba-cuda-mlir then compiles on its own
        session.warn(f"kbuild: numba-cuda-mlir kernels are compiled by numba-cuda-mlir, "
                     f"not cached: {type(exc).__name__}: {exc}")


def _enable_simulated(session, backend) -> None:
    """numba's simulator compiles nothing: only what is launched is recorded."""
    if session.recording is None:
        return
    backend.record_launches(session.recording.launched)


def disable() -> None:
    """numba compiles on its own again (kernels already handed over stay loaded)."""
    from ..backend.backends import DEFAULT, get

    # numba-cuda's always (kbuild depends on it); another backend only if it served.
    default = get(DEFAULT)
    for backend in [default, *(b for b in _current["serving"] if b is not default)]:
        backend.stop_serving()
    _current["serving"] = []
    _current["session"] = None


def current():
    """The current session (its `counts`, `served`, `store`), or None."""
    return _current["session"]


def __getattr__(name):
    # The start-up hook imports this package in every process KBUILD_ENABLE reaches: it
    # stays cheap, and the session's code is imported when caching starts.
    if name == "ZeroConfigWarning":
        from .session import ZeroConfigWarning

        return ZeroConfigWarning
    raise AttributeError(name)
