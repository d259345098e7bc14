"""The Store class on a real directory: verified blobs, self-healing entries bound to their
targets, a tree that is never followed through a link."""

from __future__ import annotations

import enum
import json
import os

import pytest
import xxhash
from store_support import make_cubin, make_ptx

from kbuild.errors import StoreError
from kbuild.model import LinkMode
from kbuild.store import blobformat
from kbuild.store.local import MANIFEST_SCHEMA, CorruptBlob, Store

PTX = make_ptx("sm_80", "k")
CUBIN = make_cubin(80, ("k",))
KEY = "0123456789abcdef" * 2
OTHER_KEY = "fedcba9876543210" * 2


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path / "store")
    s.ensure_writable()
    yield s
    s.close()


def commit_entry(store: Store, key: str = KEY) -> dict:
    """One committed entry with two blobs; returns the manifest as `lookup` gives it."""
    artifacts = {"ptx": store.put_blob(PTX), "cubin": store.put_blob(CUBIN)}
    store.commit(key, {"target": "pkg.mod:k", "signature": "void()", "arch": "sm_80",
                       "artifacts": artifacts, "entry": "k", "cooperative": False, "inputs": []})
    return store.lookup(key)


def reopen(store: Store, **options) -> Store:
    store.close()
    return Store(store.root, **options)


# -- blobs --------------------------------------------------------------------------------

def test_blob_round_trip_is_named_by_content_and_deduplicated(store):
    name = store.put_blob(PTX)
    assert name == xxhash.xxh3_128_hexdigest(PTX)
    path = store.blob_path(name)
    assert path == store.root / "v1" / "blobs" / name[:2] / name[2:4] / name
    assert path.read_bytes() == blobformat.encode(PTX)  # compressed, named by its bytes
    assert store.read_blob(name) == PTX
    before = path.stat()

    assert store.put_blob(PTX) == name  # again: same name, file left as it was
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    other = store.put_blob(CUBIN)
    assert other != name
    assert sorted(store.blob_names()) == sorted([name, other])
    assert store.size() == (2, len(blobformat.encode(PTX)) + len(blobformat.encode(CUBIN)))
    assert list((store.base / "tmp").iterdir()) == []  # no temp files left behind


@pytest.mark.parametrize("damage", ["flip-a-byte", "truncate", "append"])
def test_an_altered_blob_is_detected_removed_and_reported(store, damage):
    name = store.put_blob(PTX)
    path = store.blob_path(name)
    data = bytearray(PTX)
    if damage == "flip-a-byte":
        data[10] ^= 0x01
    elif damage == "truncate":
        data = data[:-1]
    else:
        data += b"\0"
    path.write_bytes(bytes(data))

    with pytest.raises(CorruptBlob, match=f"blob {name} is corrupt"):
        store.read_blob(name)
    assert not path.exists()
    assert any(name in w and "corrupt" in w for w in store.warnings)
    with pytest.raises(CorruptBlob, match="missing"):
        store.read_blob(name)


def test_a_read_only_store_reports_a_corrupt_blob_but_leaves_it(store):
    name = store.put_blob(PTX)
    store.blob_path(name).write_bytes(PTX.upper())
    reader = reopen(store, read_only=True)
    with pytest.raises(CorruptBlob):
        reader.read_blob(name)
    assert store.blob_path(name).exists()
    assert reader.warnings


def test_putting_a_blob_again_repairs_a_damaged_copy(store):
    name = store.put_blob(PTX)
    store.blob_path(name).write_bytes(b"garbage")
    assert store.put_blob(PTX) == name
    assert store.read_blob(name) == PTX


@pytest.mark.parametrize("name", ["", "abc", "g" * 32, "../" + "0" * 29, "0" * 31 + "/"])
def test_read_blob_refuses_names_that_are_not_digests(store, name):
    with pytest.raises(CorruptBlob, match="not a blob name"):
        store.read_blob(name)
    assert not store.has_blob(name)


# -- entries ------------------------------------------------------------------------------

def test_commit_then_lookup_round_trips_the_manifest(store):
    manifest = commit_entry(store)
    assert manifest["schema"] == MANIFEST_SCHEMA and manifest["key"] == KEY
    assert manifest["artifacts"] == {"ptx": xxhash.xxh3_128_hexdigest(PTX),
                                     "cubin": xxhash.xxh3_128_hexdigest(CUBIN)}
    on_disk = json.loads(store.entry_path(KEY).read_text())
    assert on_disk == manifest
    assert store.entry_path(KEY) == store.root / "v1" / "entries" / KEY[:2] / f"{KEY}.json"
    assert reopen(store).lookup(KEY) == manifest
    assert store.lookup(OTHER_KEY) is None
    assert store.warnings == []


def test_commit_refuses_a_manifest_before_its_blobs(store):
    with pytest.raises(StoreError, match="before blob"):
        store.commit(KEY, {"artifacts": {"ptx": "0" * 32}, "entry": "k"})
    assert not store.entry_path(KEY).exists()


# name -> how to damage the entry file of KEY (the manifest as committed is passed in).
ENTRY_DAMAGE = {
    "not-json": lambda m: "{not json",
    "not-an-object": lambda m: "[1, 2, 3]",
    "empty-file": lambda m: "",
    "wrong-schema": lambda m: json.dumps({**m, "schema": MANIFEST_SCHEMA + 1}),
    "no-schema": lambda m: json.dumps({k: v for k, v in m.items() if k != "schema"}),
    "key-of-another-entry": lambda m: json.dumps({**m, "key": OTHER_KEY}),
    "artifacts-not-hashes": lambda m: json.dumps({**m, "artifacts": {"ptx": "../../etc"}}),
    "no-artifacts": lambda m: json.dumps({**m, "artifacts": {}}),
    "no-entry-symbol": lambda m: json.dumps({k: v for k, v in m.items() if k != "entry"}),
    "ptx-only": lambda m: json.dumps({**m, "artifacts": {"ptx": m["artifacts"]["ptx"]}}),
    "no-cooperative-flag": lambda m: json.dumps({k: v for k, v in m.items()
                                                 if k != "cooperative"}),
    "nested-100000-deep": lambda m: "[" * 100_000 + "]" * 100_000,
    "nested-in-a-field": lambda m: json.dumps({**m, "extra": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
        [[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}),
    "larger-than-4-MiB": lambda m: json.dumps({**m, "pad": "x" * (5 << 20)}),
    "sizes-not-numbers": lambda m: json.dumps({**m, "sizes": {"ptx": "big"}}),
    "entry-of-another-kernel": lambda m: json.dumps({**m, "entry": "other"}),
    "built-for-another-arch": lambda m: json.dumps({**m, "arch": "sm_90"}),
    "inputs-malformed": lambda m: json.dumps({**m, "inputs": [["target", 1]]}),
    "built-at-a-number": lambda m: json.dumps({**m, "built_at": 5}),
}


@pytest.mark.parametrize("damage", sorted(ENTRY_DAMAGE))
def test_a_damaged_manifest_file_is_a_miss_with_a_warning_and_is_removed(store, damage):
    manifest = commit_entry(store)
    path = store.entry_path(KEY)
    path.write_text(ENTRY_DAMAGE[damage](manifest))

    # A read-only store (status, explain) reports it but changes nothing.
    reader = Store(store.root, read_only=True)
    assert reader.lookup(KEY) is None
    assert any(KEY in w and "corrupt" in w for w in reader.warnings)
    assert path.exists()
    reader.close()

    assert store.lookup(KEY) is None
    assert any(KEY in w and "corrupt" in w for w in store.warnings), store.warnings
    assert not path.exists()
    assert list(store.entries()) == []
    assert reopen(store).lookup(KEY) is None


@pytest.mark.parametrize("artifact", ["ptx", "cubin"])
def test_a_manifest_naming_a_missing_blob_is_a_miss_and_is_removed(store, artifact):
    manifest = commit_entry(store)
    store.blob_path(manifest["artifacts"][artifact]).unlink()
    assert store.lookup(KEY) is None
    assert any(KEY in w and "missing blob" in w for w in store.warnings), store.warnings
    assert not store.entry_path(KEY).exists()
    assert reopen(store).lookup(KEY) is None


def test_entries_skips_and_removes_damaged_files(store):
    good = commit_entry(store, OTHER_KEY)
    commit_entry(store, KEY)
    store.entry_path(KEY).write_text("{")
    assert list(store.entries()) == [(OTHER_KEY, good)]
    assert not store.entry_path(KEY).exists()
    assert store.referenced_blobs() == set(good["artifacts"].values())


# -- set-up and permissions ------------------------------------------------------------------

def test_ensure_writable_creates_the_layout_and_a_cachedir_tag(tmp_path):
    root = tmp_path / "new" / "store"
    store = Store(root)
    assert not root.exists()  # nothing is created before it is needed
    store.ensure_writable()
    tag = (root / "CACHEDIR.TAG").read_bytes()
    assert tag.startswith(b"Signature: 8a477f597d28d172789f06886806bc55\n")
    for sub in ("blobs", "entries", "tmp"):
        assert (root / "v1" / sub).is_dir()
    store.ensure_writable()  # idempotent
    assert (root / "CACHEDIR.TAG").read_bytes() == tag
    assert list((root / "v1" / "tmp").iterdir()) == []


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_store_files_get_the_modes_the_umask_allows(tmp_path, umask, mode):
    # A store shared by a team (group-writable, umask 002) must be readable by the group.
    previous = os.umask(umask)
    try:
        store = Store(tmp_path / "store")
        store.ensure_writable()
        manifest = commit_entry(store)
        store.close()
    finally:
        os.umask(previous)
    files = [store.root / "CACHEDIR.TAG", store.entry_path(KEY)]
    files += [store.blob_path(name) for name in manifest["artifacts"].values()]
    assert {oct(path.stat().st_mode & 0o777) for path in files} == {oct(mode)}


def test_a_read_only_store_never_creates_anything(tmp_path):
    root = tmp_path / "absent"
    reader = Store(root, read_only=True)
    assert reader.lookup(KEY) is None
    assert list(reader.entries()) == []
    reader.close()
    assert not root.exists()


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="root ignores directory modes")
def test_a_read_only_directory_gives_a_store_error_naming_it(tmp_path):
    root = tmp_path / "readonly"
    root.mkdir()
    root.chmod(0o500)
    try:
        with pytest.raises(StoreError) as info:
            Store(root).ensure_writable()
    finally:
        root.chmod(0o700)
    assert str(root) in str(info.value)
    assert "not writable" in str(info.value)
    assert list(root.iterdir()) == []


def test_a_store_path_that_is_a_file_gives_a_store_error_naming_it(tmp_path):
    root = tmp_path / "a-file"
    root.write_text("not a directory")
    with pytest.raises(StoreError) as info:
        Store(root).ensure_writable()
    assert str(root) in str(info.value)
    assert "not writable" in str(info.value)
    assert root.read_text() == "not a directory"


# -- binding an entry to its target -----------------------------------------------------------

EXPECT = {"target": "pkg.mod:k", "signature": "void()", "arch": "sm_80"}


@pytest.mark.parametrize("field, value", [("target", "pkg.mod:other"),
                                          ("signature", "void(int32)"), ("arch", "sm_90")])
def test_an_entry_for_another_target_is_corrupt_and_warned_once(store, field, value):
    commit_entry(store)
    reader = reopen(store, read_only=True)
    for _ in range(3):
        assert reader.lookup(KEY, {**EXPECT, field: value}) is None
    assert len(reader.warnings) == 1 and field in reader.warnings[0], reader.warnings
    assert store.lookup(KEY, EXPECT) is not None


@pytest.mark.parametrize("ptx, cubin, problem", [
    (make_ptx("sm_90", "k"), CUBIN, "PTX targets sm_90"),
    (PTX, make_cubin(90, ("k",)), "cubin is built for sm_90"),
    (make_ptx("sm_80", "other"), CUBIN, "PTX does not define the kernel k"),
    (PTX, make_cubin(80, ("other",)), "CUBIN does not define the kernel k"),
    (PTX, b"not an ELF file", "not one"),
    (b"no target line", CUBIN, "not one"),
])
def test_artifacts_that_disagree_with_their_manifest_are_corrupt(store, ptx, cubin, problem):
    artifacts = {"ptx": store.put_blob(ptx), "cubin": store.put_blob(cubin)}
    store.commit(KEY, {**EXPECT, "artifacts": artifacts, "entry": "k", "cooperative": False,
                       "inputs": []})
    assert store.lookup(KEY, EXPECT) is None
    assert any(problem in w for w in store.warnings), store.warnings
    assert not store.entry_path(KEY).exists()


def test_a_kernel_symbol_must_be_the_expected_kernels_own(store):
    from kbuild.artifacts import names_kernel
    from kbuild.backend.binaries import entry_prefix

    prefix = entry_prefix("examples.closures", "make.<locals>.k")
    assert prefix == "_ZN8examples8closures4make12_3clocals_3e1k"
    assert names_kernel(prefix + "B16v1E5Array", prefix)
    assert not names_kernel(prefix + "12_3clocals_3e5innerB1E", prefix)  # one nested in it
    commit_entry(store)
    assert store.lookup(KEY, {**EXPECT, "entry_prefix": "_ZN3pkg3mod1k"}) is None
    assert any("another kernel's" in w for w in store.warnings)


# -- a tree kbuild owns ------------------------------------------------------------------------

def test_a_blob_larger_than_its_recorded_size_is_refused_unread(store):
    manifest = commit_entry(store)
    path = store.blob_path(manifest["artifacts"]["cubin"])
    path.write_bytes(path.read_bytes() + b"\0" * 100)
    assert reopen(store).lookup(KEY) is None
    assert not path.exists()


@pytest.mark.parametrize("what", ["entry", "blob"])
@pytest.mark.parametrize("kind", ["fifo", "link-to-dev-zero", "link-to-a-good-copy"])
def test_links_and_fifos_in_the_store_are_refused_without_blocking(store, tmp_path, what, kind):
    manifest = commit_entry(store)
    path = store.entry_path(KEY) if what == "entry" else \
        store.blob_path(manifest["artifacts"]["ptx"])
    copy = tmp_path / "copy"
    copy.write_bytes(path.read_bytes())
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero" if kind == "link-to-dev-zero" else copy)
    fresh = reopen(store)
    assert fresh.lookup(KEY) is None  # returns at once: the test would hang otherwise
    assert fresh.warnings
    assert not path.exists() and not path.is_symlink()  # the link itself went
    assert copy.exists()


def test_a_layout_folder_replaced_by_a_link_is_made_again_not_followed(store, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("mine")
    tmp = store.base / "tmp"
    tmp.rmdir()
    tmp.symlink_to(outside)
    fresh = reopen(store)
    fresh.ensure_writable()
    commit_entry(fresh)
    assert tmp.is_dir() and not tmp.is_symlink()
    assert [p.name for p in outside.iterdir()] == ["keep"]
    assert any("not a plain directory" in w for w in fresh.warnings)


# -- the blob format (store/blobformat.py) ------------------------------------------------------

def test_plain_blobs_of_an_older_store_still_read(store):
    """A blob written before compression (its bytes as they are) reads and verifies."""
    manifest = commit_entry(store)
    path = store.blob_path(manifest["artifacts"]["ptx"])
    path.write_bytes(PTX)  # as an older kbuild wrote it
    fresh = reopen(store)
    assert fresh.lookup(KEY) is not None and fresh.read_blob(manifest["artifacts"]["ptx"]) == PTX
    assert fresh.warnings == []


def test_a_blob_that_begins_with_the_envelopes_magic_still_reads(store):
    noise = b"".join(xxhash.xxh3_128_digest(bytes([i])) for i in range(256))
    data = blobformat.MAGIC + noise  # does not compress: kept as it is
    name = store.put_blob(data)
    assert store.blob_path(name).read_bytes() == data
    assert reopen(store).read_blob(name) == data


def test_an_unknown_blob_format_is_a_miss_with_a_warning_never_a_crash(store):
    manifest = commit_entry(store)
    path = store.blob_path(manifest["artifacts"]["cubin"])
    newer = bytearray(path.read_bytes())
    assert blobformat.is_packed(newer)
    newer[4] = blobformat.FORMAT + 1  # a newer kbuild's envelope
    path.write_bytes(bytes(newer))
    fresh = reopen(store)
    assert fresh.lookup(KEY) is None
    assert any("of an unknown format" in w and "format 2" in w for w in fresh.warnings)
    assert path.read_bytes() == bytes(newer)  # left for the kbuild that wrote it
    commit_entry(fresh)  # a rebuild writes it again in this kbuild's format
    assert reopen(store).lookup(KEY) is not None


def test_an_envelope_that_unpacks_past_its_recorded_size_is_refused(store):
    manifest = commit_entry(store)
    name = manifest["artifacts"]["ptx"]
    bomb = blobformat.encode(PTX * 10_000)
    assert len(bomb) < len(PTX) * 100  # small on disk, 10,000 times its size unpacked
    store.blob_path(name).write_bytes(bomb)
    fresh = reopen(store)
    assert fresh.lookup(KEY) is None  # read no further than the recorded size
    assert not store.blob_path(name).exists()


class _Level(enum.IntEnum):
    HIGH = 3


def test_a_manifest_is_written_as_json_indents_it():
    """The store writes manifests without json's slow indenting encoder: the same text."""
    import json

    from kbuild.store.manifest import manifest_text

    cases = [
        {"inputs": [[["target", "kernel m:k", "body"], "source", "0" * 32]] * 3, "schema": 1},
        {"b": [True, False, None, -0.0, 1e300, 2**70, "é\"\\\n\u2028", (1, [2, []])],
         "a": {}, "c": [], "d": {"z": {"y": [{}]}}, "e": 0.1},
        {"nan": float("nan"), "inf": [float("inf")]},  # json's own spelling
        {1: "a key that is not a string"},
        {"link": {"mode": LinkMode.RELINK}, "n": [_Level.HIGH, {"k": LinkMode.LTO}]},
    ]
    for value in cases:
        assert manifest_text(value) == json.dumps(value, sort_keys=True, indent=1)


def test_a_manifest_with_enums_is_written_without_json(monkeypatch):
    """A relinked entry's link mode is a `str` enum: json spells it as its string, and so
    does the fast path, without handing the whole manifest to json's slow encoder (it did,
    for every relinked target of an edit: twice the encoding work)."""
    import json

    from kbuild.store import manifest

    calls = []
    monkeypatch.setattr(manifest.json, "dumps", lambda *a, **k: calls.append(a) or "")
    value = {"link": {"mode": LinkMode.RELINK, "objects": ["a" * 32]}, "n": _Level.HIGH}
    assert manifest.manifest_text(value).startswith('{\n "link": {\n  "mode": "relink"')
    assert calls == []


def _kernel_object(**fields) -> dict:
    """A kernel object's manifest as a separate compile writes it (`lto.split`)."""
    from kbuild.artifacts import OBJECT_KIND

    return {"schema": MANIFEST_SCHEMA, "key": KEY, "arch": "sm_90", "kind": OBJECT_KIND,
            "artifacts": {"ltoir": "0" * 32}, "exports": [], "imports": [], "entry": "k",
            "cooperative": False, "link_flags": [], "lto": True, **fields}


@pytest.mark.parametrize("fields, problem", [
    ({}, None),
    ({"lto": False, "link_flags": ["-ftz=1", "-fma=1"]}, None),
    ({"lto": None}, "without an lto option"),
    ({"lto": "yes"}, "without an lto option"),
    ({"lto": True, "link_flags": ["-ftz=1"]}, "lto on and link flags"),
], ids=["lto", "no-lto-with-flags", "lto-missing", "lto-not-a-bool", "lto-with-flags"])
def test_a_kernel_objects_link_is_what_kbuild_writes(fields, problem):
    """A kernel object's `lto` option decides how its target is relinked: one without it
    (which kbuild never writes) is refused, not read as `lto=False` (a relink would make
    another cubin than numba's), and so is one with lto and float flags for its link."""
    from kbuild.store.manifest import EntryProblem, parse_manifest

    manifest = {k: v for k, v in _kernel_object(**fields).items() if v is not None}
    if problem is None:
        assert parse_manifest(KEY, json.dumps(manifest)) == manifest
    else:
        with pytest.raises(EntryProblem, match=problem):
            parse_manifest(KEY, json.dumps(manifest))
