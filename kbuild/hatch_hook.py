"""A hatchling build hook that builds the project's kernels and bundles them into the wheel.

In pyproject.toml:

    [build-system]
    requires = ["hatchling", "kbuild"]
    build-backend = "hatchling.build"

    [tool.hatch.build.hooks.kbuild]

kbuild registers the hook with hatchling by its entry point (`hatch` group, `kbuild`).
When a wheel is built, the kernels declared beside pyproject.toml (a kbuild.toml, else
its `[tool.kbuild]`) are built and bundled into `<package>/_kbuild` of the wheel (see
`hooks`); an sdist carries the sources only. The setuptools equivalent is
`setuptools_hook`.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.plugin import hookimpl

from .hooks import HookError, bundle_project


class KbuildBuildHook(BuildHookInterface):
    """Build and bundle the kernels into every wheel hatchling builds."""

    PLUGIN_NAME = "kbuild"

    def initialize(self, version, build_data):
        if self.target_name != "wheel":
            return
        self._staging = Path(tempfile.mkdtemp(prefix="kbuild-bundle-"))
        try:
            package, report = bundle_project(Path(self.root), self._staging)
        except HookError as exc:
            shutil.rmtree(self._staging, ignore_errors=True)
            raise SystemExit(str(exc)) from None
        bundled = self._staging / package
        for path in sorted(p for p in bundled.rglob("*") if p.is_file()):
            build_data["force_include"][str(path)] = path.relative_to(self._staging).as_posix()
        self.app.display_info(f"kbuild: bundled {report['targets']} targets, "
                              f"{report['bytes']} bytes")

    def finalize(self, version, build_data, artifact_path):
        staging = getattr(self, "_staging", None)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


@hookimpl
def hatch_register_build_hook():
    return KbuildBuildHook
