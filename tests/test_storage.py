"""Storage: the local store and the remote tier behind it, opened in one call by every entry
point. The local store knows nothing of remotes; nobody sets a store's tier or ledger from
outside `kbuild/store/`."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from store_support import make_cubin, make_ptx

from kbuild.store.local import Store
from kbuild.store.remote_settings import RemoteSettings
from kbuild.store.storage import Storage, open_storage

PACKAGE = Path(__file__).resolve().parents[1] / "kbuild"
KEY = "0123456789abcdef" * 2


def commit_one(store: Store) -> dict:
    """One entry with two blobs, committed to `store`; its manifest as `lookup` gives it."""
    store.ensure_writable()
    artifacts = {"ptx": store.put_blob(make_ptx("sm_80", "k")),
                 "cubin": store.put_blob(make_cubin(80, ("k",)))}
    store.commit(KEY, {"target": "pkg.mod:k", "signature": "void()", "arch": "sm_80",
                       "artifacts": artifacts, "entry": "k", "cooperative": False, "inputs": []})
    return store.lookup(KEY)


def test_nobody_outside_the_store_sets_a_stores_tier_or_ledger():
    """`store.remote = ...` / `x.store.ledger = ...` (any object but `self`: a class's own
    attribute of that name is its own) anywhere in kbuild outside kbuild/store/ (the CLI,
    zero-config, Project.load and the journal each did): the storage owns both."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if PACKAGE / "store" in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            found += [f"{path.relative_to(PACKAGE)}:{node.lineno}" for t in targets
                      if isinstance(t, ast.Attribute) and t.attr in ("remote", "ledger")
                      and not (isinstance(t.value, ast.Name) and t.value.id == "self")]
    assert found == []


def test_the_local_store_knows_nothing_of_remotes(tmp_path):
    assert not hasattr(Store(tmp_path / "s"), "remote")
    assert Store(tmp_path / "s").tier_counts() == {}


def test_a_storage_fills_a_miss_from_its_remote_and_pushes_what_it_commits(tmp_path):
    remote = RemoteSettings((tmp_path / "remote").as_uri(), "test")
    first = open_storage(tmp_path / "a", remote=remote)
    manifest = commit_one(first)  # the commit is pushed
    assert first.tier_counts()["remote_bytes_pushed"] > 0
    assert (tmp_path / "remote" / "v1" / "entries" / KEY[:2] / f"{KEY}.json").is_file()

    second = open_storage(tmp_path / "b", remote=remote)
    assert second.lookup(KEY, remote=False) is None  # asked of the local store only
    found = second.lookup(KEY)
    assert found["artifacts"] == manifest["artifacts"]
    assert second.tier_counts()["remote_hits"] == 1
    # The hit was written locally (blobs and entry), so the local store alone serves it.
    assert Store(tmp_path / "b").lookup(KEY)["artifacts"] == manifest["artifacts"]
    assert second.warnings == []


def test_a_read_only_storage_asks_no_remote_and_a_commit_without_push_sends_nothing(tmp_path):
    remote = RemoteSettings((tmp_path / "remote").as_uri(), "test")
    quiet = open_storage(tmp_path / "a", remote=remote)
    quiet.ensure_writable()
    artifacts = {"ptx": quiet.put_blob(make_ptx("sm_80", "k")),
                 "cubin": quiet.put_blob(make_cubin(80, ("k",)))}
    quiet.commit(KEY, {"target": "pkg.mod:k", "signature": "void()", "arch": "sm_80",
                       "artifacts": artifacts, "entry": "k", "cooperative": False,
                       "inputs": []}, push=False)
    assert not (tmp_path / "remote").exists()
    assert quiet.push(KEY) and (tmp_path / "remote" / "v1" / "entries").is_dir()
    reader = open_storage(tmp_path / "b", read_only=True, remote=remote)
    assert reader.lookup(KEY) is None and reader.tier_counts()["remote_misses"] == 0


def test_project_load_opens_its_store_with_the_remote_it_names(tmp_path, examples_project):
    from kbuild.project import Project

    url = (tmp_path / "remote").as_uri()
    project = Project.load(examples_project / "kbuild.toml", store=tmp_path / "store",
                           remote=url)
    assert isinstance(project.store, Storage) and project.store.remote.name == url
    alone = Project.load(examples_project / "kbuild.toml", store=tmp_path / "store",
                         remote=False)
    assert isinstance(alone.store, Storage) and alone.store.remote is None


def test_the_remote_tier_never_touches_a_store():
    """The tier fetches, verifies and sends bytes; writing into the store is the storage's
    (`storage.Storage`): no method of RemoteTier takes a store or calls one."""
    tree = ast.parse((PACKAGE / "store" / "remote.py").read_text())
    tier = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RemoteTier")
    names = {n.id for n in ast.walk(tier) if isinstance(n, ast.Name)} | \
        {a.arg for n in ast.walk(tier) if isinstance(n, ast.arguments) for a in n.args}
    assert "store" not in names


def test_a_pushed_entry_is_signed_and_verified_as_before(tmp_path, monkeypatch):
    """The signing of a push did not move: the remote's copy carries an hmac, and a storage
    with another key refuses it (one warning, a miss)."""
    remote = tmp_path / "remote"
    signed = RemoteSettings(remote.as_uri(), "test", signing_key=b"team")
    commit_one(open_storage(tmp_path / "a", remote=signed))
    stored = json.loads((remote / "v1" / "entries" / KEY[:2] / f"{KEY}.json").read_text())
    assert "hmac" in stored
    other = open_storage(tmp_path / "b", remote=RemoteSettings(remote.as_uri(), "test",
                                                               signing_key=b"other"))
    assert other.lookup(KEY) is None
    assert len(other.warnings) == 1 and "sign" in other.warnings[0], other.warnings
