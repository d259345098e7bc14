"""Issue 26: hostile inputs that once broke kbuild, each a test; and the layer that makes them.

A remote that speaks Redis's protocol badly (oversized, trickling, wrong-type and truncated
replies: `fake_redis`), archives with oversized pax / GNU headers, links and sparse members,
links inside a file:// remote and the store, store paths that are not kbuild's, malformed
bundle manifests and missing folders. Each gives one clear line (or one warning and a miss)
and leaves the store consistent. Bounds are checked by what was read or allocated (bytes the
server sent, tracemalloc's peak), never by seconds; a subprocess or join timeout is only the
guard that turns a hang into a failure.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import tracemalloc
import zlib
from pathlib import Path

import pytest
from conftest import blob_bytes
from fake_redis import NIL, FakeRedis, Honest, endless, trickle
from store_support import make_cubin, make_ptx

from kbuild.errors import ConfigError
from kbuild.keying.encode import digest
from kbuild.store import archive
from kbuild.store.archive import ArchiveError, import_archive
from kbuild.store.local import Store, atomic_write
from kbuild.store.remote_settings import RemoteSettings
from kbuild.store.storage import Storage
from kbuild.store.signing import sign, signature_problem
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

HANG_GUARD = 120  # seconds: only a hang reaches it
CALM = 60  # seconds a remote call may take where time is not what a test is about
PEAK = 16 << 20  # bytes a refused hostile reply may cost, far below what it declares


# -- a tiny project, and a synthetic entry --------------------------------------------------------

TINY_TOML = """[project]
name = "tiny"
paths = ["."]
arch = ["sm_80"]

[kernels."tk:add1"]
signatures = ["void(float32[::1])"]
"""

TINY_PY = """from numba import cuda


@cuda.jit
def add1(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1
"""


def tiny_project(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kbuild.toml").write_text(TINY_TOML)
    (folder / "tk.py").write_text(TINY_PY)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, run_kbuild):
    """The tiny project built once: (project, store, its one row)."""
    base = tmp_path_factory.mktemp("tiny")
    project = tiny_project(base / "project")
    result = run_kbuild("build", "--json", cwd=project, store=base / "store")
    assert result.returncode == 0, result.stderr
    return project, base / "store", result.json["targets"][0]


@pytest.fixture
def serve():
    """`serve(answer)`: a FakeRedis answering with `answer`, stopped after the test."""
    servers = []

    def start(answer) -> FakeRedis:
        servers.append(FakeRedis(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def synthetic_entry(root: Path, pad: int = 0) -> tuple[Store, str, str]:
    """A store holding one valid entry made by hand (no compile): (store, key, its text);
    `pad` bytes of comment lengthen its PTX."""
    store = Store(root)
    store.ensure_writable()
    ptx = store.put_blob(make_ptx() + b"//" + b"." * pad + b"\n")
    cubin = store.put_blob(make_cubin())
    key = digest(b"synthetic entry")
    store.commit(key, {"artifacts": {"ptx": ptx, "cubin": cubin}, "arch": "sm_80",
                       "entry": "k", "target": "m:k", "signature": "void()",
                       "cooperative": False, "inputs": []}, push=False)
    return store, key, store.entry_path(key).read_text()


def pushed(settings: RemoteSettings, source: Store, key: str) -> Storage:
    """Entry `key` of `source` sent to the remote `settings` names, as a build's commit
    sends it; the storage that sent it (its `warnings`, its `remote` tier)."""
    sender = Storage(source.root, read_only=True, remote=settings)
    sender.push(key)
    return sender


def one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    return lines[0]


def remote_warnings(result) -> list[str]:
    return [line for line in result.stderr.splitlines()
            if line.startswith("kbuild: warning: remote")]


def peak_of(fn):
    """(what fn() returned, the peak bytes Python allocated meanwhile)."""
    tracemalloc.start()
    try:
        return fn(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# -- 1. signature fields of any type ------------------------------------------------------------

ODD_SIGNATURES = ["é" * 64, "\u0660" * 64, "\ud800", "", "0" * 63, "0" * 65, "g" * 64, "A" * 64,
                  5, 5.5, None, True, [], ["0" * 64], {"hmac": "0" * 64}]


@pytest.mark.parametrize("value", ODD_SIGNATURES,
                         ids=[f"{type(v).__name__}-{i}" for i, v in enumerate(ODD_SIGNATURES)])
def test_a_signature_field_of_any_type_is_a_refusal_never_an_exception(value):
    manifest = sign({"schema": 1, "key": "k"}, b"team-secret")
    assert signature_problem(manifest, b"team-secret") is None
    problem = signature_problem(dict(manifest, hmac=value), b"team-secret")
    assert isinstance(problem, str) and "sign" in problem
    assert signature_problem(dict(manifest, hmac=value), None) is None  # no key: not checked


def test_a_remote_entry_with_a_non_ascii_signature_is_one_warning_and_a_miss(tmp_path, serve):
    source, key, text = synthetic_entry(tmp_path / "source")
    honest = Honest()
    server = serve(honest)
    settings = RemoteSettings(server.url(), "test", timeout=CALM, signing_key=b"s")
    pushed(settings, source, key)
    entry = f"kbuild:v1:entry:{key}".encode()
    honest.data[entry] = json.dumps(dict(json.loads(honest.data[entry]), hmac="é" * 64)).encode()
    store = Storage(tmp_path / "store", remote=settings)
    assert store.lookup(key) is None
    assert len(store.warnings) == 1 and "signature" in store.warnings[0], store.warnings
    assert not store.has_entry(key)


def test_an_archive_entry_with_a_non_ascii_signature_is_refused_in_one_line(
        tmp_path, run_kbuild, tiny):
    project, seed, row = tiny
    path = tmp_path / "signed.tar"
    entry = json.loads((seed / "v1" / "entries" / row["key"][:2] /
                        f"{row['key']}.json").read_text())
    with tarfile.open(path, "w") as tar:
        for name in sorted(set(entry["artifacts"].values())):
            _add(tar, f"v1/blobs/{name}", blob_bytes(seed / "v1" / "blobs" / name[:2] /
                                                     name[2:4] / name))
        _add(tar, f"v1/entries/{row['key']}.json",
             json.dumps(dict(entry, hmac="é" * 64)).encode())
    result = run_kbuild("import", path, cwd=project, store=tmp_path / "store",
                        env={"KBUILD_SIGNING_KEY": "team-secret"}, timeout=HANG_GUARD)
    assert result.returncode == 2
    assert "signature" in one_line(result) and row["key"] in result.stderr
    assert not (tmp_path / "store" / "v1" / "entries").exists() or \
        not list((tmp_path / "store" / "v1" / "entries").rglob("*.json"))


def test_a_build_with_signing_on_survives_a_non_ascii_signature_in_the_remote(
        tmp_path, run_kbuild, tiny, serve):
    project, seed, row = tiny
    honest = Honest()
    server = serve(honest)
    pushed(RemoteSettings(server.url(), "test", timeout=CALM, signing_key=b"team-secret"),
           Store(seed, read_only=True), row["key"])
    entry = f"kbuild:v1:entry:{row['key']}".encode()
    honest.data[entry] = json.dumps(dict(json.loads(honest.data[entry]), hmac="é" * 64)).encode()
    result = run_kbuild("build", "--json", "--remote", server.url(), "--remote-timeout", CALM,
                        cwd=project, store=tmp_path / "store",
                        env={"KBUILD_SIGNING_KEY": "team-secret"}, timeout=HANG_GUARD)
    assert result.returncode == 0, result.stderr
    assert [r["status"] for r in result.json["targets"]] == ["built"]
    warnings = remote_warnings(result)
    assert len(warnings) == 1 and "signature" in warnings[0], result.stderr


# -- 2./3. Redis replies bounded as they stream, of the expected type or a miss -----------------

def _on_entry_read(reply):
    return lambda c: reply if c[0].upper() == b"GETRANGE" and b":entry:" in c[1] else None


def _on_blob_read(reply):
    return lambda c: reply if c[0].upper() == b"GETRANGE" and b":blob:" in c[1] else None


HOSTILE_REPLIES = {
    "integer": (b":5\r\n", "integer"),
    "array": (b"*1\r\n$1\r\nx\r\n", "array"),
    "nil": (NIL, "nil"),
    "error": (b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
              "WRONGTYPE"),
    "truncated": ([b"$5\r\nab", None], "closed the connection"),
    "unknown type": (b"?what\r\n", "unknown"),
    "resp3 map": (b"%1\r\n+a\r\n+b\r\n", "unknown"),
    "negative length": (b"$-7\r\n", "length"),
    "oversized": (lambda: endless(b"$1200000000\r\n"), "1200000000"),
    "endless header": (lambda: endless(b"$1", chunk=1 << 16), "line"),
}


def _reply(spec):
    return spec() if callable(spec) else spec


@pytest.mark.parametrize("read", ["entry", "blob"])
@pytest.mark.parametrize("case", sorted(HOSTILE_REPLIES))
def test_a_hostile_redis_reply_is_one_warning_and_a_miss_with_bounded_memory(
        tmp_path, case, read, serve):
    source, key, text = synthetic_entry(tmp_path / "source")
    spec, words = HOSTILE_REPLIES[case]
    honest = Honest()
    server = serve(honest)
    settings = RemoteSettings(server.url(), "test", timeout=CALM)
    sender = pushed(settings, source, key)
    assert not sender.remote.down and sender.warnings == []
    pick = _on_entry_read if read == "entry" else _on_blob_read
    honest.override = lambda c: pick(_reply(spec))(c) if c[0].upper() == b"GETRANGE" else None
    store = Storage(tmp_path / "store", remote=settings)
    found, peak = peak_of(lambda: store.lookup(key))
    assert found is None
    assert len(store.warnings) == 1, store.warnings
    assert store.warnings[0].startswith(f"remote {server.url()}"), store.warnings
    assert words in store.warnings[0], store.warnings
    assert "building with the local store only" in store.warnings[0]
    assert peak < PEAK, peak
    assert server.sent < 64 << 20  # of 1.2 GB declared: at most what sockets buffer
    other = digest(b"another key")
    assert store.lookup(other) is None  # the remote is not asked again
    # (by what was asked, not how many commands the server has noted: its thread may
    # still be noting the last of the first look-up's on a loaded machine)
    assert not any(other.encode() in part for command in server.commands for part in command)
    assert len(store.warnings) == 1
    assert not store.has_entry(key)


def test_an_oversized_reply_is_refused_at_its_header(tmp_path, serve):
    """The declared length is checked before a byte of the value is read: the client hangs
    up at once, and the server gets rid of little more than what the sockets buffer."""
    source, key, text = synthetic_entry(tmp_path / "source")
    honest = Honest()
    server = serve(honest)
    settings = RemoteSettings(server.url(), "test", timeout=CALM)
    pushed(settings, source, key)
    honest.override = _on_entry_read(endless(b"$1200000000\r\n"))
    store = Storage(tmp_path / "store", remote=settings)
    assert store.lookup(key) is None
    assert "larger than" in store.warnings[0] and "4194305" in store.warnings[0], store.warnings
    assert server.sent < 32 << 20


def _remote_threads():
    return [t for t in threading.enumerate() if t.name == "kbuild-remote"]


@pytest.mark.parametrize("read", ["entry", "blob"])
def test_a_trickling_redis_is_abandoned_at_the_deadline_by_the_reader_too(tmp_path, read, serve):
    """A server that sends a byte now and then forever: each socket read succeeds, so only a
    deadline over the whole reply stops it. The tier gives up after its timeout, and its
    reader thread stops too, instead of reading on in the background."""
    source, key, text = synthetic_entry(tmp_path / "source", pad=9000)
    honest = Honest()
    server = serve(honest)
    pushed(RemoteSettings(server.url(), "test", timeout=CALM), source, key)
    before = set(_remote_threads())
    # 8000 bytes (within the caps of the entry and of the PTX), one per 2 ms: 16 s to send
    # them all, each socket read quick (a timeout per read never fires).
    def override(c):
        if c[0].upper() == b"GETRANGE" and f":{read}:".encode() in c[1] and int(c[3]) > 8000:
            return trickle(b"$8000\r\n", 0.002, forever=True)
        return None
    honest.override = override
    store = Storage(tmp_path / "store",
                    remote=RemoteSettings(server.url(), "test", timeout=0.5))
    assert store.lookup(key) is None
    assert len(store.warnings) == 1 and "did not answer within 0.5s" in store.warnings[0], \
        store.warnings
    for thread in set(_remote_threads()) - before:
        thread.join(HANG_GUARD)  # the guard: a reader that ignores its deadline hangs here
        assert not thread.is_alive(), "the remote reader went on past its deadline"
    assert server.sent < 8000  # the reader stopped before the value was whole


def test_a_hostile_reply_to_auth_or_to_a_push_is_bounded_too(tmp_path, serve):
    source, key, text = synthetic_entry(tmp_path / "source")
    server = serve(Honest(lambda c: endless(b"$1200000000\r\n")
                              if c[0].upper() in (b"AUTH", b"EXEC") else None))
    said = []
    for url in (server.url().replace("//", "//:pw@"), server.url()):
        sender = Storage(source.root, read_only=True,
                         remote=RemoteSettings(url, "test", timeout=CALM))
        _, peak = peak_of(lambda: sender.push(key))
        assert sender.remote.down and peak < PEAK, peak
        said += sender.warnings
    assert len(said) == 2 and all("larger than" in w for w in said), said
    assert server.sent < 64 << 20


def test_a_build_against_a_redis_answering_integers_warns_once_and_builds(
        tmp_path, run_kbuild, tiny, serve):
    project, _, _ = tiny
    server = serve(Honest(lambda c: b":5\r\n" if c[0].upper() == b"GETRANGE" else None))
    result = run_kbuild("build", "--json", "--remote", server.url(), "--remote-timeout", CALM,
                        cwd=project, store=tmp_path / "store", timeout=HANG_GUARD)
    assert result.returncode == 0, result.stderr
    assert [r["status"] for r in result.json["targets"]] == ["built"]
    warnings = remote_warnings(result)
    assert len(warnings) == 1 and "integer" in warnings[0], result.stderr
    assert "Traceback" not in result.stderr


def test_project_load_with_a_redis_answering_lists_is_a_miss_not_a_crash(tmp_path, tiny, serve):
    project, _, row = tiny
    server = serve(Honest(lambda c: b"*1\r\n:1\r\n" if c[0].upper() == b"GETRANGE"
                              else None))
    code = """if True:
        import json, sys
        from kbuild import Project
        from kbuild.discover import Target
        proj = Project.load("kbuild.toml", store=sys.argv[1], on_miss="error")
        launcher = proj.kernel("tk:add1")
        sig = next(iter(launcher.resolved.argtypes))
        found = launcher._fresh_manifest(Target("tk:add1", sig, "sm_80"))
        print(json.dumps({"found": found is not None, "warnings": proj.store.warnings}))
    """
    env = dict(os.environ, KBUILD_REMOTE=server.url(), KBUILD_REMOTE_TIMEOUT=str(CALM),
               HOME=str(tmp_path))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "store")], cwd=project,
                          env=env, capture_output=True, text=True, timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["found"] is False
    assert len(result["warnings"]) == 1 and "array" in result["warnings"][0], result


def test_an_honest_fake_redis_round_trips_an_entry(tmp_path, serve):
    """The fake server keeps what a client SETs: the hostile cases above differ from a
    working remote only in the one reply they change."""
    source, key, text = synthetic_entry(tmp_path / "source")
    server = serve(Honest())
    settings = RemoteSettings(server.url(), "test", timeout=CALM)
    pushed(settings, source, key)
    store = Storage(tmp_path / "store", remote=settings)
    assert store.lookup(key)["key"] == key
    assert store.warnings == [] and store.has_entry(key)


# -- 4./5. tar headers bounded before anything parses them --------------------------------------

def _add(tar, name: str, data: bytes, **fields) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for field, value in fields.items():
        setattr(info, field, value)
    tar.addfile(info, io.BytesIO(data))


def _block_header(name: str, kind: bytes, size: int) -> bytes:
    """A raw ustar header block (tarfile would refuse to write the hostile ones)."""
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(tarfile.USTAR_FORMAT) if len(name) < 100 else \
        info.tobuf(tarfile.GNU_FORMAT)


def _gz_stream(path: Path, header: bytes, fill: bytes, size: int, tail: bytes = b"") -> None:
    """A .tar.gz of `header`, then `size` bytes of `fill`, padded, then `tail`, written in
    chunks (a 100 MB header costs a few hundred KB on disk)."""
    with gzip.open(path, "wb", compresslevel=6) as gz:
        gz.write(header)
        chunk = fill * ((1 << 20) // len(fill))
        left = size
        while left > 0:
            gz.write(chunk[:left])
            left -= len(chunk)
        gz.write(bytes(-size % 512) + tail + bytes(1024))


def _blob_member(data: bytes = b"payload") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        _add(tar, f"v1/blobs/{digest(data)}", data)
    return buffer.getvalue()[:-1024]  # without the end-of-archive blocks


def test_a_megabyte_pax_header_of_digits_is_refused_by_the_cli_at_its_size(
        tmp_path, run_kbuild, tiny):
    path = tmp_path / "pax.tar.gz"
    size = 1_000_000
    _gz_stream(path, _block_header("././@PaxHeader", tarfile.XHDTYPE, size), b"1", size,
               _blob_member())
    assert path.stat().st_size < 8192
    result = run_kbuild("import", path, cwd=tiny[0], store=tmp_path / "store", timeout=HANG_GUARD)
    assert result.returncode == 2
    line = one_line(result)
    assert "pax header" in line and f"{size} bytes" in line and "nothing was imported" in line
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("kind, what", [(tarfile.XHDTYPE, "pax header"),
                                        (tarfile.XGLTYPE, "pax header"),
                                        (tarfile.GNUTYPE_LONGNAME, "long name"),
                                        (tarfile.GNUTYPE_LONGLINK, "long link")])
def test_an_oversized_extended_header_is_refused_before_it_is_read(tmp_path, kind, what):
    path = tmp_path / "long.tar.gz"
    size = 100 << 20
    _gz_stream(path, _block_header("././@LongLink", kind, size), b"a", size, _blob_member())
    assert path.stat().st_size < 1 << 20
    def attempt():
        with pytest.raises(ArchiveError, match=f"{what} of {size} bytes") as caught:
            import_archive(Store(tmp_path / "store"), path, key=None)
        return str(caught.value)

    message, peak = peak_of(attempt)
    assert peak < PEAK, peak
    assert "nothing was imported" in message
    assert not (tmp_path / "store").exists()


def test_a_pax_header_of_malformed_records_is_refused(tmp_path):
    path = tmp_path / "records.tar"
    data = b"1" * 4000
    path.write_bytes(_block_header("././@PaxHeader", tarfile.XHDTYPE, len(data)) + data
                     + bytes(-len(data) % 512) + _blob_member() + bytes(1024))
    with pytest.raises(ArchiveError, match="malformed pax header"):
        import_archive(Store(tmp_path / "store"), path, key=None)


def test_pax_and_gnu_headers_within_their_bounds_are_read(tmp_path):
    """What other tar writers add (pax records, GNU long names) still imports: the bounds are
    on size, not on the format."""
    data = b"payload"
    name = f"v1/blobs/{digest(data)}"
    for fmt, extra in [(tarfile.PAX_FORMAT, {"comment": "c" * 60_000, "mtime": "1.5"}),
                       (tarfile.GNU_FORMAT, {}), (tarfile.USTAR_FORMAT, {})]:
        path = tmp_path / f"ok-{fmt}.tar.gz"
        with tarfile.open(path, "w:gz", format=fmt, pax_headers=extra) as tar:
            _add(tar, name, data, uname="u" * 40 if fmt == tarfile.GNU_FORMAT else "")
        assert import_archive(Store(tmp_path / f"s{fmt}"), path, key=None)["new_blobs"] == 1
    # A name given by a pax record or a GNU long-name header is the name that is checked.
    for fmt, member in [(tarfile.PAX_FORMAT, "v1/blobs/../" + "x" * 120),
                        (tarfile.GNU_FORMAT, "v1/../" + "y" * 120)]:
        path = tmp_path / f"escape-{fmt}.tar"
        with tarfile.open(path, "w", format=fmt) as tar:
            _add(tar, member, data)
        with pytest.raises(ArchiveError, match="absolute or '..' path"):
            import_archive(Store(tmp_path / "escape"), path, key=None)


def _sparse_gnu(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.size = tarfile.GNUTYPE_SPARSE, 0
    tar.fileobj.write(info.tobuf(tarfile.GNU_FORMAT))
    tar.offset += tarfile.BLOCKSIZE


def _sparse_pax(tar: tarfile.TarFile, name: str) -> None:
    _add(tar, name, b"x", pax_headers={"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                                       "GNU.sparse.name": name, "GNU.sparse.realsize": "9"})


def _link(kind, target="v1/blobs/" + "0" * 32):
    def add(tar, name):
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, target
        tar.addfile(info)
    return add


@pytest.mark.parametrize("member, add, message", [
    ("v1/blobs/" + "a" * 32, _link(tarfile.SYMTYPE, "/etc/passwd"), "not a regular file"),
    ("v1/blobs/" + "b" * 32, _link(tarfile.LNKTYPE), "not a regular file"),
    ("v1/blobs/" + "c" * 32, _link(tarfile.CHRTYPE), "not a regular file"),
    ("v1/blobs/" + "c" * 32, _link(tarfile.FIFOTYPE), "not a regular file"),
    ("v1/blobs", _link(tarfile.DIRTYPE), "not a regular file"),
    ("v1/blobs/" + "d" * 32, _sparse_gnu, "sparse"),
    ("v1/blobs/" + "e" * 32, _sparse_pax, "sparse"),
    ("/v1/blobs/" + "f" * 32, lambda tar, name: _add(tar, name, b"x"), "absolute or '..' path"),
    ("v1/blobs/../../x", lambda tar, name: _add(tar, name, b"x"), "absolute or '..' path"),
])
def test_links_devices_sparse_members_and_escaping_paths_stay_refused(tmp_path, member, add,
                                                                      message):
    path = tmp_path / "bad.tar.gz"
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        add(tar, member)
    with pytest.raises(ArchiveError, match=message) as caught:
        import_archive(Store(tmp_path / "store"), path, key=None)
    assert "nothing was imported" in str(caught.value)
    assert not (tmp_path / "store").exists()


def test_too_many_members_are_refused_while_scanning(tmp_path, monkeypatch):
    monkeypatch.setattr(archive, "MAX_MEMBERS", 10)
    path = tmp_path / "many.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(11):
            data = b"%d" % i
            _add(tar, f"v1/blobs/{digest(data)}", data)
    with pytest.raises(ArchiveError, match="more than 10 members"):
        import_archive(Store(tmp_path / "store"), path, key=None)


@pytest.mark.parametrize("content, message", [
    (b"not a tar archive at all" * 30, "not a readable tar archive"),
    (gzip.compress(b"\x01" * 2048), "not a readable tar archive"),
    (zlib.compress(b"x" * 100), "not a readable tar archive"),
    (b"", "not a readable tar archive"),
], ids=["text", "gzip of junk", "zlib", "empty"])
def test_what_is_not_a_tar_archive_is_one_error(tmp_path, content, message):
    path = tmp_path / "x.tar"
    path.write_bytes(content)
    with pytest.raises(ArchiveError, match=message):
        import_archive(Store(tmp_path / "store"), path, key=None)


def test_a_truncated_archive_imports_nothing(tmp_path):
    data = os.urandom(5000)
    whole = tmp_path / "whole.tar.gz"
    with tarfile.open(whole, "w:gz") as tar:
        _add(tar, f"v1/blobs/{digest(data)}", data)
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(gzip.compress(gzip.decompress(whole.read_bytes())[:3000]))
    with pytest.raises(ArchiveError, match="damaged"):
        import_archive(Store(tmp_path / "store"), cut, key=None)
    assert import_archive(Store(tmp_path / "store"), whole, key=None)["new_blobs"] == 1


# -- 6. no write through a link under a file:// remote or the store -----------------------------

@pytest.mark.parametrize("link", ["v1", "v1/blobs", "v1/entries", "v1/entries/{ab}",
                                  "v1/blobs/{bl}"])
def test_a_file_remote_with_linked_folders_writes_nothing_through_them(tmp_path, link):
    source, key, text = synthetic_entry(tmp_path / "source")
    remote = tmp_path / "remote"
    outside = tmp_path / "outside"
    outside.mkdir()
    blob = sorted(json.loads(text)["artifacts"].values())[0]
    where = remote / link.format(ab=key[:2], bl=blob[:2])
    where.parent.mkdir(parents=True)
    where.symlink_to(outside)
    sender = pushed(RemoteSettings(remote.as_uri(), "test", timeout=CALM), source, key)
    assert list(outside.rglob("*")) == []
    assert sender.remote.down and len(sender.warnings) == 1, sender.warnings
    assert "not a plain directory" in sender.warnings[0], sender.warnings
    assert where.is_symlink()  # a shared folder's link is refused, never replaced


def test_a_file_remote_never_reads_through_a_link(tmp_path):
    source, key, text = synthetic_entry(tmp_path / "source")
    planted = tmp_path / "planted"
    pushed(RemoteSettings(planted.as_uri(), "test", timeout=CALM), source, key)
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "v1").symlink_to(planted / "v1")
    store = Storage(tmp_path / "store",
                    remote=RemoteSettings(remote.as_uri(), "test", timeout=CALM))
    assert store.lookup(key) is None
    assert not store.has_entry(key)


@pytest.mark.parametrize("link", ["v1", "v1/blobs", "v1/entries", "v1/tmp"])
def test_the_store_replaces_a_linked_folder_and_writes_nothing_through_it(tmp_path, link):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "store"
    (root / link).parent.mkdir(parents=True)
    (root / "CACHEDIR.TAG").write_bytes(_kbuild_tag())
    (root / link).symlink_to(outside)
    synthetic_entry(root)
    assert list(outside.rglob("*")) == []


def test_atomic_write_never_follows_a_link_in_a_parent_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "store"
    root.mkdir()
    (root / "v1").symlink_to(outside)
    facts = root / "v1" / "facts" / "k1"
    with pytest.raises(OSError):
        atomic_write(facts / "x.json", b"{}", facts, prefix=".facts.")
    assert list(outside.rglob("*")) == []
    (root / "v1").unlink()
    atomic_write(facts / "x.json", b"{}", facts, prefix=".facts.")
    assert (facts / "x.json").read_bytes() == b"{}"


# -- 7. a store path that is not kbuild's -------------------------------------------------------

def _kbuild_tag() -> bytes:
    from kbuild.store import layout

    return layout._CACHEDIR_TAG


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


def test_a_folder_holding_other_files_is_refused_as_a_store(tmp_path, run_kbuild, tiny):
    project, _, _ = tiny
    folder = tmp_path / "documents"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    before = _tree(folder)
    for command in (["build"], ["gc"], ["clean", "--all"]):
        result = run_kbuild(*command, cwd=project, store=folder, timeout=HANG_GUARD)
        assert result.returncode == 2, (command, result.stderr)
        line = one_line(result)
        assert str(folder) in line and "fresh folder" in line, line
    assert _tree(folder) == before


def test_store_dot_dot_in_a_cloned_repo_is_refused(tmp_path, run_kbuild):
    parent = tmp_path / "src"
    project = tiny_project(parent / "clone")
    (project / "kbuild.toml").write_text(TINY_TOML.replace('arch = ["sm_80"]',
                                                           'arch = ["sm_80"]\nstore = ".."'))
    before = _tree(parent)
    result = run_kbuild("build", cwd=project, timeout=HANG_GUARD)
    assert result.returncode == 2
    assert "fresh folder" in one_line(result)
    assert _tree(parent) == before


def test_the_home_directory_and_the_root_are_refused_as_stores(tmp_path, run_kbuild, tiny):
    from kbuild.store.local import store_root_problem

    home = tmp_path / "home"
    home.mkdir()
    assert "home directory" in store_root_problem(home, home=home)
    assert "file system's root" in store_root_problem(Path("/"), home=home)
    result = run_kbuild("build", "--store", home, cwd=tiny[0], env={"HOME": home},
                        timeout=HANG_GUARD)
    assert result.returncode == 2 and "home directory" in one_line(result)
    assert list(home.iterdir()) == []


def test_clean_all_in_a_foreign_folder_removes_nothing(tmp_path, run_kbuild, tiny):
    folder = tmp_path / "other-program"
    blob = folder / "v1" / "blobs" / "ab" / "cd" / ("abcd" * 8)
    blob.parent.mkdir(parents=True)
    blob.write_text("another program's")
    (folder / "CACHEDIR.TAG").write_bytes(b"Signature: 8a477f597d28d172789f06886806bc55\n"
                                          b"# created by another program\n")
    before = _tree(folder)
    result = run_kbuild("clean", "--all", cwd=tiny[0], store=folder, timeout=HANG_GUARD)
    assert result.returncode == 2 and "fresh folder" in one_line(result)
    assert _tree(folder) == before


def test_an_empty_folder_and_a_kbuild_store_are_accepted(tmp_path, run_kbuild, tiny):
    project, seed, _ = tiny
    empty = tmp_path / "empty"
    empty.mkdir()
    import shutil

    older = tmp_path / "older"  # a store from before the tag: its layout is its marker
    shutil.copytree(seed, older)
    (older / "CACHEDIR.TAG").unlink()
    for store, status in [(empty, "built"), (seed, "cached"), (older, "cached")]:
        result = run_kbuild("build", "--json", cwd=project, store=store, timeout=HANG_GUARD)
        assert result.returncode == 0, result.stderr
        assert [r["status"] for r in result.json["targets"]] == [status]
    assert (empty / "CACHEDIR.TAG").read_bytes() == _kbuild_tag()


# -- 8. bundle manifests validated like store entries --------------------------------------------

def _good_bundle() -> dict:
    return {"format": 1, "project": "p", "archs": ["sm_80"],
            "kernels": [{"name": "m:k", "signatures": ["void()"], "archs": ["sm_80"]}],
            "targets": [{"target": "m:k", "signature": "void()", "arch": "sm_80",
                         "key": "0" * 32}],
            "modules": {"m": "0" * 32}, "toolchain": {}}


BAD_BUNDLES = {
    "not json": b"{not json",
    "not utf-8": b"\xff\xfe{}",
    "a list": b"[]",
    "deep": b"[" * 100_000,
    "huge": b'{"format": 1, "pad": "' + b"x" * (17 << 20) + b'"}',
    "no kernels": json.dumps({k: v for k, v in _good_bundle().items() if k != "kernels"}),
    "kernels not a list": json.dumps(dict(_good_bundle(), kernels=5)),
    "kernel without signatures": json.dumps(dict(_good_bundle(), kernels=[{"name": "m:k"}])),
    "signature not a string": json.dumps(dict(_good_bundle(), kernels=[
        {"name": "m:k", "signatures": [5], "archs": ["sm_80"]}])),
    "targets of strings": json.dumps(dict(_good_bundle(), targets=["m:k"])),
    "modules a list": json.dumps(dict(_good_bundle(), modules=["m"])),
    "project not a string": json.dumps(dict(_good_bundle(), project=None)),
}


@pytest.mark.parametrize("case", sorted(BAD_BUNDLES))
def test_a_malformed_bundle_manifest_is_one_config_error(tmp_path, monkeypatch, case):
    from kbuild import Project

    package = tmp_path / "site" / "badpkg"
    (package / "_kbuild").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    content = BAD_BUNDLES[case]
    (package / "_kbuild" / "bundle.json").write_bytes(
        content if isinstance(content, bytes) else content.encode())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ConfigError) as caught:
        Project.load(package="badpkg")
    message = str(caught.value)
    assert "bundle.json" in message and "\n" not in message, message


# -- 9. missing folders --------------------------------------------------------------------------

def test_export_into_a_missing_folder_names_it(tmp_path, run_kbuild, tiny):
    project, seed, _ = tiny
    missing = tmp_path / "nonexistent-dir"
    result = run_kbuild("export", missing / "x.tar", cwd=project, store=seed, timeout=HANG_GUARD)
    assert result.returncode == 2
    line = one_line(result)
    assert str(missing) in line and "does not exist" in line, line
    assert not missing.exists()


def test_clean_on_a_store_that_does_not_exist_yet_has_nothing_to_clean(
        tmp_path, run_kbuild, tiny):
    store = tmp_path / "never-built"
    for args in (["clean"], ["clean", "--all"]):
        result = run_kbuild(*args, cwd=tiny[0], store=store, timeout=HANG_GUARD)
        assert result.returncode == 0, result.stderr
        assert "nothing to clean" in result.stdout and result.stderr == ""
    result = run_kbuild("clean", "--json", cwd=tiny[0], store=store, timeout=HANG_GUARD)
    assert result.returncode == 0 and result.json["entries"] == 0
    assert not store.exists()

