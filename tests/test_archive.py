"""kbuild export / import: a verified archive moves a store to another machine and path."""

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from support import run

from kbuild.store.archive import ArchiveError, export_archive, import_archive
from kbuild.store.local import Store

def _kbuild(cwd, store, *args):
    return run(*args, "--store", store, cwd=cwd, home=Path(cwd).parent / "home")


@pytest.fixture(scope="module")
def machine_a(tmp_path_factory, examples_template):
    """(root, build JSON): root/project and root/store, the session's cold sm_90 build."""
    root = tmp_path_factory.mktemp("machine-a")
    made = examples_template("sm_90")
    made.copy_to(root / "project", root / "store")
    return root, made.json


def test_export_then_import_gives_an_all_cached_build_at_another_path(machine_a, tmp_path):
    root, first = machine_a
    keys = [row["key"] for row in first["targets"]]
    archive = tmp_path / "kernels.tar.gz"
    result = export_archive(Store(root / "store"), keys, archive)
    assert result["entries"] == len(keys)
    # "Machine B": another checkout path, an empty store.
    shutil.copytree(root / "project", tmp_path / "b" / "elsewhere")
    store_b = Store(tmp_path / "b" / "store")
    merged = import_archive(store_b, archive)
    assert merged["new_entries"] == len(keys)
    again = import_archive(store_b, archive)
    assert again["new_entries"] == 0 and again["new_blobs"] == 0  # idempotent
    done = _kbuild(tmp_path / "b" / "elsewhere", tmp_path / "b" / "store", "build", "--json",
                   "--arch", "sm_90")
    rows = json.loads(done.stdout)["targets"]
    assert {r["status"] for r in rows} == {"cached"}
    assert [r["key"] for r in rows] == keys


def _tar_with(tmp_path, add):
    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w") as tar:
        add(tar)
    return path


def _member(tar, name, data=b"x", kind=tarfile.REGTYPE, linkname=""):
    info = tarfile.TarInfo(name)
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.type = kind
    info.linkname = linkname
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


@pytest.mark.parametrize("name, kind, linkname, message", [
    ("../escape", tarfile.REGTYPE, "", "absolute or '..' path"),
    ("/etc/passwd", tarfile.REGTYPE, "", "absolute or '..' path"),
    ("v1/blobs/" + "a" * 32, tarfile.SYMTYPE, "/etc/passwd", "not a regular file"),
    ("v1/blobs/" + "b" * 32, tarfile.LNKTYPE, "v1/blobs/x", "not a regular file"),
    ("v1/blobs/" + "c" * 32, tarfile.CHRTYPE, "", "not a regular file"),
    ("v1/other.txt", tarfile.REGTYPE, "", "unexpected member"),
])
def test_unsafe_members_are_refused_and_nothing_is_imported(tmp_path, name, kind, linkname, message):
    archive = _tar_with(tmp_path, lambda tar: _member(tar, name, kind=kind, linkname=linkname))
    store = Store(tmp_path / "store")
    with pytest.raises(ArchiveError, match=message):
        import_archive(store, archive)
    assert not (tmp_path / "store").exists()


def test_a_blob_that_does_not_match_its_hash_is_refused(tmp_path):
    archive = _tar_with(tmp_path, lambda tar: _member(tar, "v1/blobs/" + "d" * 32, b"payload"))
    with pytest.raises(ArchiveError, match="does not match its hash"):
        import_archive(Store(tmp_path / "store"), archive)


def test_a_manifest_naming_an_absent_blob_is_refused(tmp_path):
    key = "e" * 32
    manifest = {"schema": 1, "key": key, "artifacts": {"ptx": "a" * 32, "cubin": "f" * 32},
                "entry": "k", "target": "m:k", "signature": "void()", "arch": "sm_80",
                "cooperative": False, "inputs": []}
    archive = _tar_with(tmp_path, lambda tar: _member(
        tar, f"v1/entries/{key}.json", json.dumps(manifest).encode()))
    with pytest.raises(ArchiveError, match="neither in the archive nor in the store"):
        import_archive(Store(tmp_path / "store"), archive)
