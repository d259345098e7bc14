"""A real nginx serving a WebDAV location on a free loopback port, for the HTTP remote's
tests: the location the README shows (`dav_methods PUT DELETE; create_full_put_path on;`),
with basic auth when asked. Debian's package (`apt-get install nginx-light` or `nginx`);
the tests that need it skip when it is not installed."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)
NOT_INSTALLED = "nginx is not installed (apt-get install -y nginx-light, or nginx)"

_CONF = """
daemon off;
master_process off;
user {user} {group};
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log {root}/access.log;
    client_body_temp_path {root}/tmp/body;
    proxy_temp_path {root}/tmp/proxy;
    fastcgi_temp_path {root}/tmp/fastcgi;
    uwsgi_temp_path {root}/tmp/uwsgi;
    scgi_temp_path {root}/tmp/scgi;
    client_max_body_size 512m;
    keepalive_timeout {keepalive};
    server {{
        listen 127.0.0.1:{port}{tls};
        location /cache/ {{
            root {root}/www;
            dav_methods PUT DELETE;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
            {auth}
        }}
    }}
}}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Nginx:
    """nginx in the foreground under `root`; `url(user, password)` names its /cache/."""

    def __init__(self, root: Path, users: dict | None = None, keepalive: str = "75s",
                 tls: tuple | None = None):
        self.root = root
        for folder in ("www/cache", "tmp"):
            (root / folder).mkdir(parents=True, exist_ok=True)
        auth = ""
        if users:
            (root / "htpasswd").write_text("".join(f"{u}:{{PLAIN}}{p}\n"
                                                   for u, p in users.items()))
            auth = f'auth_basic "kbuild"; auth_basic_user_file {root}/htpasswd;'
        self.port = free_port()
        (root / "nginx.conf").write_text(_CONF.format(
            root=root, port=self.port, auth=auth, keepalive=keepalive,
            tls=f" ssl; ssl_certificate {tls[0]}; ssl_certificate_key {tls[1]}" if tls else "",
            user=pwd.getpwuid(os.getuid()).pw_name, group=grp.getgrgid(os.getgid()).gr_name))
        self.scheme = "https" if tls else "http"
        self.proc = subprocess.Popen([NGINX, "-c", str(root / "nginx.conf"), "-p", str(root)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"nginx exited at start: {self.proc.stderr.read()}")
                assert time.monotonic() < deadline, "nginx did not start in 15 s"
                time.sleep(0.05)

    def url(self, user: str | None = None, password: str | None = None) -> str:
        auth = f"{user}:{password}@" if user is not None else ""
        return f"{self.scheme}://{auth}127.0.0.1:{self.port}/cache"

    @property
    def files(self) -> Path:
        """Where the location's files are: cache/ac/<sha256> and cache/cas/<sha256>."""
        return self.root / "www" / "cache"

    def requests(self) -> list[str]:
        """'METHOD path status' of every request served so far (its access log)."""
        lines = (self.root / "access.log").read_text().splitlines()
        return [" ".join(line.split('"')[1].split()[:2] + [line.split('"')[2].split()[0]])
                for line in lines]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)


def self_signed(folder: Path) -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1, made by the openssl command."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key
