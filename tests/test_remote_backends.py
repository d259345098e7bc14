"""Every remote backend honours the one interface the tier uses (`remotes.base.Remote`):
get, put and remove of an entry or a blob, `exists`, and the batches built on them, against
the real engines (a folder, fsspec's memory filesystem, a redis-server, an nginx WebDAV
location)."""

from __future__ import annotations

import json
import shutil
import time
import uuid

import pytest

from kbuild.keying.encode import digest
from kbuild.store.remote_settings import RemoteSettings
from kbuild.store.remotes import open_backend
from kbuild.store.remotes.base import BLOB, ENTRY, Remote

from nginx_support import NGINX, NOT_INSTALLED, Nginx


@pytest.fixture(params=["file", "memory", "redis", "http"])
def backend(request, tmp_path):
    if request.param == "file":
        yield open_backend(RemoteSettings((tmp_path / "remote").as_uri(), "test"))
    elif request.param == "memory":
        yield open_backend(RemoteSettings(f"memory://kbuild-{uuid.uuid4().hex}", "test"))
    elif request.param == "redis":
        from test_remote import RedisServer

        server = RedisServer(tmp_path / "redis")
        yield open_backend(RemoteSettings(server.url("t:"), "test"))
        server.stop()
    else:
        if NGINX is None:
            pytest.skip(NOT_INSTALLED)
        server = Nginx(tmp_path / "nginx")
        yield open_backend(RemoteSettings(server.url(), "test"))
        server.stop()


def test_a_backend_gets_puts_and_removes_entries_and_blobs(backend):
    deadline = time.monotonic() + 30
    assert isinstance(backend, Remote)
    blobs = {digest(data): data for data in (b"ptx bytes", b"\x7fELF cubin bytes")}
    key = "a" * 32
    manifest = json.dumps({"artifacts": dict(zip(("ptx", "cubin"), sorted(blobs)))}).encode()
    assert backend.get(ENTRY, key, 1000, deadline) is None
    assert not backend.exists(ENTRY, key, deadline)

    backend.put_entry(key, manifest, blobs, deadline)
    assert backend.get(ENTRY, key, 1000, deadline) == manifest
    assert backend.exists(ENTRY, key, deadline)
    names = sorted(blobs)
    assert backend.get_blobs(names, [100, 100], deadline) == blobs
    # A read past its cap comes back cut at cap + 1 or as None (a folder's file over its
    # cap is a miss): the tier refuses either, and nothing reads it all.
    assert backend.get(ENTRY, key, 3, deadline) in (manifest[:4], None)

    assert backend.remove(ENTRY, key, deadline) is True
    assert backend.get(ENTRY, key, 1000, deadline) is None
    assert backend.remove(ENTRY, key, deadline) is False
    assert backend.remove(BLOB, names[0], deadline) is True
    assert backend.get_blobs(names, [100, 100], deadline) == {names[0]: None,
                                                              names[1]: blobs[names[1]]}


@pytest.mark.skipif(NGINX is None, reason=NOT_INSTALLED)
def test_the_http_remote_reopens_a_keep_alive_connection_the_server_closed(tmp_path):
    server = Nginx(tmp_path / "nginx", keepalive="1s")
    try:
        remote = open_backend(RemoteSettings(server.url(), "test"))
        deadline = time.monotonic() + 30
        assert remote.get(ENTRY, "b" * 32, 100, deadline) is None
        time.sleep(1.5)  # nginx closes the idle connection; the next call finds it closed
        assert remote.get(ENTRY, "b" * 32, 100, deadline) is None
        for _ in range(100):  # nginx logs a request after its answer is sent
            if len(server.requests()) == 2:
                break
            time.sleep(0.02)
        assert server.requests() == [f"GET /cache/ac/{_ac('b' * 32)} 404"] * 2
    finally:
        server.stop()


def _ac(key: str) -> str:
    from kbuild.store.remotes.http_remote import entry_address

    return entry_address(key)


@pytest.mark.skipif(NGINX is None or shutil.which("openssl") is None,
                    reason=f"{NOT_INSTALLED}, with the openssl command")
def test_https_verifies_the_server_certificate(tmp_path, monkeypatch):
    import ssl

    from nginx_support import self_signed

    server = Nginx(tmp_path / "nginx", {"ci": "pw"}, tls=self_signed(tmp_path))
    try:
        url = server.url("ci", "pw")
        assert url.startswith("https://")
        deadline = time.monotonic() + 30
        with pytest.raises(ssl.SSLCertVerificationError):
            open_backend(RemoteSettings(url, "test")).get(ENTRY, "c" * 32, 100, deadline)
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "cert.pem"))  # the team's CA
        remote = open_backend(RemoteSettings(url, "test"))
        blob = b"\x7fELF over TLS"
        remote.put_entry("c" * 32, json.dumps({"artifacts": {"cubin": digest(blob)}}).encode(),
                         {digest(blob): blob}, deadline)
        assert remote.get_blobs([digest(blob)], [100], deadline) == {digest(blob): blob}
    finally:
        server.stop()
