"""The edges a new user hit first (issue 25, item 7): a typo in one signature, a TOML error
reported at the wrong line, an error echoed twice with --json, `kbuild init pkg.module`,
and a missing kbuild.toml that did not say how to make one."""

from __future__ import annotations

import json
import textwrap

import pytest
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

KERNELS = """
from numba import cuda


@cuda.jit
def twice(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] * 2


@cuda.jit
def thrice(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] * 3
"""

CONFIG = """
[project]
name = "edges"
paths = ["."]
arch = ["sm_80"]

[kernels."pkg.kern:twice"]
signatures = ["void(flaot32[::1])", "void(float64[::1])"]

[kernels."pkg.kern:thrice"]
signatures = ["void(float32[::1])"]
"""


@pytest.fixture
def typo_project(tmp_path):
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "kern.py").write_text(textwrap.dedent(KERNELS))
    (root / "kbuild.toml").write_text(textwrap.dedent(CONFIG))
    return root


def _by_signature(rows):
    return {(r["target"], r["signature"]): r for r in rows}


def test_a_misspelt_type_fails_its_own_targets_with_a_did_you_mean(typo_project, run_kbuild,
                                                                   tmp_path):
    built = run_kbuild("build", "-k", "--json", cwd=typo_project, store=tmp_path / "store")
    assert built.returncode == 1, built.stderr
    rows = _by_signature(built.json["targets"])
    bad = rows[("pkg.kern:twice", "void(flaot32[::1])")]
    assert bad["status"] == "failed"
    assert "flaot32" in bad["error"] and "did you mean 'float32'?" in bad["error"]
    # The kernel's other signature and the other kernel build.
    assert rows[("pkg.kern:twice", "void(float64[::1])")]["status"] == "built"
    assert rows[("pkg.kern:thrice", "void(float32[::1])")]["status"] == "built"

    status = run_kbuild("status", "--json", cwd=typo_project, store=tmp_path / "store")
    assert status.returncode == 1
    states = {(r["target"], r["signature"]): r["status"] for r in status.json["targets"]}
    assert states[("pkg.kern:twice", "void(flaot32[::1])")] == "failed"
    assert states[("pkg.kern:thrice", "void(float32[::1])")] == "up-to-date"


@pytest.mark.parametrize("text, line", [
    # An array left open: tomllib notices it lines later.
    ('[project]\nname = "x"\narch = ["sm_80"\n\n[kernels."a:b"]\nsignatures = []\n', 3),
    # A string left open.
    ('[project]\nname = "x\npaths = ["."]\n', 2),
    # An error on its own line is reported there, after a multi-line array.
    ('[project]\npaths = [\n  ".",\n]\nname = = "x"\n', 5),
    ('[project]\nname = "x"\nname = "y"\n', 3),
], ids=["unclosed-array", "unclosed-string", "after-multiline-array", "duplicate-key"])
def test_a_toml_error_is_reported_where_its_statement_starts(tmp_path, run_kbuild, text, line):
    (tmp_path / "kbuild.toml").write_text(text)
    result = run_kbuild("status", cwd=tmp_path, store=tmp_path / "store")
    assert result.returncode == 2
    message = result.stderr.strip().splitlines()[-1]
    assert "invalid TOML" in message
    assert f"line {line}" in message.split("(noticed", 1)[0], message


def test_with_json_an_error_is_one_object_on_stdout_and_nothing_on_stderr(tmp_path, run_kbuild):
    (tmp_path / "kbuild.toml").write_text('[project]\nname = "x"\narch = ["sm_80"\n')
    result = run_kbuild("build", "--json", cwd=tmp_path, store=tmp_path / "store")
    assert result.returncode == 2
    assert json.loads(result.stdout)["kind"] == "ConfigError"
    assert result.stderr.strip() == ""


@pytest.mark.parametrize("given", ["pkg.kern", "pkg", "pkg/kern.py", "pkg/"])
def test_init_takes_a_dotted_module_name_or_a_path(typo_project, run_kbuild, tmp_path, given):
    (typo_project / "kbuild.toml").unlink()
    result = run_kbuild("init", given, "--json", cwd=typo_project, store=tmp_path / "store")
    assert result.returncode == 0, result.stdout + result.stderr
    assert set(result.json["lazy"]) == {"pkg.kern:twice", "pkg.kern:thrice"}


def test_init_names_what_it_could_not_find(typo_project, run_kbuild, tmp_path):
    (typo_project / "kbuild.toml").unlink()
    result = run_kbuild("init", "pkg.nope", cwd=typo_project, store=tmp_path / "store")
    assert result.returncode == 2
    assert "pkg.nope is not a folder, a Python file or a module" in result.stderr


def test_a_missing_config_says_how_to_make_one(tmp_path, run_kbuild):
    found = run_kbuild("status", cwd=tmp_path, store=tmp_path / "store")
    named = run_kbuild("status", "--config", tmp_path / "nope.toml", cwd=tmp_path,
                       store=tmp_path / "store")
    for result in (found, named):
        assert result.returncode == 2
        assert "kbuild init" in result.stderr


@pytest.mark.parametrize("signature, fragments", [
    ("void(floot32[::1])", ["bad signature 'void(floot32[::1])'",
                            "name 'floot32' is not defined", "did you mean 'float32'?"]),
    ("int32(float32[::1])", ["signature 'int32(float32[::1])' returns int32; "
                             "kernels return void"]),
], ids=["misspelt", "returns-a-value"])
def test_a_bad_signature_fails_its_target_and_leaves_the_store_alone(
        typo_project, run_kbuild, tmp_path, signature, fragments):
    (typo_project / "kbuild.toml").write_text(textwrap.dedent(f"""
        [project]
        name = "edges"
        arch = ["sm_80"]

        [kernels."pkg.kern:twice"]
        signatures = ["{signature}"]
        """))
    result = run_kbuild("build", cwd=typo_project, store=tmp_path / "store")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert f"target 'pkg.kern:twice' in kbuild.toml: {fragment}" in result.stdout \
            or fragment in result.stdout, result.stdout
    assert not list((tmp_path / "store").rglob("*.json"))  # nothing committed
