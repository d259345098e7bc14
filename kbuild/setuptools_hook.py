"""A setuptools `build_py` that builds the project's kernels and bundles them into the wheel.

In setup.py / pyproject.toml: `cmdclass = {"build_py": kbuild.setuptools_hook.build_py}`
(pyproject: `[tool.setuptools.cmdclass] build_py = "kbuild.setuptools_hook.build_py"`).
The kbuild.toml beside setup.py/pyproject.toml is built (into the store it names, or
$KBUILD_STORE, or the user's cache) and bundled into `<package>/_kbuild` of the build
directory, where <package> is the top-level package of the first declared kernel.
Hatchling would need the same few lines as a build hook plugin: not written yet.
"""

from __future__ import annotations

from pathlib import Path

from setuptools.command.build_py import build_py as _build_py


class build_py(_build_py):  # noqa: N801 - setuptools' own command name
    """Copy the package's files, then build and bundle its kernels among them."""

    def run(self):
        super().run()
        from .bundle import write_bundle
        from .errors import KbuildError
        from .model import RowStatus
        from .packaged import BUNDLE_DIR
        from .project import Project

        project = Project.load(Path.cwd() / "kbuild.toml", remote=False)
        failed = [r for r in project.build() if r.status == RowStatus.FAILED]
        if failed:
            raise SystemExit(f"kbuild: {failed[0].target} failed to build: {failed[0].error}")
        package = project.config.kernels[0].name.partition(":")[0].split(".")[0]
        try:
            report = write_bundle(project, Path(self.build_lib) / package / BUNDLE_DIR)
        except KbuildError as exc:
            raise SystemExit(f"kbuild: {exc}") from None
        self.announce(f"kbuild: bundled {report['targets']} targets, {report['bytes']} bytes", 2)
