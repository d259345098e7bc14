"""The bytes keyed are the bytes compiled: a source file that changes while the build
imports it (here: a module whose import rewrites another file of the project, or of a
package beside it) never leaves a binary under a key it does not match.

numba compiles the code objects the import made; kbuild keys sources it reads again. So
every read of a module's source for keying is checked against the bytes the import
system loaded: a module changed since fails its targets, naming the file (run again: the
next process imports what is there now). Each case builds a project whose import
rewrites a file after it was imported, incrementally against a store built before that
edit and freshly into an empty store, and asserts that no target is `built` or `cached`
with bytes the fresh build does not make.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from editmatrix_support import build, short

KBUILD_TOML = """\
[project]
name = "rewrites"
paths = ["."]
arch = ["sm_80"]

[kernels."app.kernels:k"]
signatures = ["void(float32[::1])"]
"""

# Each case: the files of the project (and of `vendor/`, a package on PYTHONPATH beside it),
# and the module whose import rewrites a file (added by the edit).
CASES = {
    # A device function in a package outside the project's import roots.
    "vendored-device-function": ({
        "vendor/vend/__init__.py": "",
        "vendor/vend/helpers.py": "def scale(x):\n    return x * 2.0\n",
        "proj/app/__init__.py": "",
        "proj/app/kernels.py": """\
            from numba import cuda

            from vend import helpers
            from app import rewriter  # noqa: F401

            scale = cuda.jit(device=True)(helpers.scale)


            @cuda.jit
            def k(x):
                x[0] = scale(x[0])
            """,
        "proj/app/rewriter.py": "",
    }, ("proj/app/rewriter.py", """\
            import pathlib

            import vend.helpers

            pathlib.Path(vend.helpers.__file__).write_text(
                "def scale(x):\\n    return x * 3.0\\n")
            """)),
    # An extension type's module (keyed by its source, with its typing and lowering),
    # rewritten by a module imported after it.
    "extension-type-module": ({
        "proj/app/__init__.py": "",
        "proj/app/ext.py": """\
            from numba.cuda import cgutils, types
            from numba.cuda.extending import (core_models, lower_builtin,
                                              make_attribute_wrapper, register_model,
                                              type_callable)


            class Box:
                pass


            class BoxType(types.Type):
                def __init__(self):
                    super().__init__(name="Box")


            box_type = BoxType()


            @register_model(BoxType)
            class BoxModel(core_models.StructModel):
                def __init__(self, dmm, fe_type):
                    core_models.StructModel.__init__(self, dmm, fe_type, [("v", types.float32)])


            make_attribute_wrapper(BoxType, "v", "v")


            @type_callable(Box)
            def type_box(context):
                def typer(v):
                    return box_type
                return typer


            @lower_builtin(Box, types.Float)
            def make_box(context, builder, sig, args):
                box = cgutils.create_struct_proxy(box_type)(context, builder)
                box.v = context.cast(builder, args[0], sig.args[0], types.float32)
                return box._getvalue()
            """,
        "proj/app/kernels.py": """\
            from numba import cuda

            from app.ext import Box
            from app import rewriter  # noqa: F401


            @cuda.jit
            def k(x):
                x[0] = Box(x[0]).v
            """,
        "proj/app/rewriter.py": "",
    }, ("proj/app/rewriter.py", """\
            import pathlib

            import app.ext

            path = pathlib.Path(app.ext.__file__)
            path.write_text(path.read_text().replace(
                "box.v = context.cast(builder, args[0], sig.args[0], types.float32)",
                "box.v = builder.fmul(context.cast(builder, args[0], sig.args[0], "
                "types.float32), context.get_constant(types.float32, 4.0))"))
            """)),
}


def _write(root: Path, files: dict) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _project(where: Path, files: dict) -> Path:
    _write(where, files)
    (where / "proj" / "kbuild.toml").write_text(KBUILD_TOML)
    return where / "proj"


def _row(result: dict) -> dict:
    (row,) = [r for r in result["targets"] if short(r["target"]) == "k"]
    return row


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_file_rewritten_during_the_import_never_gets_a_stale_binary(tmp_path, name):
    files, (rewriter, code) = CASES[name]
    project = _project(tmp_path, files)
    env = {"PYTHONPATH": str(tmp_path / "vendor")}
    assert _row(build(project, tmp_path / "store", env_extra=env))["status"] == "built"

    _write(tmp_path, {rewriter: code})  # the edit: importing it now rewrites a file
    incremental = _row(build(project, tmp_path / "store", env_extra=env, expect_rc=1))
    fresh = _row(build(project, tmp_path / "fresh-store", env_extra=env))
    assert fresh["status"] == "built"
    # The incremental build imported the old bytes, then saw them rewritten: the target
    # fails, naming the file, rather than store what it compiled under the new key.
    assert incremental["status"] == "failed", incremental
    assert "changed after this process imported it" in incremental["error"]
    # The next build imports what is there now: the fresh build's bytes, under its key.
    again = _row(build(project, tmp_path / "store", env_extra=env))
    assert again["artifacts"] == fresh["artifacts"] and again["key"] == fresh["key"]


def test_a_module_keyed_by_its_source_is_checked_against_the_imported_bytes(tmp_path):
    """A class's module keyed by its whole source (`Keyer._project_class`) is read again
    for the key: the same check as a function's source."""
    from kbuild.errors import KeyingError
    from kbuild.sources import ProjectSources, record_imported_source

    path = tmp_path / "mod.py"
    path.write_text("X = 1\n")
    record_imported_source(str(path), path.read_bytes())
    sources = ProjectSources([tmp_path])
    before = sources.file_digest(str(path))
    path.write_text("X = 2\n")
    with pytest.raises(KeyingError, match="changed after this process imported it"):
        sources.file_digest(str(path))
    path.write_text("X = 1\n")  # the bytes imported again: the digest of those
    assert sources.file_digest(str(path)) == before
