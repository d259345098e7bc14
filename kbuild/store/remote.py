"""The remote tier: a cache shared by machines, behind the local store.

Read-through: a key the local store lacks is asked of the remote, and a hit
fills the local store (blobs first, manifest last) before it is used.
Write-back: an entry a build commits is pushed. Backends are existing engines,
never a server of our own, each a module of `remotes/` behind one small
interface (`remotes.base.Remote`: get, put, remove):

    redis://[:password@]host:port/db[?prefix=kbuild:]   (rediss:// for TLS)
    s3://bucket/prefix[?endpoint_url=...&region=...], gs://..., file:///path (fsspec)
    http(s)://[user:password@]host[:port]/prefix   (Bazel's HTTP cache: /ac/, /cas/)
    module:Class or plugin://module:Class   (a project's own backend)

Nothing from a remote is trusted: a manifest is validated as the store
validates its own files and every blob is checked against its name. An entry
whose blob is gone (evicted) is a plain miss. A remote that fails, hangs or
refuses costs one warning and is not asked again in this process; every call
runs under a timeout, so a dead remote never fails nor stalls a build.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field

from ..keying.encode import digest
from ..errors import ConfigError
from .local import MAX_BLOB
from .manifest import MAX_JSON_BYTES, EntryProblem, is_object, parse_manifest
from .remotes import open_backend
from .remotes.base import ENTRY, Deadline, Tampered
from .remotes.urls import redact, scrub, url_secrets
from .signing import sign, signature_problem, signing_key

__all__ = ["RemoteSettings", "RemoteTier", "open_remote", "redact", "remote_settings",
           "remote_timeout", "parse_timeout", "push_entries", "scrub", "url_secrets", "Deadline"]

DEFAULT_TIMEOUT = 5.0
DEFAULT_BUDGET = 30.0  # seconds one build may spend waiting on the remote, all calls together
_FAILED = object()


@dataclass(frozen=True)
class RemoteSettings:
    """Which remote a command uses, and how: the outcome of CLI > env > kbuild.toml."""

    url: str
    where: str  # what named it, for error messages
    read_only: bool = False
    timeout: float = DEFAULT_TIMEOUT
    budget: float = DEFAULT_BUDGET
    signing_key: bytes | None = field(default=None, repr=False)
    paths: tuple = ()  # the project's import roots: where a `module:Class` remote is found


def remote_settings(config=None, *, url=None, no_remote=False, read_only=False, timeout=None,
                    env=None) -> RemoteSettings | None:
    """The remote named by `url` (--remote), else $KBUILD_REMOTE, else `[store] remote`.

    None when none is named or `no_remote`. Read-only comes from --remote-read-only
    or KBUILD_REMOTE_READ_ONLY=1, the timeout from `remote_timeout`.
    """
    env = os.environ if env is None else env
    chosen = _first((url, "--remote"), (env.get("KBUILD_REMOTE"), "KBUILD_REMOTE"),
                    (getattr(config, "remote", None), f"{_toml(config)} remote"))
    if no_remote or chosen is None:
        return None
    budget = env.get("KBUILD_REMOTE_BUDGET")
    return RemoteSettings(url=chosen[0], where=chosen[1],
                          read_only=read_only or env.get("KBUILD_REMOTE_READ_ONLY") == "1",
                          timeout=remote_timeout(config, timeout, env),
                          budget=parse_timeout(budget, "KBUILD_REMOTE_BUDGET") if budget
                          else DEFAULT_BUDGET,
                          signing_key=signing_key(config, env),
                          paths=tuple(str(p) for p in getattr(config, "paths", ()) or ()))


def remote_timeout(config=None, timeout=None, env=None) -> float:
    """Seconds per remote call: --remote-timeout, $KBUILD_REMOTE_TIMEOUT, `[store] remote_timeout`."""
    env = os.environ if env is None else env
    chosen = _first((timeout, "--remote-timeout"),
                    (env.get("KBUILD_REMOTE_TIMEOUT"), "KBUILD_REMOTE_TIMEOUT"),
                    (getattr(config, "remote_timeout", None), f"{_toml(config)} remote_timeout"))
    return DEFAULT_TIMEOUT if chosen is None else parse_timeout(*chosen)


def _first(*candidates):
    """The first (value, where) whose value is set: CLI, then environment, then kbuild.toml."""
    return next(((value, where) for value, where in candidates if value not in (None, "")), None)


def _toml(config) -> str:
    return f"{config.path}: [store]" if config is not None else "kbuild.toml [store]"


def parse_timeout(value, where: str) -> float:
    """A positive number of seconds, or ConfigError naming `where`."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if isinstance(value, bool) or not 0 < seconds < float("inf"):
        raise ConfigError(f"{where}: timeout must be a positive number of seconds, not {value!r}")
    return seconds


def open_remote(settings: RemoteSettings | None) -> RemoteTier | None:
    """The tier for `settings`; a URL no backend takes is a ConfigError (nothing is contacted)."""
    if settings is None:
        return None
    backend = open_backend(settings)
    return RemoteTier(backend, timeout=settings.timeout, read_only=settings.read_only,
                      budget=settings.budget, signing_key=settings.signing_key,
                      secrets=url_secrets(settings.url))


# -- the tier -----------------------------------------------------------------------------

class RemoteTier:
    """A backend, its timeout, this build's time budget and counts; what `Store.remote` holds."""

    def __init__(self, backend, *, timeout: float = DEFAULT_TIMEOUT, read_only: bool = False,
                 budget: float = DEFAULT_BUDGET, signing_key: bytes | None = None, secrets=()):
        self.backend, self.timeout, self.read_only = backend, timeout, read_only
        self.budget, self.signing_key, self.secrets = budget, signing_key, tuple(secrets)
        self.name = backend.name
        self.down = False  # set by the first failure: the remote is not asked again
        self.spent = 0.0  # seconds waited on the remote so far
        self._absent: set[str] = set()  # keys it lacked: a second lookup costs no round trip
        self._counts = dict.fromkeys(("hits", "misses", "rejected", "errors",
                                      "bytes_fetched", "bytes_pushed"), 0)

    def fetch(self, store, key: str, expect: dict | None = None) -> dict | None:
        """The remote's entry for `key`, verified (bound to `expect`, signed when a key is
        set, its artifacts its own) and committed to `store`; else None."""
        if self.down or key in self._absent:
            return None
        raw = self._bytes(store, self._call(store, "read", self.backend.get, ENTRY, key,
                                            MAX_JSON_BYTES))
        manifest = None if raw is _FAILED or not raw else self._manifest(store, key, raw, expect)
        blobs = self._verified_blobs(store, key, manifest) if manifest is not None else None
        if blobs is None:
            if not self.down:
                self._absent.add(key)
                self._counts["misses"] += 1
            return None
        store.ensure_writable()
        for data in blobs.values():
            store.put_blob(data)
        store.commit(key, {k: v for k, v in manifest.items() if k not in ("schema", "key")},
                     push=False)
        self._counts["hits"] += 1
        self._counts["bytes_fetched"] += len(raw) + sum(map(len, blobs.values()))
        return manifest

    def _manifest(self, store, key: str, raw: bytes, expect) -> dict | None:
        try:
            manifest = parse_manifest(key, raw.decode("utf-8"), expect)
            problem = signature_problem(manifest, self.signing_key)
        except UnicodeDecodeError:
            problem = "not UTF-8 text"
        except EntryProblem as exc:
            problem = str(exc)
        if problem:
            self._reject(store, f"entry {key} is invalid ({problem})")
            return None
        return manifest

    def _verified_blobs(self, store, key: str, manifest: dict) -> dict | None:
        sizes = manifest.get("sizes", {})
        wanted = {name: sizes.get(kind, MAX_BLOB) for kind, name in manifest["artifacts"].items()}
        names = sorted(wanted)
        found = self._call(store, "read", self.backend.get_blobs, names,
                           [min(wanted[n], MAX_BLOB) for n in names])
        if not isinstance(found, dict) or \
                _FAILED in (self._bytes(store, found.get(n)) for n in names):
            found = _FAILED
        if found is _FAILED or any(not found.get(name) for name in names):
            return None  # evicted behind its manifest: a plain miss
        for name in names:
            if digest(found[name]) != name:
                self._reject(store, f"blob {name} of entry {key} "
                                    f"({str(manifest.get('target'))[:80]}) does not match its hash")
                return None
        problem = store.artifacts_problem(manifest, found)
        if problem:
            self._reject(store, f"entry {key} ({str(manifest.get('target'))[:80]}) {problem}")
            return None
        return {name: found[name] for name in names}

    def _bytes(self, store, value):
        """`value` when it is what a backend's read may give (bytes or None), else _FAILED
        after the one warning: a plugin that returns text is a broken remote."""
        if value is _FAILED or value is None or isinstance(value, bytes):
            return value
        self._give_up(store, "read", f"answered a read with a {type(value).__name__}, "
                                     "not bytes")
        return _FAILED

    def push(self, store, key: str, text: str) -> bool:
        """Send a committed entry (signed when a key is set): its blobs (read back verified
        from `store`), then its manifest; whether it was sent."""
        if self.down or self.read_only:
            return False
        manifest = json.loads(text)
        names = sorted(set(manifest["artifacts"].values()))
        blobs = {name: store.read_blob(name) for name in names}
        data = json.dumps(sign(manifest, self.signing_key), sort_keys=True, indent=1).encode()
        if self._call(store, "write", self.backend.put_entry, key, data, blobs) is _FAILED:
            return False
        self._absent.discard(key)
        self._counts["bytes_pushed"] += len(data) + sum(map(len, blobs.values()))
        return True

    def take_counts(self) -> dict:
        """This process's counts since the last call (one build's), as `remote_*` fields."""
        counts = {f"remote_{name}": value for name, value in self._counts.items()}
        self._counts = dict.fromkeys(self._counts, 0)
        return counts

    def _reject(self, store, problem: str) -> None:
        self._counts["rejected"] += 1
        store.warnings.append(scrub(f"remote {self.name}: {problem}; ignored, building it here",
                                    self.secrets))

    def _call(self, store, what: str, fn, *args):
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
                self._give_up(store, what, f"used up this build's budget of {self.budget:g}s")
            return box["value"]
        if isinstance(box.get("error"), Tampered):  # one bad object, not a bad remote
            self._reject(store, _first_line(box["error"]))
            return _FAILED
        # A reader that stopped at the deadline itself is a timeout too, not a failure.
        late = thread.is_alive() or isinstance(box.get("error"), TimeoutError)
        if late and wait < self.timeout:
            problem = f"used up this build's budget of {self.budget:g}s"
        elif late:
            problem = f"did not answer within {self.timeout:g}s"
        else:
            problem = f"failed: {type(box['error']).__name__}: {_first_line(box['error'])}"
        self._give_up(store, what, problem)
        return _FAILED

    def _give_up(self, store, what: str, problem: str) -> None:
        self.down = True
        self._counts["errors"] += 1
        store.warnings.append(scrub(f"remote {self.name} {problem} (on {what}); "
                                    "building with the local store only", self.secrets))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "no message"


def push_entries(tier: RemoteTier, store, keys) -> dict:
    """Seed the remote with the entries `keys` of `store` and the objects they link from
    (ccache's --reshare): each as a build's write-back sends it, signed when a key is set.
    Counts of what was sent and of `keys` the store lacks; stops at the remote's first
    failure (`tier.down`)."""
    sent, missing, queue, seen = {"entries": 0, "objects": 0}, [], list(keys), set()
    while queue and not tier.down:
        key = queue.pop(0)
        if key in seen:
            continue
        seen.add(key)
        manifest = store.lookup(key, remote=False)
        if manifest is None:
            missing.append(key)
            continue
        if tier.push(store, key, store.entry_path(key).read_text()):
            sent["objects" if is_object(manifest) else "entries"] += 1
        queue += [k for k in (manifest.get("link") or {}).get("objects", ())
                  if isinstance(k, str)]
    counts = tier.take_counts()
    return dict(sent, missing=len(missing), missing_keys=missing, down=tier.down,
                bytes=counts["remote_bytes_pushed"])
