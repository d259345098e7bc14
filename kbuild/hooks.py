"""What kbuild's build-backend hooks do (setuptools' `setuptools_hook`, hatchling's
`hatch_hook`): build the kernels a package's source tree declares and bundle them
into the package folder of the wheel being built.

The project file is the one beside pyproject.toml: a kbuild.toml, else pyproject's
`[tool.kbuild]` (`config.project_file`). The kernels are built into the store it names
(or $KBUILD_STORE, or the user's cache; no remote is asked) and bundled into
`<wheel root>/<package>/_kbuild`, where <package> is the top-level package of the
first declared kernel.
"""

from __future__ import annotations

from pathlib import Path


class HookError(Exception):
    """A build hook could not build or bundle the kernels; its text says why."""


def bundle_project(source: Path, wheel_root: Path) -> tuple[str, dict]:
    """Build the kernels of the package whose source tree is `source` and bundle them
    under `wheel_root`; (the package's folder name, `write_bundle`'s report)."""
    from .bundle import write_bundle
    from .config import project_file
    from .errors import KbuildError
    from .model import RowStatus
    from .packaged import BUNDLE_DIR
    from .project import Project

    try:
        project = Project.load(project_file(source), remote=False)
        failed = [r for r in project.build() if r.status == RowStatus.FAILED]
        if failed:
            raise HookError(f"kbuild: {failed[0].target} failed to build: {failed[0].error}")
        package = project.config.kernels[0].name.partition(":")[0].split(".")[0]
        return package, write_bundle(project, Path(wheel_root) / package / BUNDLE_DIR)
    except KbuildError as exc:
        raise HookError(f"kbuild: {exc}") from None
