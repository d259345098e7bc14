"""The HTTP remote (Bazel's remote-cache protocol: /ac/ and /cas/) against a real nginx
WebDAV location, and `kbuild push` seeding it from a warm store.

nginx is Debian's (`.ci/run` installs it); without it these tests skip. The warm store is
the session's cold sm_90 build of the examples (conftest's `examples_template`).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time

import pytest

from kbuild.store.local import Store
from kbuild.store.remote_settings import RemoteSettings
from kbuild.store.storage import push_entries
from kbuild.store.storage import Storage
from kbuild.store.remotes.http_remote import entry_address

from conftest import blob_bytes, blob_files, built_examples, copy_examples
from nginx_support import NGINX, NOT_INSTALLED, Nginx
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

ARCH = "sm_90"
SAXPY = "examples.saxpy:saxpy"
USERS = {"ci": "s3cr3t-pw"}

needs_nginx = pytest.mark.skipif(NGINX is None, reason=NOT_INSTALLED)


@pytest.fixture
def nginx(tmp_path):
    server = Nginx(tmp_path / "nginx", USERS)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def warm(tmp_path_factory, examples_template):
    return built_examples(tmp_path_factory.mktemp("warm"), examples_template, ARCH)


def _remote_warnings(result) -> list[str]:
    return [w for w in result.stderr.splitlines() if w.startswith("kbuild: warning: remote")]


@needs_nginx
def test_push_seeds_an_nginx_webdav_remote_and_a_fresh_store_compiles_nothing(
        warm, nginx, run_kbuild, tmp_path):
    url = nginx.url("ci", USERS["ci"])
    pushed = run_kbuild("push", "--json", "--arch", ARCH, "--remote", url,
                        cwd=warm.project, store=warm.store)
    assert pushed.returncode == 0, pushed.stderr
    assert (pushed.json["entries"], pushed.json["missing"], pushed.json["down"]) == \
        (len(warm.rows), 0, False)
    assert pushed.json["objects"] > 0  # the kernels' objects, for relinks after an edit
    assert USERS["ci"] not in pushed.stdout + pushed.stderr
    assert pushed.json["remote"] == nginx.url("ci", "***")

    # Bazel's layout: every blob under the SHA-256 of its bytes, every entry in /ac/.
    cas = sorted(nginx.files.glob("cas/*"))
    assert cas and all(hashlib.sha256(p.read_bytes()).hexdigest() == p.name for p in cas)
    assert {entry_address(r["key"]) for r in warm.rows} <= \
        {p.name for p in nginx.files.glob("ac/*")}
    assert not [r for r in nginx.requests() if not r.endswith((" 201", " 204"))]

    fresh = run_kbuild("build", "--json", "--arch", ARCH, "--remote", url,
                       cwd=copy_examples(warm.project, tmp_path / "b"), store=tmp_path / "sb")
    assert fresh.returncode == 0, fresh.stderr
    assert [(r["key"], r["status"]) for r in fresh.json["targets"]] == \
        [(r["key"], "cached") for r in warm.rows]
    assert fresh.json["warnings"] == []
    stats = run_kbuild("stats", "--json", cwd=tmp_path / "b", store=tmp_path / "sb").json
    assert (stats["remote_hits"], stats["builds"]) == (len(warm.rows), 0)


@needs_nginx
def test_a_build_writes_back_over_http_and_a_tampered_cas_blob_is_refused(
        warm, nginx, run_kbuild, tmp_path):
    url = nginx.url("ci", USERS["ci"])
    checkout = copy_examples(warm.project, tmp_path / "p")
    first = run_kbuild("build", "--json", "--arch", ARCH, SAXPY, "--remote", url,
                       cwd=checkout, store=tmp_path / "s1")
    assert first.returncode == 0 and first.json["targets"][0]["status"] == "built"
    assert any(r.startswith("PUT /cache/ac/") for r in nginx.requests())

    cubin = Store(tmp_path / "s1").read_blob(first.json["targets"][0]["artifacts"]["cubin"])
    planted = nginx.files / "cas" / hashlib.sha256(cubin).hexdigest()
    planted.write_bytes(cubin[:-1] + bytes([cubin[-1] ^ 1]))  # one bit: not its SHA-256
    second = run_kbuild("build", "--json", "--arch", ARCH, SAXPY, "--remote", url,
                        cwd=checkout, store=tmp_path / "s2")
    assert second.returncode == 0, second.stderr
    assert second.json["targets"][0]["status"] == "built"
    [warning] = _remote_warnings(second)
    assert f"/cas/{planted.name} does not match its SHA-256" in warning
    assert "building it here" in warning and USERS["ci"] not in second.stderr
    assert cubin in [blob_bytes(p) for p in blob_files(tmp_path / "s2").values()]
    assert planted.read_bytes() == cubin  # the build's write-back put the real one back


@needs_nginx
def test_a_wrong_password_costs_one_warning_that_does_not_show_it(
        warm, nginx, run_kbuild, tmp_path):
    url = nginx.url("ci", "wr0ng-pw")
    done = run_kbuild("build", "--json", "--arch", ARCH, SAXPY, "--remote", url,
                      cwd=copy_examples(warm.project, tmp_path / "p"), store=tmp_path / "s")
    assert done.returncode == 0 and done.json["targets"][0]["status"] == "built"
    [warning] = _remote_warnings(done)
    assert "answered 401 Unauthorized; check the user and password in the URL" in warning
    assert warning.startswith(f"kbuild: warning: remote {nginx.url('ci', '***')} failed")
    assert "wr0ng-pw" not in done.stdout + done.stderr


# -- a server that lies: bounded before reading ----------------------------------------------

class _Liar(http.server.BaseHTTPRequestHandler):
    """Every GET answers 200 declaring `length` bytes, then sends them slowly or not at all."""

    length = 10 << 30
    sent = 0

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", str(type(self).length))
        self.end_headers()
        for _ in range(50):
            try:
                self.wfile.write(b"x" * 1024)
                self.wfile.flush()
            except OSError:
                return
            type(self).sent += 1024
            time.sleep(0.1)

    def log_message(self, *args):
        pass


@pytest.fixture
def liar():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Liar)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Liar.sent = 0
    yield server
    server.shutdown()
    server.server_close()


def test_an_oversized_answer_is_refused_at_its_header_and_a_trickle_at_its_deadline(
        liar, tmp_path):
    url = f"http://127.0.0.1:{liar.server_address[1]}/cache"
    store = Storage(tmp_path / "store", remote=RemoteSettings(url, "test", timeout=2))
    _Liar.length = 10 << 30  # 10 GiB declared: refused unread, the remote stays in use
    assert store.lookup("0" * 32) is None
    assert not store.remote.down
    assert [w for w in store.warnings if "10737418240 bytes, more than the" in w]
    _Liar.length = 4096  # within the cap, but sent 1 KiB per 0.1 s: the deadline stops it
    store = Storage(tmp_path / "store", remote=RemoteSettings(url, "test", timeout=0.25))
    started = time.monotonic()
    assert store.lookup("1" * 32) is None
    assert time.monotonic() - started < 2
    assert store.remote.down and any("did not answer within 0.25s" in w for w in store.warnings)


def test_push_entries_counts_what_the_remote_took(warm, tmp_path):
    """`push_entries` through a file:// remote (no nginx needed): entries, the objects they
    link from, and a target the store lacks."""
    remote = tmp_path / "remote"
    result = push_entries(Storage(warm.store, read_only=True,
                                  remote=RemoteSettings(remote.as_uri(), "test")),
                          [r["key"] for r in warm.rows] + ["f" * 32])
    assert (result["entries"], result["missing"], result["missing_keys"]) == \
        (len(warm.rows), 1, ["f" * 32])
    assert result["objects"] == len(list((remote / "v1" / "entries").glob("*/*.json"))) \
        - len(warm.rows)
    fresh = Storage(tmp_path / "fresh", remote=RemoteSettings(remote.as_uri(), "test"))
    assert all(fresh.lookup(r["key"]) is not None for r in warm.rows)
    assert json.loads(fresh.entry_path(warm.rows[0]["key"]).read_text())["key"] == \
        warm.rows[0]["key"]


# -- S3, with its endpoint and region in the URL, against a real S3 server (moto) ----------

@pytest.fixture
def s3_server(tmp_path):
    """moto's S3 server on a free loopback port, with one bucket; (endpoint, env)."""
    moto = pytest.importorskip("moto.server", reason="pip install -e '.[test]' (moto[server])")
    pytest.importorskip("s3fs", reason="pip install -e '.[test]' (s3fs)")
    import socket
    import subprocess
    import sys

    from nginx_support import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", "from moto.server import main; main()",
                             "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "moto did not start"
            time.sleep(0.1)
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_ENDPOINT_URL": None, "AWS_DEFAULT_REGION": None, "AWS_CONFIG_FILE": None}
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/kbuild-ci", method="PUT"))
    yield endpoint, env
    proc.terminate()
    proc.wait(timeout=10)
    assert moto  # imported only to skip without it


def test_s3_with_endpoint_and_region_in_the_url_shares_a_warm_store(
        warm, s3_server, run_kbuild, tmp_path):
    endpoint, env = s3_server
    url = f"s3://kbuild-ci/team/cache?endpoint_url={endpoint}&region=eu-west-1"
    pushed = run_kbuild("push", "--json", "--arch", ARCH, "--remote", url,
                        "--remote-timeout", "60", cwd=warm.project, store=warm.store, env=env)
    assert pushed.returncode == 0, pushed.stderr
    assert (pushed.json["entries"], pushed.json["down"]) == (len(warm.rows), False)

    fresh = run_kbuild("build", "--json", "--arch", ARCH, "--remote", url,
                       "--remote-timeout", "60", cwd=copy_examples(warm.project, tmp_path / "b"),
                       store=tmp_path / "sb", env=env)
    assert fresh.returncode == 0, fresh.stderr
    assert {r["status"] for r in fresh.json["targets"]} == {"cached"}
    assert fresh.json["warnings"] == []

    bad = run_kbuild("build", "--json", "--arch", ARCH, "--remote",
                     f"s3://kbuild-ci/team/cache?endpoint={endpoint}",
                     cwd=tmp_path / "b", store=tmp_path / "sb", env=env)
    assert bad.returncode == 2
    assert "unknown option 'endpoint' for s3://; use anon, endpoint_url, profile, region, " \
        "requester_pays" in bad.json["error"]


# -- a server with bazel-remote's rules --------------------------------------------------------

class _Bazelish(http.server.BaseHTTPRequestHandler):
    """What bazel-remote enforces on its HTTP API (with --disable_http_ac_validation): an
    optional instance name, 64 lower-case hex digits, a CAS upload whose bytes have its
    SHA-256 (else 400), no DELETE; objects in memory."""

    objects: dict = {}
    protocol_version = "HTTP/1.1"

    def _address(self):
        parts = self.path.strip("/").split("/")
        if len(parts) not in (2, 3) or parts[-2] not in ("ac", "cas") or \
                len(parts[-1]) != 64 or parts[-1].strip("0123456789abcdef"):
            return None
        return parts[-2], parts[-1]

    def _answer(self, status, body=b""):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        address = self._address()
        found = address and type(self).objects.get(address)
        self._answer(200, found) if found is not None else self._answer(404)

    def do_PUT(self):  # noqa: N802
        address = self._address()
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if address is None or address[0] == "cas" and \
                hashlib.sha256(body).hexdigest() != address[1]:
            self._answer(400, b"bad digest")
            return
        type(self).objects[address] = body
        self._answer(200)

    def log_message(self, *args):
        pass


def test_a_bazel_remote_like_server_serves_signed_entries_and_refuses_other_keys(
        warm, run_kbuild, tmp_path):
    _Bazelish.objects = {}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Bazelish)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/kbuild"
    signed = {"KBUILD_SIGNING_KEY": "team-key"}
    try:
        checkout = copy_examples(warm.project, tmp_path / "p")
        first = run_kbuild("build", "--json", "--arch", ARCH, SAXPY, "--remote", url,
                           cwd=checkout, store=tmp_path / "s1", env=signed)
        assert first.returncode == 0 and first.json["warnings"] == []
        assert {kind for kind, _ in _Bazelish.objects} == {"ac", "cas"}
        second = run_kbuild("build", "--json", "--arch", ARCH, SAXPY, "--remote", url,
                            cwd=checkout, store=tmp_path / "s2", env=signed)
        assert second.json["targets"][0]["status"] == "cached", second.stderr
        other = run_kbuild("build", "--json", "--arch", ARCH, SAXPY, "--remote", url,
                           cwd=checkout, store=tmp_path / "s3",
                           env={"KBUILD_SIGNING_KEY": "not-the-team-key"})
        assert other.json["targets"][0]["status"] == "built"
        assert any("its signature does not match the signing key" in w
                   for w in other.json["warnings"])
    finally:
        server.shutdown()
        server.server_close()
