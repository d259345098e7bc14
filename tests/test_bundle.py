"""Shipping kernels in a package: the example wheel, built, installed and launched.

examples/package (kbdemo) is built into a wheel by pip with kbuild's setuptools hook
(the real compiler builds its kernels into a temp store and `write_bundle` puts them in
the wheel), installed with pip into a fresh virtual environment, and launched there
from the bundle: under numba's simulator, and down to the driver boundary with the
fake driver (exact cubin on sm_90, the sm_80 PTX on sm_86, nothing for sm_75). Every
run there forbids building: a launch that needed a compile would fail. An edited
installed module is caught by its source digest and named.
"""

import importlib.util
import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from support import kbuild_argv, kbuild_env

REPO = Path(__file__).resolve().parents[1]

import wheel  # noqa: E402,F401 - in the test extras: setuptools needs it to build wheels

# Runs in the installed environment; any build or compile there is an error.
NO_BUILDS = """
import kbuild.builder
def _refuse(*a, **k):
    raise AssertionError("a compile was attempted")
kbuild.builder.build = kbuild.builder.compile_target = _refuse
"""

SIMULATED = NO_BUILDS + """
import json, numpy as np
from kbuild import Project
proj = Project.load(package="kbdemo", on_miss="error")
installed = proj.install()
from kbdemo.kernels import saxpy, scale
x = np.arange(8, dtype=np.float32)
out = np.zeros_like(x)
saxpy[1, 32](np.float32(2), x, x, out)
scale[1, 32](out, np.float32(0.5))
assert (out == 1.5 * x).all(), out
print(json.dumps({"installed": installed, "describe": proj.describe(),
                  "store": str(proj.store.root)}))
"""

FAKE_DRIVER = NO_BUILDS + """
import json, sys, numpy as np
from kbuild import Project, testing
proj = Project.load(package="kbdemo", on_miss="error")
arch = "sm_" + sys.argv[1]
with testing.fake_device(arch, proj.store) as fake:
    x = fake.array(np.arange(8, dtype=np.float32))
    described = proj.describe(arch)
    try:
        proj.kernel("kbdemo.kernels:saxpy")[1, 32](np.float32(2), x, x, x)
        proj.kernel("kbdemo.kernels:scale")[1, 32](x, np.float32(0.5))
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"loads": [k.kind for k in fake.loads] if error is None else [],
                      "launches": len(fake.launches), "error": error,
                      "describe": [r["artifact"] for r in described]}))
"""


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """(built wheel, venv python, env) with kbdemo installed from the wheel."""
    return _installed_wheel(tmp_path_factory.mktemp("bundle"))


def _installed_wheel(root: Path, variant=None):
    """The example package copied to `root`/src (and changed by `variant(src)`), built into
    a wheel by pip and installed into a fresh virtual environment; see `wheel_env`."""
    shutil.copytree(REPO / "examples" / "package", root / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "_kbuild", "build", "*.egg-info"))
    if variant is not None:
        variant(root / "src")
    env = kbuild_env(root, store=root / "store",
                     env={"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "--no-index", "-w", str(root / "dist"), str(root / "src")], env, cwd=root)
    wheel = next((root / "dist").glob("kbdemo-*.whl"))
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(root / "venv")
    python = root / "venv" / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     env, cwd=root).strip())
    # This interpreter's own site-packages (numba-cuda, with its .pth redirect) behind
    # the new environment's: this interpreter may itself be a virtual environment.
    (site / "_kbuild_test_base.pth").write_text("".join(
        f"import site; site.addsitedir({p!r})\n" for p in sys.path if p.endswith("site-packages")))
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
          "--no-index", str(wheel)], env, cwd=root)
    return wheel, python, dict(env, KBUILD_STORE=str(root / "no-store")), site


def _run(argv, env, cwd, check=True) -> str:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout if check else done


def _in_venv(wheel_env, code, *args, simulate=True):
    wheel, python, env, _ = wheel_env
    env = dict(env, NUMBA_ENABLE_CUDASIM="1") if simulate else env
    return subprocess.run([str(python), "-c", code, *args], env=env, cwd=wheel.parent,
                          capture_output=True, text=True)


def test_the_wheel_carries_the_bundle(wheel_env):
    import zipfile

    wheel = wheel_env[0]
    names = zipfile.ZipFile(wheel).namelist()
    manifest = json.loads(zipfile.ZipFile(wheel).read("kbdemo/_kbuild/bundle.json"))
    assert manifest["archs"] == ["sm_80", "sm_90"]
    assert len(manifest["targets"]) == 4  # 2 kernels x 1 signature x 2 archs
    assert set(manifest["modules"]) == {"kbdemo", "kbdemo.kernels"}  # the whole package
    entries = [n for n in names if "/_kbuild/store/v1/entries/" in n]
    assert len(entries) == 4  # the kernels only: no device-function objects, no index
    assert not [n for n in names if "/index/" in n or n.endswith("CACHEDIR.TAG")]
    assert wheel.stat().st_size < 100_000


def test_installed_wheel_launches_every_kernel_under_the_simulator(wheel_env):
    done = _in_venv(wheel_env, SIMULATED)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert "site-packages" in result["store"]  # the installed bundle, not the source tree
    assert len(result["installed"]) == 2
    assert [r["artifact"] for r in result["describe"]] == ["cubin", "cubin"]


@pytest.mark.parametrize("cc, loads, error", [
    ("90", ["cubin", "cubin"], None),  # the exact arch
    ("86", ["ptx", "ptx"], None),  # the highest arch below: the driver JITs its PTX
    ("75", [], "no usable artifact for device sm_75"),  # nothing at or below: on_miss
])
def test_fallback_chain_down_to_the_driver(wheel_env, cc, loads, error):
    done = _in_venv(wheel_env, FAKE_DRIVER, cc, simulate=False)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["loads"] == loads
    assert result["describe"] == (loads or ["error", "error"])
    assert (result["error"] is None) == (error is None)
    if error:
        assert error in result["error"]
    else:
        assert result["launches"] == 2


INSTALLED_FAKE_DRIVER = NO_BUILDS + """
import json, numpy as np
from kbuild import Project, testing
proj = Project.load(package="kbdemo", on_miss="error")
with testing.fake_device("sm_86", proj.store) as fake:
    proj.install()
    from kbdemo.kernels import saxpy
    type(saxpy).compile = _refuse  # numba's dispatcher must find the overload ready
    x = fake.array(np.arange(8, dtype=np.float32))
    saxpy[1, 32](np.float32(2), x, x, x)
    print(json.dumps({"loads": [k.kind for k in fake.loads], "launches": len(fake.launches)}))
"""


def test_install_hands_numba_the_bundled_ptx(wheel_env):
    done = _in_venv(wheel_env, INSTALLED_FAKE_DRIVER, simulate=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"loads": ["ptx"], "launches": 1}


EDITED_JIT = """
import json, numpy as np
from kbuild import Project
proj = Project.load(package="kbdemo", on_miss="jit")
x = np.ones(4, dtype=np.float32)
out = np.zeros_like(x)
proj.kernel("saxpy")[1, 4](np.float32(2), x, x, out)
print(json.dumps({"out": out.tolist(), "describe": [r["artifact"] for r in proj.describe()]}))
"""


def _tool_kbuild(src: Path) -> str:
    """The example's kbuild.toml as pyproject's [tool.kbuild] tables (the file removed)."""
    text = (src / "kbuild.toml").read_text()
    (src / "kbuild.toml").unlink()
    return "\n" + "".join(f"[tool.kbuild.{line[1:]}\n" if line.startswith("[") else line + "\n"
                          for line in text.splitlines())


def _setuptools_tool_kbuild(src: Path) -> None:
    pyproject = src / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + _tool_kbuild(src))


def _hatchling(src: Path) -> None:
    pyproject = src / "pyproject.toml"
    pyproject.write_text("""[build-system]
requires = ["hatchling", "kbuild"]
build-backend = "hatchling.build"

[project]
name = "kbdemo"
version = "0.1.0"
requires-python = ">=3.10"
dependencies = ["kbuild", "numba-cuda"]

[tool.hatch.build.targets.wheel]
packages = ["kbdemo"]

[tool.hatch.build.hooks.kbuild]
""" + _tool_kbuild(src))


@pytest.fixture(scope="module", params=["setuptools, [tool.kbuild]", "hatchling, [tool.kbuild]"])
def variant_env(request, tmp_path_factory):
    """The example wheel built another way: the setuptools hook reading pyproject's
    [tool.kbuild] (no kbuild.toml), and kbuild's hatchling build hook (issue 26)."""
    variant = {"setuptools, [tool.kbuild]": _setuptools_tool_kbuild,
               "hatchling, [tool.kbuild]": _hatchling}[request.param]
    return _installed_wheel(tmp_path_factory.mktemp("variant"), variant)


def test_a_wheel_built_from_tool_kbuild_or_by_hatchling_launches_its_bundle(variant_env):
    import zipfile

    wheel = variant_env[0]
    manifest = json.loads(zipfile.ZipFile(wheel).read("kbdemo/_kbuild/bundle.json"))
    assert manifest["project"] == "kbdemo" and manifest["archs"] == ["sm_80", "sm_90"]
    assert len(manifest["targets"]) == 4
    entries = [n for n in zipfile.ZipFile(wheel).namelist() if "/_kbuild/store/v1/entries/" in n]
    assert len(entries) == 4
    done = _in_venv(variant_env, SIMULATED)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert [r["artifact"] for r in result["describe"]] == ["cubin", "cubin"]


def test_an_edited_installed_module_is_named_or_jitted(wheel_env):
    site = wheel_env[3]
    module = site / "kbdemo" / "kernels.py"
    original = module.read_text()
    try:
        module.write_text(original.replace("a * x + y", "a * x - y"))
        done = _in_venv(wheel_env, SIMULATED)
        assert done.returncode != 0
        assert "kbdemo.kernels differ from the ones bundled" in done.stderr
        done = _in_venv(wheel_env, EDITED_JIT)  # on_miss="jit": numba runs the edited code
        assert done.returncode == 0, done.stdout + done.stderr
        result = json.loads(done.stdout.splitlines()[-1])
        assert result == {"out": [1.0] * 4, "describe": ["jit", "jit"]}
    finally:
        _restore(module, original)


def test_an_edited_sibling_module_of_the_package_is_named(wheel_env):
    """Not only the kernels' own module: any module of the package may hold what they call."""
    sibling = wheel_env[3] / "kbdemo" / "__init__.py"
    original = sibling.read_text()
    try:
        sibling.write_text(original + "SCALE = 2.0\n")
        done = _in_venv(wheel_env, SIMULATED)
        assert done.returncode != 0
        assert "installed module(s) kbdemo differ from the ones bundled" in done.stderr
    finally:
        _restore(sibling, original)


def _restore(module: Path, original: str):
    """Put a module's text back and drop the bytecode its edit left: the edit is the same
    size and may fall in the same second, which Python's (size, mtime in seconds) check of a
    .pyc cannot tell apart, so the edited bytecode would be imported again."""
    module.write_text(original)
    Path(importlib.util.cache_from_source(str(module))).unlink(missing_ok=True)


def _shadow_kernels_with_a_package(site: Path):
    """The issue 26 case: `kbdemo/kernels/` beside the untouched kernels.py; Python
    imports the folder."""
    folder = site / "kbdemo" / "kernels"
    folder.mkdir()
    (folder / "__init__.py").write_text(
        (site / "kbdemo" / "kernels.py").read_text().replace("a * x + y", "a * x - y"))
    return lambda: shutil.rmtree(folder)


def _another_copy_first_on_sys_path(site: Path):
    """A .pth putting another copy of the package (bundle and all, one module edited)
    ahead of site-packages."""
    other = site.parent / "elsewhere"
    shutil.copytree(site / "kbdemo", other / "kbdemo", ignore=shutil.ignore_patterns("__pycache__"))
    kernels = other / "kbdemo" / "kernels.py"
    kernels.write_text(kernels.read_text().replace("a * x + y", "a * x - y"))
    pth = site / "000-kbuild-test-first.pth"
    pth.write_text(f"import sys; sys.path.insert(0, {str(other)!r})\n")

    def undo():
        pth.unlink()
        shutil.rmtree(other)
    return undo


def _a_module_added(site: Path):
    """A module the bundle never saw, which the package may now import."""
    added = site / "kbdemo" / "extra.py"
    added.write_text("SCALE = 2.0\n")
    return added.unlink


def _the_same_bytes_from_a_package_folder(site: Path):
    """kernels.py's very bytes in `kbdemo/kernels/__init__.py`: another file is imported
    (its `__file__`, relative imports and line tables differ), so it is not the bundle's."""
    module = site / "kbdemo" / "kernels.py"
    folder = site / "kbdemo" / "kernels"
    folder.mkdir()
    (folder / "__init__.py").write_text(module.read_text())
    return lambda: shutil.rmtree(folder)


@pytest.mark.parametrize("change, named", [
    (_shadow_kernels_with_a_package, "kbdemo.kernels"),
    (_another_copy_first_on_sys_path, "kbdemo.kernels"),
    (_a_module_added, "kbdemo.extra"),
    (_the_same_bytes_from_a_package_folder, "kbdemo.kernels"),
])
def test_a_change_to_what_python_would_import_is_named(wheel_env, change, named):
    """Freshness follows the import system's resolution, not a walk over files: any
    change to what `import` would load for the package is caught (issue 26)."""
    undo = change(wheel_env[3])
    try:
        done = _in_venv(wheel_env, SIMULATED)
        assert done.returncode != 0, done.stdout
        assert f"installed module(s) {named} differ from the ones bundled" in done.stderr, \
            done.stderr
    finally:
        undo()
    done = _in_venv(wheel_env, SIMULATED)
    assert done.returncode == 0, done.stdout + done.stderr


def test_cli_bundle_deduplicates_and_refuses_what_is_not_built(wheel_env, tmp_path):
    wheel, _, env, _ = wheel_env
    root = wheel.parent.parent
    cli = kbuild_argv("--config", root / "src" / "kbuild.toml")
    out = _run(cli + ["--store", str(root / "store"), "bundle", str(tmp_path / "b"), "--json",
                      "--arch", "sm_80"], env, cwd=tmp_path)
    report = json.loads(out)
    manifest = json.loads((tmp_path / "b" / "bundle.json").read_text())
    assert report["targets"] == 2 and manifest["archs"] == ["sm_80"]
    blobs = list((tmp_path / "b" / "store").rglob("blobs/*/*/*"))
    named = [name for entry in (tmp_path / "b" / "store").rglob("entries/*/*.json")
             for name in json.loads(entry.read_text())["artifacts"].values()]
    assert report["blobs"] == len(blobs) == len(set(named))  # each blob stored once
    assert {"ptx", "cubin"} <= {k for e in (tmp_path / "b" / "store").rglob("entries/*/*.json")
                                for k in json.loads(e.read_text())["artifacts"]}
    assert report["bytes"] == sum(b.stat().st_size for b in blobs)
    done = _run(cli + ["--store", str(tmp_path / "empty"), "bundle", str(tmp_path / "c")],
                env, cwd=tmp_path, check=False)
    assert done.returncode == 2
    assert "4 target(s) not built" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("package, message", [
    ("kbuild_no_such_package", "package 'kbuild_no_such_package' is not installed"),
    ("email", "package 'email' ships no kbuild bundle"),
])
def test_a_package_without_a_bundle_is_named(package, message):
    from kbuild import Project
    from kbuild.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        Project.load(package=package)
