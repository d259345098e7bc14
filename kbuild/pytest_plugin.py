"""pytest plugin: every numba-cuda kernel a test suite compiles, cached by kbuild.

Installed with kbuild (entry point `pytest11: kbuild`), it does nothing unless asked:
`pytest -p kbuild`, `pytest --kbuild`, or `kbuild = true` in the ini file
([tool.pytest.ini_options] of pyproject.toml, pytest.ini, ...). It then calls
`kbuild.enable()` before any test module is imported, in every pytest-xdist worker too
(workers share the store: each kernel is compiled once between them). The store and the
rest come from `--kbuild-store DIR`, else as `kbuild.enable()` finds them (the nearest
kbuild.toml, $KBUILD_STORE, ~/.cache/kbuild). `kbuild run -- pytest` works as well.
"""

from __future__ import annotations

import pytest

_NAMES = ("kbuild", "kbuild.pytest_plugin")


def pytest_addoption(parser):
    group = parser.getgroup("kbuild", "kbuild zero-config kernel caching")
    group.addoption("--kbuild", action="store_true", default=False,
                    help="cache every numba-cuda kernel the tests compile in kbuild's store")
    group.addoption("--kbuild-store", metavar="DIR", default=None,
                    help="the store (default: the nearest kbuild.toml's, $KBUILD_STORE, "
                         "~/.cache/kbuild)")
    parser.addini("kbuild", type="bool", default=False,
                  help="cache every numba-cuda kernel the tests compile in kbuild's store")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if not _wanted(config):
        return
    from . import zeroconf

    if zeroconf.current() is None:  # KBUILD_ENABLE (kbuild run) may have done it already
        zeroconf.enable(store=config.getoption("kbuild_store"))


def _wanted(config) -> bool:
    asked = getattr(config.option, "plugins", None) or []
    return bool(config.getoption("kbuild") or config.getoption("kbuild_store")
                or config.getini("kbuild") or any(p in _NAMES for p in asked))
