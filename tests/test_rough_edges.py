"""Rough edges a new user hit (issue 32's bugs), each end to end through the CLI or the
API a user calls: the message they read, the exit code, what the store holds."""

from __future__ import annotations

import json
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

import pytest

from conftest import blob_bytes
from test_cli_newcomer import make_project
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

KERNEL = '''from numba import cuda


@cuda.jit
def k(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] + 1
'''


def _toml(arch: str, extra: str = "") -> str:
    return (f'[project]\nname = "edges"\narch = ["{arch}"]\n{extra}\n'
            '[kernels."pkg.k:k"]\nsignatures = ["void(float32[::1])"]\n')


def _ptx_targets(store: Path) -> set:
    return {line.split()[1] for blob in (store / "v1" / "blobs").rglob("*") if blob.is_file()
            for line in blob_bytes(blob).decode("latin-1").splitlines()
            if line.startswith(".target")}


def test_arch_specific_target_is_cached(tmp_path, run_kbuild):
    """`sm_90a` code is sm_90a PTX (NVVM, nvJitLink and ptxas all given the suffix), so
    the store keeps it and the next build is a hit, not 'corrupt: its PTX targets sm_90'."""
    root = make_project(tmp_path / "p", _toml("sm_90a"), {"k": KERNEL})
    store = tmp_path / "store"
    first = run_kbuild("build", "--json", cwd=root, store=store)
    assert first.returncode == 0, first.stderr
    second = run_kbuild("build", "--json", cwd=root, store=store)
    assert second.returncode == 0, second.stderr
    assert "corrupt" not in second.stderr
    assert [r["status"] for r in second.json["targets"]] == ["cached"]
    assert _ptx_targets(store) == {"sm_90a"}


def test_plain_and_arch_specific_targets_share_a_store(tmp_path, run_kbuild):
    """sm_90 first, then sm_90a: the second is its own build (no object or link of the
    plain arch reused for it), and both are hits after."""
    root = make_project(tmp_path / "p", _toml("sm_90"), {"k": KERNEL})
    store = tmp_path / "store"
    assert run_kbuild("build", cwd=root, store=store).returncode == 0
    built = run_kbuild("build", "--json", "--arch", "sm_90a", cwd=root, store=store)
    assert [r["status"] for r in built.json["targets"]] == ["built"], built.stderr
    again = run_kbuild("build", "--json", "--arch", "sm_90,sm_90a", cwd=root, store=store)
    assert [r["status"] for r in again.json["targets"]] == ["cached", "cached"], again.stderr
    assert _ptx_targets(store) == {"sm_90", "sm_90a"}


def test_installed_module_origin_ignores_a_parent_folder_on_sys_path(tmp_path, monkeypatch):
    """A program run from the folder that holds its venv has that folder first on
    sys.path; an installed package's files are still `kbdemo/__init__.py`, as bundled."""
    from kbuild.installed import package_sources

    site = tmp_path / "proj" / ".venv" / "lib" / "python3" / "site-packages"
    (site / "kbdemo").mkdir(parents=True)
    (site / "kbdemo" / "__init__.py").write_text("")
    (site / "kbdemo" / "kernels.py").write_text("X = 1\n")
    (site / "kbdemo" / "sub").mkdir()
    (site / "kbdemo" / "sub" / "__init__.py").write_text("")
    monkeypatch.setattr("sys.path", [str(tmp_path / "proj"), str(site)])
    origins = package_sources(["kbdemo"]).origins
    assert origins == {"kbdemo": "kbdemo/__init__.py", "kbdemo.kernels": "kernels.py",
                       "kbdemo.sub": "sub/__init__.py"}


def test_readme_builds_the_example_wheel_as_the_bundle_test_does(repo_root):
    """kbuild is not on the package index: every `pip wheel` of a kbuild-hooked package
    the README shows builds without isolation, as tests/test_bundle.py does."""
    import re

    readme = (repo_root / "README.md").read_text()
    commands = re.findall(r"^python -m pip wheel .*$", readme, re.MULTILINE)
    package = [c for c in commands if "examples/package" in c]
    assert package, "the README shows no command that builds the example wheel"
    assert all("--no-build-isolation" in c for c in package), package
    bundle_test = (repo_root / "tests" / "test_bundle.py").read_text()
    assert '"--no-build-isolation"' in bundle_test


ALIASED = '''import numba as nb
import numba.cuda as nc
from numba import cuda as cu
from numba.cuda import jit as kjit

launch = nb.cuda.jit


@nb.cuda.jit("void(float32[::1])")
def a(x):
    x[0] = 1


@nc.jit("void(float32[::1])")
def b(x):
    x[0] = 2


@cu.jit("void(float32[::1])")
def c(x):
    x[0] = 3


@kjit("void(float32[::1])")
def d(x):
    x[0] = 4


@launch("void(float32[::1])")
def e(x):
    x[0] = 5


@nb.cuda.jit(device=True)
def helper(x):
    return x


@nb.njit
def cpu(x):
    return x
'''


def test_init_finds_kernels_through_any_import_alias(tmp_path, run_kbuild):
    root = tmp_path / "p"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "k.py").write_text(ALIASED)
    made = run_kbuild("init", "--json", cwd=root)
    assert made.returncode == 0, made.stderr
    assert made.json["kernels"] == [f"pkg.k:{n}" for n in "abcde"]
    status = run_kbuild("status", "--json", cwd=root, store=tmp_path / "store")
    assert status.returncode == 0, status.stderr


def test_init_on_all_lazy_kernels_suggests_what_works(tmp_path, run_kbuild):
    """With every kernel lazy the file declares no target: init's next step is to
    declare (or record) their signatures, not a `kbuild status` that cannot run."""
    root = make_project(tmp_path / "p", "", {"k": KERNEL})
    (root / "kbuild.toml").unlink()
    made = run_kbuild("init", cwd=root)
    assert made.returncode == 0, made.stderr
    assert "lazy: pkg.k:k" in made.stdout
    next_line = made.stdout.strip().splitlines()[-1]
    assert "kbuild status" not in next_line and "kbuild run --record" in next_line


DEEP_ARRAY = '[project]\nname = "x"\narch = ' + "[" * 5000 + "]" * 5000 + "\n"
DEEP_TABLE = '[project]\nname = "x"\nstore = ' + "{a = " * 3000 + "1" + "}" * 3000 + "\n"
DEEP_PYPROJECT = ('[project]\nname = "x"\n[tool.kbuild.project]\narch = ["sm_80"]\n'
                  '[tool.kbuild.kernels."pkg.k:k"]\nsignatures = ' + "[" * 5000 + "]" * 5000
                  + "\n")


@pytest.mark.parametrize("name,text", [("kbuild.toml", DEEP_ARRAY), ("kbuild.toml", DEEP_TABLE),
                                       ("pyproject.toml", DEEP_PYPROJECT)],
                         ids=["array", "inline-table", "pyproject"])
def test_deeply_nested_project_file_is_a_config_error(tmp_path, run_kbuild, name, text):
    """Every entry point names the file and says what is wrong: the CLI (exit 2),
    `kbuild.enable()` and `pytest -p kbuild` (no RecursionError, no INTERNALERROR)."""
    root = tmp_path / "p"
    root.mkdir()
    (root / name).write_text(text)
    (root / "test_a.py").write_text("def test_a():\n    pass\n")
    for command in (["status"], ["build"], ["clean"], ["explain", "pkg.k:k"]):
        result = run_kbuild(*command, cwd=root, store=tmp_path / "store")
        assert result.returncode == 2, (command, result.stderr)
        assert f"{root / name}: arrays or tables nested more than 64 deep" in result.stderr
        assert "internal error" not in result.stderr
    enabled = run_kbuild(cwd=root, launcher=("-c", "import kbuild; kbuild.enable()"))
    assert enabled.returncode == 0 and "RecursionError" not in enabled.stderr
    assert "nested more than 64 deep" in enabled.stderr
    # pytest's own settings from pytest.ini: pytest cannot read such a pyproject.toml itself.
    (root / "pytest.ini").write_text("[pytest]\n")
    tested = run_kbuild(cwd=root, launcher=("-m", "pytest", "-p", "kbuild", "--kbuild", "-q",
                                           "-c", "pytest.ini", "-p", "no:cacheprovider",
                                           "test_a.py"))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "INTERNALERROR" not in tested.stdout + tested.stderr
    assert "1 passed" in tested.stdout


# -- kbuild run --record into the user's file (tomledit) -------------------------------

def _merge(path: Path, kernels: dict) -> dict:
    from kbuild.zeroconf import tomledit

    return tomledit.merge(path, kernels, name="p")


def test_record_keeps_crlf_line_endings(tmp_path):
    path = tmp_path / "kbuild.toml"
    path.write_bytes(b'[project]\r\nname = "p"\r\n\r\n[kernels."m:a"]\r\n'
                     b'signatures = ["void(int8)"]\r\n')
    _merge(path, {"m:a": {"signatures": ["void(int16)"]}, "m:b": {"signatures": ["void(int8)"]}})
    data = path.read_bytes()
    assert data.count(b"\n") == data.count(b"\r\n") > 6
    assert tomllib.loads(data.decode())["kernels"]["m:b"] == {"signatures": ["void(int8)"]}


def test_record_a_kernel_named_outside_the_bmp(tmp_path):
    """`𝒜` is a valid identifier; JSON-escaping it gives a surrogate pair TOML refuses."""
    path = tmp_path / "kbuild.toml"
    path.write_text('[project]\nname = "p"\n', encoding="utf-8")
    _merge(path, {"m:\U0001d49c": {"signatures": ["void(int8)"]}})
    text = path.read_text(encoding="utf-8")
    assert tomllib.loads(text)["kernels"]["m:\U0001d49c"] == {"signatures": ["void(int8)"]}
    assert '[kernels."m:\U0001d49c"]' in text


def test_record_beside_a_multiline_string_and_into_inline_tables(tmp_path):
    path = tmp_path / "kbuild.toml"
    path.write_text('[project]\nname = "p"\n\n[kernels."m:a"]\nsignatures = ["void(int8)"]\n'
                    'note = """a ] and\n[kernels."m:b"]\nin a string"""  # kept\n\n'
                    '[kernels."m:c"]\nsignatures = ["void(int8)"]\n'
                    'launch = [{grid = 1, block = 32}]\n')
    _merge(path, {"m:a": {"signatures": ["void(int16)"]},
                  "m:c": {"signatures": ["void(int8)"],
                          "launch": [{"grid": [2, 1, 1], "block": [64, 1, 1], "shared": 0}]}})
    text = path.read_text()
    assert 'note = """a ] and\n[kernels."m:b"]\nin a string"""  # kept\n' in text
    kernels = tomllib.loads(text)["kernels"]
    assert kernels["m:a"]["signatures"] == ["void(int8)", "void(int16)"]
    assert kernels["m:c"]["launch"] == [{"grid": 1, "block": 32}, {"grid": 2, "block": 64}]
    inline = tmp_path / "inline" / "kbuild.toml"
    inline.parent.mkdir()
    inline.write_text('[project]\nname = "p"\n\n[kernels]\n"m:d" = {signatures = ["void(int8)"]}'
                      '  # mine\n')
    _merge(inline, {"m:d": {"signatures": ["void(int16)"]}, "m:e": {"signatures": ["void(int8)"]}})
    text = inline.read_text()
    assert "# mine" in text
    assert tomllib.loads(text)["kernels"] == {"m:d": {"signatures": ["void(int8)", "void(int16)"]},
                                              "m:e": {"signatures": ["void(int8)"]}}


# -- a store owned by another user ---------------------------------------------------------

def test_store_owned_by_another_user_is_refused_unless_trusted(tmp_path, run_kbuild):
    """As git's safe.directory: whoever owns the store could replace an entry and its
    blobs together. The check is by owner (uid 65534 here), on reads as on writes."""
    import os

    root = make_project(tmp_path / "p", _toml("sm_80"), {"k": KERNEL})
    store = tmp_path / "store"
    assert run_kbuild("build", cwd=root, store=store).returncode == 0
    for folder in (store, store / "v1"):
        os.chown(folder, 65534, 65534)
    for command in (["build"], ["status"], ["gc"]):
        refused = run_kbuild(*command, cwd=root, store=store)
        assert refused.returncode == 2, (command, refused.stdout, refused.stderr)
        assert f"store {store} is not trusted: {store} is owned by another user (uid 65534)" \
            in refused.stderr
        assert f"KBUILD_TRUSTED_STORES={store}" in refused.stderr
    trusted = run_kbuild("build", "--json", cwd=root, store=store,
                         env={"KBUILD_TRUSTED_STORES": f"/elsewhere{os.pathsep}{store}"})
    assert trusted.returncode == 0, trusted.stderr
    assert [r["status"] for r in trusted.json["targets"]] == ["cached"]


ZEROCONF_LAUNCH = """
import sys
import numpy as np
import kbuild
from kbuild import testing
with testing.fake_device("sm_80", record=False) as device:
    session = kbuild.enable(store=sys.argv[1])
    from pkg.k import k
    k[1, 4](device.array(np.zeros(4, np.float32)))
    print(dict(session.counts))
"""


def test_zero_config_does_not_use_an_untrusted_store(tmp_path, run_kbuild):
    import os

    root = make_project(tmp_path / "p", _toml("sm_80"), {"k": KERNEL})
    (root / "kbuild.toml").unlink()
    store = tmp_path / "store"
    store.mkdir()
    os.chown(store, 65534, 65534)
    done = run_kbuild(store, cwd=root, launcher=("-c", ZEROCONF_LAUNCH))
    assert done.returncode == 0, done.stderr
    assert "{'fallback': 1}" in done.stdout
    assert f"store {store} is not trusted" in done.stderr
    assert not (store / "v1").exists()


def test_debug_paths_of_a_checkout_whose_path_is_not_utf8():
    """The OS hands such a path over as surrogate escapes; the binary gets its bytes."""
    import os

    from kbuild.backend.debugpaths import path_map

    root = os.fsdecode(b"/tmp/caf\xe9/proj")  # Latin-1, not UTF-8
    paths = path_map([root])
    written = paths.written(root + "/pkg/mod.py")
    assert written.startswith("/kbuild-root-0/")
    binary = b'.file 1 "' + written.encode() + b'"\n'
    located = paths.located(binary)
    assert len(located) == len(binary)
    assert os.path.normpath(located[9:-2].decode("utf-8", "surrogateescape")) == \
        root + "/pkg/mod.py"
    assert b"/tmp/caf\xe9/proj" in located


def test_kbuild_enable_problem_is_said_once(tmp_path, run_kbuild):
    """site.py may read the venv's site-packages twice (lib64 -> lib), and so the
    start-up hook's .pth line: its problem is still one line."""
    from kbuild.zeroconf.startup import hook_installed

    if not hook_installed():
        pytest.skip("kbuild's start-up hook is not installed in this Python")
    done = run_kbuild(cwd=tmp_path, launcher=("-c", "pass"), env={"KBUILD_ENABLE": "{bad"})
    assert done.returncode == 0
    assert done.stderr.count("KBUILD_ENABLE ignored") == 1, done.stderr
    # And when the line runs again by hand, as a second folder's copy would run it.
    again = run_kbuild(cwd=tmp_path, env={"KBUILD_ENABLE": "{bad"}, launcher=(
        "-c", "import kbuild.zeroconf.startup as s; s.start(); s.start()"))
    assert again.stderr.count("KBUILD_ENABLE ignored") == 1, again.stderr


# -- small ones -----------------------------------------------------------------------------

TWO_KERNELS_BROKEN = "from numba import cuda\n\n\n@cuda.jit\ndef k(x):\n    x[0] = 1 +\n\n\n" \
    "@cuda.jit\ndef j(x):\n    x[0] = 1\n"
TWO_TARGETS = ('[project]\nname = "e"\narch = ["sm_80"]\n\n[kernels."pkg.k:k"]\n'
               'signatures = ["void(float32[::1])", "void(float64[::1])"]\n\n'
               '[kernels."pkg.k:j"]\nsignatures = ["void(float32[::1])"]\n')


@pytest.mark.parametrize("command", [["build"], ["watch", "--rounds", "1"]])
def test_a_module_that_does_not_import_is_reported_once(tmp_path, run_kbuild, command):
    root = make_project(tmp_path / "p", TWO_TARGETS, {"k": TWO_KERNELS_BROKEN})
    done = run_kbuild(*command, cwd=root, store=tmp_path / "store")
    assert done.stdout.count("SyntaxError") == 1, done.stdout
    assert done.stdout.count("failed   pkg.k:") == 3
    assert done.stdout.count("same error as pkg.k:k void(float32[::1]) sm_80") == 2


def test_ctrl_c_ends_a_watch_without_an_error(tmp_path):
    import signal
    import subprocess

    from support import kbuild_argv, kbuild_env

    root = make_project(tmp_path / "p", TWO_TARGETS, {"k": TWO_KERNELS_BROKEN})
    # SIGINT as a terminal has it: a suite started in the background by a shell inherits
    # it ignored, and Python keeps a signal ignored at start-up ignored.
    proc = subprocess.Popen(kbuild_argv("watch"), cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=kbuild_env(tmp_path / "home", store=tmp_path / "store"),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in proc.stdout:
            if line.startswith("watching "):
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # never left running for the worker's later tests
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "error" not in err and "kbuild watch: stopped" in out


def test_gc_names_the_signature_and_arch_it_evicted(tmp_path, run_kbuild):
    root = make_project(tmp_path / "p", TWO_TARGETS, {"k": KERNEL.replace("def k", "def j")
                                                      + KERNEL.split("\n\n", 1)[1]})
    store = tmp_path / "store"
    assert run_kbuild("build", cwd=root, store=store).returncode == 0
    (root / "kbuild.toml").write_text(TWO_TARGETS.split('\n\n[kernels."pkg.k:j"]')[0] + "\n")
    done = run_kbuild("gc", "--max-size", "1", cwd=root, store=store)
    assert done.returncode == 0, done.stderr
    assert "  evicted pkg.k:j void(float32[::1]) sm_80" in done.stdout
    as_json = run_kbuild("gc", "--json", cwd=root, store=store)
    assert as_json.json["evicted_targets"] == []


DTYPE_MODULE = '''import numpy as np
from numba import cuda

PARTICLE = np.dtype([("x", np.float32), ("v", np.float32)])


def particles(n):
    return np.zeros(n, PARTICLE)


@cuda.jit
def k(p):
    p[0].x = 1
'''


def test_a_type_typo_suggests_the_modules_dtype_not_a_function(tmp_path, run_kbuild):
    toml = ('[project]\nname = "e"\narch = ["sm_80"]\n\n[kernels."pkg.k:k"]\n'
            'signatures = ["void(Particle[::1])"]\n')
    root = make_project(tmp_path / "p", toml, {"k": DTYPE_MODULE})
    done = run_kbuild("build", cwd=root, store=tmp_path / "store")
    assert done.returncode == 1
    assert "did you mean 'PARTICLE'?" in done.stdout + done.stderr, done.stdout


# -- kbuild stats ----------------------------------------------------------------------------

def test_stats_count_zero_config_processes_per_project_with_a_hit_rate(tmp_path, run_kbuild):
    """Two zero-config processes (a compile, then a hit) and a build of another project
    in the same store; then --zero."""
    app = make_project(tmp_path / "app", _toml("sm_80"), {"k": KERNEL})
    (app / "kbuild.toml").unlink()
    lib = make_project(tmp_path / "lib", _toml("sm_80"), {"k": KERNEL.replace("+ 1", "+ 2")})
    store = tmp_path / "store"
    for expected in ("'built': 1", "'hits': 1"):
        done = run_kbuild(store, cwd=app, launcher=("-c", ZEROCONF_LAUNCH))
        assert done.returncode == 0 and expected in done.stdout, done.stdout + done.stderr
    assert run_kbuild("build", cwd=lib, store=store).returncode == 0
    stats = run_kbuild("stats", "--json", cwd=tmp_path, store=store).json
    assert (stats["runs"], stats["zeroconf_runs"]) == (3, 2)
    assert (stats["hits"], stats["misses"], stats["builds"]) == (1, 2, 2)
    assert stats["hit_rate"] == round(1 / 3, 4)
    assert stats["projects"]["app"] == {**stats["projects"]["app"], "runs": 2, "zeroconf_runs": 2,
                                        "hits": 1, "misses": 1, "hit_rate": 0.5}
    assert stats["projects"]["edges"]["builds"] == 1
    human = run_kbuild("stats", cwd=tmp_path, store=store)
    assert "hit rate     33.3% (1 hits, 2 misses: 2 built, 0 failed, 0 left to numba)" \
        in human.stdout
    assert "  app: 50.0% (1 hits, 1 misses) over 2 runs, 2 of them zero-config" in human.stdout
    assert run_kbuild("stats", "--zero", cwd=tmp_path, store=store).returncode == 0
    zeroed = run_kbuild("stats", "--json", cwd=tmp_path, store=store).json
    assert (zeroed["runs"], zeroed["hits"], zeroed["hit_rate"]) == (0, 0, None)
    assert zeroed["entries"] == 2  # the store's contents stay


# -- the store's size cap, and gc / clean without a project -----------------------------------

def test_the_default_size_cap_and_where_it_comes_from(tmp_path):
    from kbuild.config import load_config
    from kbuild.store.maintenance import DEFAULT_MAX_SIZE, max_size_setting

    assert DEFAULT_MAX_SIZE == 5 * 10**9  # ccache's default
    assert max_size_setting(env={}) == (DEFAULT_MAX_SIZE, "default")
    assert max_size_setting(env={"KBUILD_MAX_SIZE": "2GiB"}) == (2 * 1024**3, "KBUILD_MAX_SIZE")
    assert max_size_setting(env={"KBUILD_MAX_SIZE": "none"}) == (None, "KBUILD_MAX_SIZE")
    root = make_project(tmp_path / "p", _toml("sm_80", '\n[store]\nmax_size = "1MB"'),
                        {"k": KERNEL})
    config = load_config(root / "kbuild.toml", check_toolchain=False)
    assert max_size_setting(None, config, env={}) == (10**6, f"{config.path}: [store] max_size")
    assert max_size_setting(None, config, env={"KBUILD_MAX_SIZE": "3MB"})[0] == 3 * 10**6
    assert max_size_setting("4MB", config, env={"KBUILD_MAX_SIZE": "3MB"}) == \
        (4 * 10**6, "--max-size")


def test_a_build_over_the_cap_evicts_and_a_no_op_build_does_not_measure(tmp_path, run_kbuild):
    from support import counting, counts

    root = make_project(tmp_path / "p", TWO_TARGETS, {"k": KERNEL + KERNEL.split("\n\n", 1)[1]
                                                      .replace("def k", "def j")})
    store = tmp_path / "store"
    assert run_kbuild("build", cwd=root, store=store).returncode == 0
    assert len(list((store / "v1" / "entries").rglob("*.json"))) >= 3
    (root / "kbuild.toml").write_text(_toml("sm_90"))  # the sm_80 entries are not current
    built = run_kbuild("build", cwd=root, store=store, env={"KBUILD_MAX_SIZE": "1"})
    assert built.returncode == 0, built.stderr
    kept = {json.loads(p.read_text()).get("arch")
            for p in (store / "v1" / "entries").rglob("*.json")}
    assert kept == {"sm_90"}, kept  # evicted down to what the current target needs
    count = tmp_path / "count"
    spec = counting(count, "kbuild.store.local:Store.size")
    for full in ([], ["--full"]):
        noop = run_kbuild("build", *full, cwd=root, store=store, launcher=spec["launcher"],
                          env={**spec["env"], "KBUILD_MAX_SIZE": "1"})
        assert noop.returncode == 0 and "0 built" in noop.stdout, noop.stdout + noop.stderr
    assert counts(count) == {}  # nothing added: the store is not even measured


def test_gc_and_clean_all_without_a_project_file(tmp_path, run_kbuild):
    root = make_project(tmp_path / "p", TWO_TARGETS, {"k": KERNEL + KERNEL.split("\n\n", 1)[1]
                                                      .replace("def k", "def j")})
    store = tmp_path / "store"
    assert run_kbuild("build", cwd=root, store=store).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    gc = run_kbuild("gc", "--json", cwd=elsewhere, store=store, env={"KBUILD_MAX_SIZE": "1"})
    assert gc.returncode == 0, gc.stderr
    assert gc.json["evicted_entries"] == 3 and gc.json["bytes"] == 0
    assert run_kbuild("build", cwd=root, store=store).returncode == 0
    clean = run_kbuild("clean", "--all", "--json", cwd=elsewhere, store=store)
    assert clean.returncode == 0, clean.stderr
    assert clean.json["entries"] == 3 and not list((store / "v1" / "entries").rglob("*.json"))
    by_flag = run_kbuild("gc", "--store", store, cwd=elsewhere)
    assert by_flag.returncode == 0 and "the store now holds 0 blobs" in by_flag.stdout
    assert run_kbuild("clean", cwd=elsewhere, store=store).returncode == 2  # a project's own


# -- kbuild config ---------------------------------------------------------------------------

def test_config_prints_every_setting_with_its_origin(tmp_path, run_kbuild):
    root = make_project(tmp_path / "p", _toml("sm_90", 'store = "st"\n[store]\nmax_size = "1GB"'
                                              '\nremote_timeout = 2'), {"k": KERNEL})
    toml = root / "kbuild.toml"
    found = run_kbuild("config", "--json", cwd=root,
                       env={"KBUILD_REMOTE": "redis://cache:6379", "KBUILD_SIGNING_KEY": "s3cret"})
    assert found.returncode == 0, found.stderr
    settings = {r["name"]: (r["value"], r["origin"]) for r in found.json["settings"]}
    assert settings["project_file"] == (str(toml), "found here or above")
    assert settings["store"] == (str(root / "st"), f"{toml}: [project] store")
    assert settings["max_size"] == (10**9, f"{toml}: [store] max_size")
    assert settings["arch"] == (["sm_90"], f"{toml}: [project] arch")
    assert settings["direct"] == (True, "default")
    assert settings["remote"] == ("redis://cache:6379", "KBUILD_REMOTE")
    assert settings["remote_timeout"] == (2.0, f"{toml}: [store] remote_timeout")
    assert settings["signing_key"] == ("set", "KBUILD_SIGNING_KEY")
    assert "s3cret" not in found.stdout
    overridden = run_kbuild("--store", tmp_path / "other", "config", cwd=root,
                            env={"KBUILD_MAX_SIZE": "none"})
    lines = {line.split()[0]: line for line in overridden.stdout.splitlines()}
    assert lines["store"].endswith("(--store)") and str(tmp_path / "other") in lines["store"]
    assert lines["max_size"].split("=")[1].split()[0] == "(none)"
    assert lines["max_size"].endswith("(KBUILD_MAX_SIZE)")
    bare = run_kbuild("config", "--json", cwd=tmp_path, store=tmp_path / "s")
    settings = {r["name"]: (r["value"], r["origin"]) for r in bare.json["settings"]}
    assert settings["project_file"] == (None, "default")
    assert settings["store"] == (str(tmp_path / "s"), "KBUILD_STORE")
    assert settings["max_size"] == (5 * 10**9, "default")


# -- progress on a pipe ------------------------------------------------------------------------

def test_progress_lines_come_every_interval_and_from_the_heartbeat():
    """A driven clock: a line when `interval` has passed since the last one, whether a
    target started, finished, or only the heartbeat looked."""
    from types import SimpleNamespace

    from kbuild.cli.report import ProgressLines

    now, said = [0.0], []
    lines = ProgressLines(40, interval=5, clock=lambda: now[0], write=said.append)
    target = SimpleNamespace(name="m:k", signature="void()", arch="sm_80")
    row = SimpleNamespace(target="m:k", signature="void()", arch="sm_80", status="built")
    lines.started(target)
    now[0] = 3.0
    lines(row, 1, 40)
    assert said == []  # a build shorter than the interval prints nothing
    now[0] = 5.5
    lines.started(target)
    now[0] = 9.0
    lines.beat()
    now[0] = 10.5
    lines.beat()  # a long compile: the heartbeat says so
    now[0] = 12.0
    lines(row, 2, 40)
    assert said == ["kbuild: 1/40 done, 1 compiling (1 built)"] * 2
    lines.stop()
    now[0] = 100.0
    lines.beat()
    assert len(said) == 2


def test_a_piped_build_prints_progress_on_stderr_and_json_stays_whole(tmp_path, run_kbuild):
    root = make_project(tmp_path / "p", TWO_TARGETS, {"k": KERNEL + KERNEL.split("\n\n", 1)[1]
                                                      .replace("def k", "def j")})
    done = run_kbuild("build", "--json", cwd=root, store=tmp_path / "store",
                      env={"KBUILD_PROGRESS_INTERVAL": "0"})
    assert done.returncode == 0 and done.json["summary"]["built"] == 3
    progress = [line for line in done.stderr.splitlines() if line.startswith("kbuild: ")]
    done_counts = [int(line.split()[1].split("/")[0]) for line in progress]
    assert {1, 2, 3} <= set(done_counts), progress  # a line as each target finished
    assert done_counts == sorted(done_counts)
    assert progress[-1] == "kbuild: 3/3 done, 0 compiling (3 built)"
    quiet = run_kbuild("build", "-q", cwd=root, store=tmp_path / "store",
                       env={"KBUILD_PROGRESS_INTERVAL": "0"})
    assert "done," not in quiet.stderr
