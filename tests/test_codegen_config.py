"""`compiletime.codegen_config`: the config a compile starting now reads, with numba's
reload of `NUMBA_*` variables skipped only where it would change nothing."""

from __future__ import annotations

import os

import pytest

from kbuild.backend import compiletime

config = pytest.importorskip("numba.cuda").config


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("NUMBA_BOUNDSCHECK", raising=False)
    config.reload_config()
    yield
    monkeypatch.delenv("NUMBA_BOUNDSCHECK", raising=False)
    config.reload_config()


def _reloads(monkeypatch) -> list:
    calls = []
    real = config.reload_config
    monkeypatch.setattr(config, "reload_config", lambda: (calls.append(1), real())[1])
    return calls


def test_a_variable_set_since_is_read(monkeypatch):
    assert not compiletime.codegen_config()["BOUNDSCHECK"]
    monkeypatch.setenv("NUMBA_BOUNDSCHECK", "1")
    assert compiletime.codegen_config()["BOUNDSCHECK"]
    monkeypatch.setenv("NUMBA_BOUNDSCHECK", "0")
    assert not compiletime.codegen_config()["BOUNDSCHECK"]


def test_a_variable_set_back_after_numbas_own_reload_is_read(monkeypatch):
    """Set, applied by numba's own reload (a compile), set back: the config numba holds
    is the one in between, so the reload is not skipped."""
    monkeypatch.setenv("NUMBA_BOUNDSCHECK", "0")
    assert not compiletime.codegen_config()["BOUNDSCHECK"]
    monkeypatch.setenv("NUMBA_BOUNDSCHECK", "1")
    config.reload_config()  # as numba's compile does
    monkeypatch.setenv("NUMBA_BOUNDSCHECK", "0")
    assert not compiletime.codegen_config()["BOUNDSCHECK"]


def test_an_unchanged_environment_is_not_scanned_by_numba_again(monkeypatch):
    """The work counted: with no `NUMBA_*` variable changed, no reload per compile."""
    compiletime.codegen_config()
    calls = _reloads(monkeypatch)
    for _ in range(5):
        compiletime.codegen_config()
    assert calls == []
    monkeypatch.setenv("NUMBA_BOUNDSCHECK", "1")
    assert compiletime.codegen_config()["BOUNDSCHECK"] and calls == [1]


def test_a_config_file_reloads_every_time(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".numba_config.yaml").write_text("boundscheck: 1\n")
    calls = _reloads(monkeypatch)
    compiletime.codegen_config()
    compiletime.codegen_config()
    assert calls == [1, 1]
