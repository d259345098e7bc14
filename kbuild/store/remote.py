"""The remote tier: a cache shared by machines, behind the local store.

Read-through: a key the local store lacks is asked of the remote, and a hit
fills the local store (blobs first, manifest last) before it is used.
Write-back: an entry a build commits is pushed. Both are done by `storage.Storage`,
which owns the local store and this tier; the tier never touches the store.
Backends are existing engines, never a server of our own, each a module of
`remotes/` behind one small interface (`remotes.base.Remote`: get, put, remove):

    redis://[:password@]host:port/db[?prefix=kbuild:]   (rediss:// for TLS)
    s3://bucket/prefix[?endpoint_url=...&region=...], gs://..., file:///path (fsspec)
    http(s)://[user:password@]host[:port]/prefix   (Bazel's HTTP cache: /ac/, /cas/)
    module:Class or plugin://module:Class   (a project's own backend)

Nothing from a remote is trusted: a manifest is validated as the store
validates its own files and every blob is checked against its name. An entry
whose blob is gone (evicted) is a plain miss. A remote that fails, hangs or
refuses costs one warning and is not asked again in this process; every call
runs under a timeout, so a dead remote never fails nor stalls a build.

Which remote, and how (URL, read-only, timeout, budget, signing key), is
`remote_settings`'s to say; seeding a remote with a store's entries (`kbuild push`)
is `storage.push_entries`.
"""

from __future__ import annotations

import json
import threading
import time

from ..keying.encode import digest
from .layout import MAX_BLOB
from .manifest import MAX_JSON_BYTES, EntryProblem, parse_manifest
from .remote_settings import DEFAULT_BUDGET, DEFAULT_TIMEOUT, RemoteSettings
from .remotes import open_backend
from .remotes.base import ENTRY, Deadline, Tampered
from .remotes.urls import redact, scrub, url_secrets
from .signing import sign, signature_problem

__all__ = ["RemoteTier", "open_remote", "redact", "scrub", "url_secrets", "Deadline"]

_FAILED = object()


def open_remote(settings: RemoteSettings | None, warnings: list | None = None) -> RemoteTier | None:
    """The tier for `settings`, saying its problems into `warnings`; a URL no backend
    takes is a ConfigError (nothing is contacted)."""
    if settings is None:
        return None
    backend = open_backend(settings)
    return RemoteTier(backend, timeout=settings.timeout, read_only=settings.read_only,
                      budget=settings.budget, signing_key=settings.signing_key,
                      secrets=url_secrets(settings.url), warnings=warnings)


# -- the tier -----------------------------------------------------------------------------

class RemoteTier:
    """A backend, its timeout, this build's time budget and counts; what `Storage.remote`
    holds. Everything it fetches is verified before it is returned; its problems are
    appended to `warnings` (the storage's), each remote failure once."""

    def __init__(self, backend, *, timeout: float = DEFAULT_TIMEOUT, read_only: bool = False,
                 budget: float = DEFAULT_BUDGET, signing_key: bytes | None = None, secrets=(),
                 warnings: list | None = None):
        self.backend, self.timeout, self.read_only = backend, timeout, read_only
        self.budget, self.signing_key, self.secrets = budget, signing_key, tuple(secrets)
        self.warnings = [] if warnings is None else warnings
        self.name = backend.name
        self.down = False  # set by the first failure: the remote is not asked again
        self.spent = 0.0  # seconds waited on the remote so far
        self._absent: set[str] = set()  # keys it lacked: a second lookup costs no round trip
        self._counts = dict.fromkeys(("hits", "misses", "rejected", "errors",
                                      "bytes_fetched", "bytes_pushed"), 0)

    def fetch(self, key: str, expect: dict | None, check) -> tuple[dict, dict] | None:
        """(manifest, blobs: name -> bytes) of the remote's entry for `key`, verified: bound
        to `expect`, signed when a key is set, every blob its hash, and `check(manifest,
        blobs)` (the local store's `artifacts_problem`) finding nothing; else None."""
        if self.down or key in self._absent:
            return None
        raw = self._bytes(self._call("read", self.backend.get, ENTRY, key, MAX_JSON_BYTES))
        manifest = None if raw is _FAILED or not raw else self._manifest(key, raw, expect)
        blobs = self._verified_blobs(key, manifest, check) if manifest is not None else None
        if blobs is None:
            if not self.down:
                self._absent.add(key)
                self._counts["misses"] += 1
            return None
        self._counts["hits"] += 1
        self._counts["bytes_fetched"] += len(raw) + sum(map(len, blobs.values()))
        return manifest, blobs

    def _manifest(self, key: str, raw: bytes, expect) -> dict | None:
        try:
            manifest = parse_manifest(key, raw.decode("utf-8"), expect)
            problem = signature_problem(manifest, self.signing_key)
        except UnicodeDecodeError:
            problem = "not UTF-8 text"
        except EntryProblem as exc:
            problem = str(exc)
        if problem:
            self._reject(f"entry {key} is invalid ({problem})")
            return None
        return manifest

    def _verified_blobs(self, key: str, manifest: dict, check) -> dict | None:
        sizes = manifest.get("sizes", {})
        wanted = {name: sizes.get(kind, MAX_BLOB) for kind, name in manifest["artifacts"].items()}
        names = sorted(wanted)
        found = self._call("read", self.backend.get_blobs, names,
                           [min(wanted[n], MAX_BLOB) for n in names])
        if not isinstance(found, dict) or \
                _FAILED in (self._bytes(found.get(n)) for n in names):
            found = _FAILED
        if found is _FAILED or any(not found.get(name) for name in names):
            return None  # evicted behind its manifest: a plain miss
        for name in names:
            if digest(found[name]) != name:
                self._reject(f"blob {name} of entry {key} "
                                    f"({str(manifest.get('target'))[:80]}) does not match its hash")
                return None
        problem = check(manifest, found)
        if problem:
            self._reject(f"entry {key} ({str(manifest.get('target'))[:80]}) {problem}")
            return None
        return {name: found[name] for name in names}

    def _bytes(self, value):
        """`value` when it is what a backend's read may give (bytes or None), else _FAILED
        after the one warning: a plugin that returns text is a broken remote."""
        if value is _FAILED or value is None or isinstance(value, bytes):
            return value
        self._give_up("read", f"answered a read with a {type(value).__name__}, "
                                     "not bytes")
        return _FAILED

    @property
    def writable(self) -> bool:
        """Whether a push is sent: the remote is not read-only and has not failed."""
        return not (self.down or self.read_only)

    def push(self, key: str, text: str, blobs: dict) -> bool:
        """Send a committed entry (signed when a key is set): its `blobs` (name -> bytes,
        every one its manifest names, read back verified), then its manifest; whether it
        was sent."""
        if not self.writable:
            return False
        manifest = json.loads(text)
        data = json.dumps(sign(manifest, self.signing_key), sort_keys=True, indent=1).encode()
        if self._call("write", self.backend.put_entry, key, data, blobs) is _FAILED:
            return False
        self._absent.discard(key)
        self._counts["bytes_pushed"] += len(data) + sum(map(len, blobs.values()))
        return True

    def take_counts(self) -> dict:
        """This process's counts since the last call (one build's), as `remote_*` fields."""
        counts = {f"remote_{name}": value for name, value in self._counts.items()}
        self._counts = dict.fromkeys(self._counts, 0)
        return counts

    def _reject(self, problem: str) -> None:
        self._counts["rejected"] += 1
        self.warnings.append(scrub(f"remote {self.name}: {problem}; ignored, building it here",
                                    self.secrets))

    def _call(self, what: str, fn, *args):
        """fn(*args) in a thread joined for at most `timeout` (and what is left of the
        build's budget); _FAILED (and one warning) on failure.

        A thread and not only socket timeouts: fsspec backends have no common timeout
        setting, and a hung call must not hold the build. The thread is a daemon, so one
        left behind never delays the exit, and the backends read in chunks against the
        same deadline, so one left behind stops reading when its time is up.
        """
        if self.down:
            return _FAILED
        wait = min(self.timeout, self.budget - self.spent)
        box = {}
        deadline = time.monotonic() + wait

        def run():
            try:
                box["value"] = fn(*args, deadline=deadline)
            except BaseException as exc:  # noqa: BLE001 - reported below, in the caller's thread
                box["error"] = exc

        started = time.monotonic()
        thread = threading.Thread(target=run, name="kbuild-remote", daemon=True)
        thread.start()
        thread.join(max(wait, 0.0))
        self.spent += time.monotonic() - started
        if "value" in box:
            if self.spent >= self.budget:
                self._give_up(what, f"used up this build's budget of {self.budget:g}s")
            return box["value"]
        if isinstance(box.get("error"), Tampered):  # one bad object, not a bad remote
            self._reject(_first_line(box["error"]))
            return _FAILED
        # A reader that stopped at the deadline itself is a timeout too, not a failure.
        late = thread.is_alive() or isinstance(box.get("error"), TimeoutError)
        if late and wait < self.timeout:
            problem = f"used up this build's budget of {self.budget:g}s"
        elif late:
            problem = f"did not answer within {self.timeout:g}s"
        else:
            problem = f"failed: {type(box['error']).__name__}: {_first_line(box['error'])}"
        self._give_up(what, problem)
        return _FAILED

    def _give_up(self, what: str, problem: str) -> None:
        self.down = True
        self._counts["errors"] += 1
        self.warnings.append(scrub(f"remote {self.name} {problem} (on {what}); "
                                    "building with the local store only", self.secrets))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "no message"
