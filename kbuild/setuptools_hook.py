"""A setuptools `build_py` that builds the project's kernels and bundles them into the wheel.

In setup.py / pyproject.toml: `cmdclass = {"build_py": kbuild.setuptools_hook.build_py}`
(pyproject: `[tool.setuptools.cmdclass] build_py = "kbuild.setuptools_hook.build_py"`).
The kernels declared beside setup.py/pyproject.toml (a kbuild.toml, else pyproject's
`[tool.kbuild]`) are built and bundled into `<package>/_kbuild` of the build directory
(see `hooks`). Hatchling's equivalent is `hatch_hook`.
"""

from __future__ import annotations

from pathlib import Path

from setuptools.command.build_py import build_py as _build_py

from .hooks import HookError, bundle_project


class build_py(_build_py):  # noqa: N801 - setuptools' own command name
    """Copy the package's files, then build and bundle its kernels among them."""

    def run(self):
        super().run()
        try:
            _, report = bundle_project(Path.cwd(), Path(self.build_lib))
        except HookError as exc:
            raise SystemExit(str(exc)) from None
        self.announce(f"kbuild: bundled {report['targets']} targets, {report['bytes']} bytes", 2)
