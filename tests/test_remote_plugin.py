"""A remote backend plugged in by name (`module:Class`, or plugin://module:Class?...): a
class of the project's own, found in its import roots, implementing the small interface
of `kbuild.store.remotes.base.Remote`. What it returns is verified as any remote's is."""

from __future__ import annotations

import textwrap

from conftest import copy_examples
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

ARCH = "sm_90"
SAXPY = "examples.saxpy:saxpy"

PLUGIN = '''
"""A team's cache: a folder named in the URL, one file per (kind, name)."""
import os
from urllib.parse import parse_qs, urlsplit

from kbuild.store.remotes.base import Remote


class FolderRemote(Remote):
    def __init__(self, settings):
        self.folder = parse_qs(urlsplit(settings.url).query)["dir"][0]
        self.name = "team folder"

    def _path(self, kind, name):
        return os.path.join(self.folder, f"{kind}-{name}")

    def get(self, kind, name, cap, deadline):
        try:
            with open(self._path(kind, name), "rb") as fh:
                return fh.read(cap + 1)
        except FileNotFoundError:
            return None

    def put(self, kind, name, data, deadline):
        os.makedirs(self.folder, exist_ok=True)
        with open(self._path(kind, name), "wb") as fh:
            fh.write(data)

    def remove(self, kind, name, deadline):
        try:
            os.unlink(self._path(kind, name))
            return True
        except FileNotFoundError:
            return False


class NoRemove:
    def __init__(self, settings):
        pass

    def get(self, kind, name, cap, deadline):
        return None

    def put(self, kind, name, data, deadline):
        pass
'''


def test_a_plugin_remote_from_the_project_shares_builds_and_is_verified(
        repo_root, run_kbuild, tmp_path):
    project = copy_examples(repo_root, tmp_path / "p")
    (project / "teamcache.py").write_text(textwrap.dedent(PLUGIN))
    folder = tmp_path / "team-cache"
    url = f"plugin://teamcache:FolderRemote?dir={folder}"
    first = run_kbuild("build", "--json", "--arch", ARCH, SAXPY, "--remote", url,
                       cwd=project, store=tmp_path / "s1")
    assert first.returncode == 0, first.stderr
    entries = sorted(p.name for p in folder.iterdir() if p.name.startswith("entry-"))
    assert f"entry-{first.json['targets'][0]['key']}" in entries

    second = run_kbuild("build", "--json", "--arch", ARCH, SAXPY, "--remote", url,
                        cwd=project, store=tmp_path / "s2")
    assert second.json["targets"][0]["status"] == "cached", second.stderr

    cubin = first.json["targets"][0]["artifacts"]["cubin"]
    (folder / f"blob-{cubin}").write_bytes(b"not a cubin")
    third = run_kbuild("build", "--json", "--arch", ARCH, SAXPY, "--remote", url,
                       cwd=project, store=tmp_path / "s3")
    assert third.json["targets"][0]["status"] == "built"
    assert [w for w in third.json["warnings"] if w.startswith("remote team folder: blob ")
            and cubin in w and "does not match its hash" in w]

    # The short form, from kbuild.toml.
    config = project / "kbuild.toml"
    assert "[store]" not in config.read_text()
    config.write_text(config.read_text()
                      + f'\n[store]\nremote = "teamcache:FolderRemote?dir={folder}"\n')
    fourth = run_kbuild("build", "--json", "--arch", ARCH, SAXPY, cwd=project,
                        store=tmp_path / "s4")
    assert fourth.json["targets"][0]["status"] == "cached", fourth.stderr


def test_a_plugin_that_is_missing_or_incomplete_is_a_configuration_error(
        repo_root, run_kbuild, tmp_path):
    project = copy_examples(repo_root, tmp_path / "p")
    (project / "teamcache.py").write_text(textwrap.dedent(PLUGIN))
    for name, message in [
            ("teamcache:Nope", "module 'teamcache' has no class 'Nope'"),
            ("teamcache:NoRemove", "teamcache:NoRemove does not implement remove; see "
                                   "kbuild.store.remotes.base.Remote"),
            ("nosuchmodule:Remote", "cannot import 'nosuchmodule'")]:
        done = run_kbuild("build", "--json", "--arch", ARCH, SAXPY, "--remote", name,
                          cwd=project, store=tmp_path / "s")
        assert done.returncode == 2, done.stderr
        assert done.json["error"].startswith(f"--remote: remote {name}: "), done.json
        assert message in done.json["error"]
