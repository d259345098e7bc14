"""Optional HMAC signatures on entries that leave this machine (remote pushes, exports).

With a key in the environment ($KBUILD_SIGNING_KEY, or the variable that
`[store] signing_key_env` names), every entry pushed to a remote or written to
an archive carries ``"hmac"``: HMAC-SHA256 over the manifest's canonical JSON
(sorted keys, no whitespace, without the ``hmac`` field). The manifest names
its key, its target and its blobs' hashes, and blobs are verified against
their hashes, so the signature covers the binaries too. With a key set, an
unsigned or badly signed entry from a remote or an archive is refused. (The
model of Turborepo's signed remote-cache artifacts.)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re

from ..errors import ConfigError

DEFAULT_ENV = "KBUILD_SIGNING_KEY"
FIELD = "hmac"
_HEX64 = re.compile(r"\A[0-9a-f]{64}\Z")  # what `sign` writes: a SHA-256 HMAC in lower-case hex


def signing_key(config=None, env=None) -> bytes | None:
    """The key from the environment variable kbuild.toml names (default KBUILD_SIGNING_KEY)."""
    env = os.environ if env is None else env
    name = getattr(config, "signing_key_env", None) or DEFAULT_ENV
    value = env.get(name)
    if value is None or value == "":
        if name != DEFAULT_ENV:
            raise ConfigError(f"{config.path}: [store] signing_key_env names ${name}, "
                              "which is not set; set it or remove signing_key_env")
        return None
    return value.encode("utf-8")


def _canonical(manifest: dict) -> bytes:
    body = {k: v for k, v in manifest.items() if k != FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sign(manifest: dict, key: bytes | None) -> dict:
    """`manifest` with its signature (unchanged, unsigned, without a key)."""
    body = {k: v for k, v in manifest.items() if k != FIELD}
    if key is None:
        return body
    return dict(body, **{FIELD: hmac.new(key, _canonical(body), hashlib.sha256).hexdigest()})


def signature_problem(manifest: dict, key: bytes | None) -> str | None:
    """Why `manifest` is not signed with `key`, else None (always None without a key).

    The field comes from whoever wrote the entry, so it may hold anything JSON can: only
    a string of exactly what `sign` writes (64 lower-case hex digits) is compared, and
    as ASCII bytes, so no value can make the comparison raise.
    """
    if key is None:
        return None
    given = manifest.get(FIELD)
    if given is None:
        return "it is not signed (a signing key is set)"
    if not isinstance(given, str) or not _HEX64.match(given):
        return "its signature is malformed (not 64 hex digits of an HMAC-SHA256)"
    want = hmac.new(key, _canonical(manifest), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(given.encode("ascii"), want.encode("ascii")):
        return "its signature does not match the signing key"
    return None
