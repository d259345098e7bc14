"""The versions of the installed packages that change what numba compiles are in every key
and in every failure record (issue 35): a numpy upgrade or downgrade never serves, nor fails
with, another version's result.

numba types numpy functions by the numpy it runs with (numba-cuda 0.30.4 registers an
overload for `np.row_stack`, which numpy 2.5 removed), so numpy's version is keyed with
numba's. kbuild reads a version from the distribution's installed metadata; a folder
earlier on PYTHONPATH holding `numpy-X.dist-info` is what an installed numpy X looks like to
that reader, so the tests change the recorded version without touching the environment,
and kbuild's keying, journal and store run as they do for a user.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_timeouts import BAD, QUICK, _failure_files, make_project

from kbuild.backend.toolchain import CUDA_WHEELS, DISTRIBUTIONS, distribution_versions, toolchain


def installed_as(folder: Path, name: str, version: str) -> Path:
    """`folder` holding the metadata pip writes for `name` `version` (its METADATA only)."""
    stem = name.replace("-", "_")  # as pip names the folder
    info = folder / f"{stem}-{version}.dist-info"
    for old in folder.glob(f"{stem}-*.dist-info"):
        if old != info:
            old.rename(info)  # the same folder, another version: what an upgrade leaves
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return folder


def test_the_toolchain_names_every_package_that_changes_the_compile():
    chain = toolchain()
    for name in ("numba-cuda", "numba", "llvmlite", "numpy", "cuda-bindings", "nvidia-nvvm",
                 "nvidia-nvjitlink", "nvidia-cuda-nvrtc", "nvvm", "nvjitlink", "python"):
        assert name in chain
    assert chain["numpy"] == __import__("numpy").__version__
    assert set(DISTRIBUTIONS + CUDA_WHEELS) <= set(chain)


def test_a_cuda_12_wheel_answers_for_its_name_and_a_missing_one_is_absent():
    from importlib.metadata import PackageNotFoundError

    found = {"nvidia-nvjitlink-cu12": "12.9.86", "numpy": "2.3.0"}

    def version_of(name):
        if name not in found:
            raise PackageNotFoundError(name)
        return found[name]

    assert distribution_versions(("numpy", "nvidia-nvjitlink", "nvidia-nvvm"), version_of) == \
        {"numpy": "2.3.0", "nvidia-nvjitlink": "12.9.86", "nvidia-nvvm": "absent"}


def test_another_numpy_moves_the_key_and_back_again_in_full_and_from_the_journal(
        tmp_path, store, run_kbuild):
    root = make_project(tmp_path / "project", "tcv_keys", {"quick": QUICK})
    shadow = tmp_path / "site"

    def keys(version, *extra):
        installed_as(shadow, "numpy", version)
        result = run_kbuild("keys", "--json", *extra, cwd=root, store=store,
                            env={"PYTHONPATH": str(shadow)})
        assert result.returncode == 0, result.stderr
        return result.json["digest"]

    old = keys("2.3.0", "--full")
    new = keys("2.4.0", "--full")
    assert new != old
    assert keys("2.3.0", "--full") == old
    # Direct mode: the journal of the last run names numpy's metadata, so a changed
    # version is seen without `--full` (PYTHONPATH itself is the same in every run).
    assert keys("2.3.0") == old
    assert keys("2.4.0") == new
    assert keys("2.4.0") == new


def test_a_failure_recorded_under_another_numpy_is_not_reported(tmp_path, store, run_kbuild):
    root = make_project(tmp_path / "project", "tcv_fail", {"bad": BAD})
    shadow = tmp_path / "site"

    def build(version):
        installed_as(shadow, "numpy", version)
        result = run_kbuild("build", "--json", cwd=root, store=store,
                            env={"PYTHONPATH": str(shadow)})
        (row,) = result.json["targets"]
        return row["status"], row["recorded"], row["key"]

    first = build("2.3.0")
    assert first[:2] == ("failed", False) and len(_failure_files(store)) == 1
    assert build("2.3.0") == ("failed", True, first[2])  # the record answers
    other = build("2.4.0")
    assert other[:2] == ("failed", False) and other[2] != first[2]  # compiled again
    assert len(_failure_files(store)) == 2
    assert build("2.3.0") == ("failed", True, first[2])


@pytest.mark.parametrize("name", ["numba", "cuda-bindings", "nvidia-cuda-nvrtc"])
def test_other_compiler_packages_move_the_key_too(tmp_path, store, run_kbuild, name):
    root = make_project(tmp_path / "project", "tcv_more", {"quick": QUICK})
    shadow = tmp_path / "site"
    digests = []
    for version in ("1.0.0", "1.0.1"):
        installed_as(shadow, name, version)
        result = run_kbuild("keys", "--json", "--full", cwd=root, store=store,
                            env={"PYTHONPATH": str(shadow)})
        assert result.returncode == 0, result.stderr
        digests.append(result.json["digest"])
    assert digests[0] != digests[1]
