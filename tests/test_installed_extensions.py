"""A numba extension installed in site-packages (a vendored kernel library, or the project
itself installed without -e) is compile-time Python like the project's: what its
overloads read while numba compiles decides the binary, however they read it.

The extension `vext` lives in the site-packages of a virtual environment of its own
(numba-cuda reached through a `.pth` line, kbuild through PYTHONPATH). Its overloads read
an environment variable through `vhelp`, an installed package that does not build on
numba (a go-between, as cffi or a parser is); a file of the project's, by a path relative
to the working directory; its own settings module by a computed name, set by the
project's code at import; and a data file of its own installation, edited in place as an
upgrade does. A second package imports numba only inside the function that registers its
overload. Each edit is made in turn: its one kernel is built again with other bytes,
every other one is served from the store, and the last build equals a fresh one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import venv
from pathlib import Path

from support import REPO_ROOT, kbuild_env

VEXT = {
    "vext/__init__.py": '''
        import json
        import os

        from numba.core.extending import overload

        import vhelp
        from vext import settings


        def from_env(x):
            pass


        def from_project_file(x):
            pass


        def from_settings(x):
            pass


        def from_own_data(x):
            pass


        @overload(from_env, target="cuda")
        def _from_env(x):
            k = vhelp.scale()
            return lambda x: x * k


        @overload(from_project_file, target="cuda")
        def _from_project_file(x):
            with open("vext.json") as f:
                k = json.load(f)["k"]
            return lambda x: x + k


        @overload(from_settings, target="cuda")
        def _from_settings(x):
            k = getattr(settings, "MO" + "DE")
            return lambda x: x - k


        @overload(from_own_data, target="cuda")
        def _from_own_data(x):
            with open(os.path.join(os.path.dirname(__file__), "data.json")) as f:
                k = json.load(f)["k"]
            return lambda x: x * k + 1.0
        ''',
    "vext/settings.py": "MODE = 1.0\n",
    "vext/data.json": '{"k": 3.0}',
    # numba imported only where its overload is registered, when the project asks.
    "vlazy/__init__.py": '''
        import os


        def scale(x):
            pass


        def register():
            from numba.core.extending import overload

            @overload(scale, target="cuda")
            def _scale(x):
                k = float(os.environ.get("VLAZY_K", "2.0"))
                return lambda x: x * k
        ''',
    # No numba here: a helper the extension calls, whose reads are its caller's.
    "vhelp/__init__.py": '''
        import os


        def scale():
            return float(os.environ.get("VEXT_SCALE", "2.0"))
        ''',
}

KERNELS = ("k_env", "k_file", "k_settings", "k_data", "k_lazy")
PROJECT = {
    "kbuild.toml": '[project]\nname = "usesvext"\npaths = ["."]\narch = ["sm_80"]\n' + "".join(
        f'[kernels."app:{k}"]\nsignatures = ["void(float32[::1])"]\n' for k in KERNELS),
    "vext.json": '{"k": 2.0}',
    "app.py": '''
        from numba import cuda

        import vext
        import vext.settings
        import vlazy

        vext.settings.MODE = 4.0
        vlazy.register()


        @cuda.jit
        def k_env(a):
            a[0] = vext.from_env(a[0])


        @cuda.jit
        def k_file(a):
            a[0] = vext.from_project_file(a[0])


        @cuda.jit
        def k_settings(a):
            a[0] = vext.from_settings(a[0])


        @cuda.jit
        def k_data(a):
            a[0] = vext.from_own_data(a[0])


        @cuda.jit
        def k_lazy(a):
            a[0] = vlazy.scale(a[0])
        ''',
}


def _write(root: Path, files: dict) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


def _environment(where: Path) -> tuple[str, Path]:
    """(its python, its site-packages): a virtual environment that reaches numba-cuda
    (this one's site-packages, by a `.pth` line) and holds vext and vhelp installed."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    python = where / "bin" / "python"
    site = Path(subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    # A site folder, not only a path entry: its own .pth files (numba-cuda's) run too.
    (site / "outer.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    outer = Path(sysconfig.get_paths()["purelib"])
    if (outer / "nvidia").is_dir():  # CUDA's wheels, where cuda-pathfinder looks for them
        (site / "nvidia").symlink_to(outer / "nvidia")
    _write(site, VEXT)
    return str(python), site


def _build(python: str, project: Path, store: Path, home: Path, env=None) -> dict:
    proc = subprocess.run([python, "-m", "kbuild", "build", "--json"], cwd=project,
                          env=kbuild_env(home, store=store, env=env), capture_output=True,
                          timeout=600)
    out = json.loads(proc.stdout)
    assert proc.returncode == 0, [r.get("error") for r in out.get("targets", ())] or out
    return {r["target"].partition(":")[2]: (r["status"], r["artifacts"]["ptx"])
            for r in out["targets"]}


def test_what_an_installed_extension_reads_while_compiling_is_observed(tmp_path):
    assert str(REPO_ROOT) in kbuild_env(tmp_path)["PYTHONPATH"]
    python, site = _environment(tmp_path / "env")
    project, store, home = tmp_path / "proj", tmp_path / "store", tmp_path / "home"
    _write(project, PROJECT)
    env = {"VEXT_SCALE": "2.0", "VLAZY_K": "2.0"}
    before = _build(python, project, store, home, env)
    assert {status for status, _ in before.values()} == {"built"}
    assert _build(python, project, store, home, env) == \
        {k: ("cached", ptx) for k, (_, ptx) in before.items()}, "a no-op build rebuilt"

    edits = [
        ("k_env", "a variable read by a helper package the extension calls",
         lambda: env.update(VEXT_SCALE="5.0")),
        ("k_file", "a project file read by a path from the working directory",
         lambda: _replace(project / "vext.json", "2.0", "7.0")),
        ("k_settings", "its settings module's value, set by the project at import",
         lambda: _replace(project / "app.py", "MODE = 4.0", "MODE = 6.0")),
        ("k_data", "its installation's own data file, edited in place",
         lambda: _replace(site / "vext" / "data.json", "3.0", "9.0")),
        ("k_lazy", "a variable read by a package that imports numba only to register",
         lambda: env.update(VLAZY_K="5.0")),
    ]
    for kernel, what, edit in edits:
        edit()
        after = _build(python, project, store, home, env)
        assert after[kernel][0] == "built" and after[kernel][1] != before[kernel][1], \
            f"{what}: {kernel} was served {after[kernel][0]} with the bytes it had"
        others = {k: v for k, v in after.items() if k != kernel}
        assert others == {k: ("cached", before[k][1]) for k in others}, what
        before = after

    fresh = _build(python, project, tmp_path / "fresh", home, env)
    assert {k: ptx for k, (_, ptx) in fresh.items()} == \
        {k: ptx for k, (_, ptx) in before.items()}
