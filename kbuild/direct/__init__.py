"""Direct mode: a no-op `build`, `status` and `keys` answered from the journal, without
importing numba or the project's kernels and without keying anything.

As ccache's direct mode and ninja's stat checks: the last full keying left a journal in
the store (`store.journal`) of everything it read (`inputs`: module sources, files,
folders, environment variables, the interpreter and its import path) and of what came
of it: each target's key, and for a target that was up to date, the store files its
freshness rested on (its entry, the variant it used, their blobs) with their identities.
When nothing it names changed, those keys are the keys and those entries are fresh.
Anything else (a change, a file gone, a racy or future time stamp, a damaged journal, a
target the journal does not hold) and the command keys in full, as it always did, and
writes a new journal. `--full` (or `[build] direct = false`) skips the journal.

`Direct` is one command's use of it: `answer` tries the journal, `begin_full` starts
recording before a full run imports anything, `journal_build` / `journal_status`
write what the full run found. Why a command used which mode is `mode` and `reason`
(`kbuild status --check` prints it).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass

from ..config import ProjectConfig, load_config
from ..model import Target
from ..keying.encode import digest
from ..keying.launch import launch_json, launch_of
from ..sources import changed_since_import, imported_sources
from ..store import journal, tree
from ..store.failures import failure_relpath
from ..store.history import History, explained
from ..store.local import LAYOUT, Ledger, Store, is_target, store_root_problem
from ..targets import parse_archs, requested, select_specs
from .inputs import Check, Paths, Unjournalable, racy, refreshed, snapshot, start_state
from .recorder import ReadRecorder, watched_environment

FULL, DIRECT = "full", "direct"
# An entry a no-op finds is marked used (its mtime: gc evicts the least recently used
# first) when its mark is older than this; the journal takes its new identity.
TOUCH_AGE_NS = 24 * 3600 * 10**9
ENTRY_MAX_BYTES = 4 << 20


@dataclass(frozen=True)
class JournalAnswer:
    """A target as the journal answers for it."""

    target: Target
    key: str
    artifacts: dict  # the launchable blobs (ptx, cubin); {} when not known to be fresh
    built_at: str | None = None
    newest: dict | None = None  # status: a newer build of other inputs, as status shows it
    failed: str | None = None  # build: the recorded failure it reports (its error)
    where: str | None = None  # ... and the file:line the full run reported it at


class Direct:
    """One command's direct mode on `config`'s project and `store`. `enabled`: the journal
    may answer (not `--full`, not `[build] direct = false`); `may_write`: this command may
    write the journal (not `--read-only`)."""

    def __init__(self, config: ProjectConfig, store: Store, *, enabled: bool = True,
                 may_write: bool = True):
        self.config, self.store = config, store
        self.paths = Paths(str(config.root))
        self.slot = journal.slot(config.name, config.path.name)
        self.enabled = enabled and config.direct
        self.may_write = may_write and config.direct
        self.mode = FULL
        self.reason = "--full" if not enabled else \
            "[build] direct = false" if not config.direct else "not tried"
        self.recorder: ReadRecorder | None = None
        self.ledger = Ledger()
        self._state = None
        self._journal = None
        self._loaded = False  # the command's mode was decided from the journal
        self._read_once = None  # (journal or None, JournalProblem or None), read once
        self._hold = None
        self.journal_note: str | None = None  # what became of the journal (`describe`)
        self._failed: dict = {}  # tid -> the error a failed target's next build reports

    # -- answering from the journal ---------------------------------------------------------

    def answer(self, names, arch_text, need: str, hold=None) -> list[JournalAnswer] | None:
        """The rows of the targets `names` / `--arch arch_text` name, from the journal, or
        None (then `reason` says why). `need`: "keys" (keys only), "fresh" (a no-op
        build: every target up to date, its entry still the one journaled) or "status"
        (the same, and what a newer build of each was). `hold()`: a context held while
        the store's files are checked (a build holds the store shared: gc waits)."""
        if not self.enabled:
            return None
        targets = requested(select_specs(self.config, names),
                            parse_archs(arch_text, check_toolchain=False))
        self._hold = hold
        try:
            return self._answer(targets, need)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            self._fall_back(f"the journal is damaged ({type(exc).__name__})")
            self.store.warnings.append(f"journal {self._where()} is damaged; keying in full")
            return None

    def _answer(self, targets, need: str) -> list[JournalAnswer] | None:
        found = self._load()
        if found is None:
            return None
        body, now = found.body, time.time_ns()
        if body.get("unseen"):
            return self._fall_back(f"the last full run {body['unseen']} while importing the "
                                   "program, which the journal cannot check: keying in full")
        if found.mtime_ns > now + 2 * 10**9:
            return self._fall_back("the journal was written in the future (clock skew)")
        rows = []
        for target in targets:
            row = body["targets"].get(_tid(target))
            if row is None:
                return self._fall_back(f"{target.label} is not in the journal")
            if need != "keys" and not row["fresh"] and not (need == "fresh" and
                                                            row.get("failed")):
                return self._fall_back(f"{target.label} was not up to date")
            rows.append((target, row))
        check = Check(self.paths, found.mtime_ns).run(body["inputs"], self._start_state())
        if check.changed:
            return self._fall_back(check.changed)
        store_check = _StoreCheck(self.store, body["store"], found.mtime_ns, now)
        if need != "keys":
            with (self._hold or contextlib.nullcontext)():
                for target, row in rows:
                    problem = store_check.run(row["files"])
                    if problem:
                        return self._fall_back(f"{target.label}: {problem}")
        newest = self._newest(body, rows, store_check) if need == "status" else {}
        self.mode, self.reason = DIRECT, "nothing the journal names changed"
        self._refresh(found, check, store_check, newest)
        return [JournalAnswer(t, r["key"], r.get("artifacts") or {}, r.get("built_at"),
                              newest.get(_tid(t)), r.get("failed"), r.get("where"))
                for t, r in rows]

    def _newest(self, body: dict, rows, store_check) -> dict:
        """tid -> the newer build of other inputs (None: none) of each row, from the
        journal while the store's entry folders are as it saw them, else from a scan."""
        history = body.get("history") or {"dirs": {}, "newest": {}}
        known = history["newest"]
        if history["dirs"] and all(_tid(t) in known for t, _ in rows) and \
                store_check.same_dirs(history["dirs"]):
            return {_tid(t): known[_tid(t)] for t, _ in rows}
        dirs = entry_dirs(self.store)
        scanned = History(self.store)
        found = {}
        for target, row in rows:
            fresh = next((m for m in scanned.builds(target) if m.get("key") == row["entry"]),
                         None)
            newer = fresh is not None and scanned.newer_than(target, fresh)
            found[_tid(target)] = newer and {"key": newer.key, "built_at": newer.built_at,
                                             **explained(newer.reasons)} or None
        store_check.history = {"dirs": dirs, "newest": found}
        return found

    def _refresh(self, found, check, store_check, newest) -> None:
        """Write the journal again with what this check learnt: new identities of files
        whose bytes are unchanged, entries marked used, a status's newer builds."""
        if not (check.refreshed["files"] or check.refreshed["dirs"] or store_check.refreshed
                or store_check.history):
            return
        body = dict(found.body, inputs=refreshed(found.body["inputs"], check),
                    store={**found.body["store"], **store_check.refreshed})
        if store_check.history:
            old = (found.body.get("history") or {}).get("newest", {})
            body["history"] = dict(store_check.history,
                                   newest={**old, **store_check.history["newest"]})
        self._write(body)

    def _start_state(self) -> dict:
        if self._state is None:
            recorder = ReadRecorder()
            recorder.watched = watched_environment()
            self._state = start_state(recorder, self.paths)
        return self._state

    def _read(self):
        """(the journal or None, the problem reading it or None), read once per command."""
        if self._read_once is None:
            try:
                self._read_once = (journal.read(self.store.root, self.slot), None)
            except journal.JournalProblem as exc:
                self._read_once = (None, exc)
        return self._read_once

    def _load(self):
        if not self._loaded:
            self._loaded = True
            self._journal, problem = self._read()
            if problem is not None:
                self.store.warnings.append(f"journal {self._where()} is not used: {problem}; "
                                           "keying in full")
                self._fall_back(f"the journal cannot be used: {problem}")
                return None
        if self._journal is None:
            self._fall_back("no journal yet: the first run of a project keys in full")
        return self._journal

    def last_entry(self, target: Target) -> str | None:
        """The key of the entry `target` used at the last full run the journal records (read
        without deciding anything about this command's mode), or None: no journal, or it
        failed or was not in it. What a relinked row's changes are told against."""
        found = self._read()[0]
        body = found.body if found is not None else None
        try:
            row = (body or {}).get("targets", {}).get(_tid(target))
            return row.get("entry") if isinstance(row, dict) and row.get("fresh") else None
        except AttributeError:  # a journal of another shape: told against the store instead
            return None

    def _fall_back(self, reason: str):
        self.mode, self.reason = FULL, reason
        return None

    def fall_back(self, reason: str):
        """The command keys in full after all (`reason` says why); None."""
        return self._fall_back(reason)

    def _where(self) -> str:
        return str(self.store.root / journal.journal_relpath(self.slot))

    # -- recording a full run ---------------------------------------------------------------

    def begin_full(self) -> None:
        """Record what the full run reads, from now (before it imports numba or the
        project) until its journal is written."""
        self.recorder = ReadRecorder().start()
        self._state = start_state(self.recorder, self.paths)

    def attach(self, store: Store) -> Store:
        """The full run's store (opened again by the project), its ledger (what it verifies
        from now on) the one the journal is written from."""
        self.ledger = store.keep_ledger()
        return store

    def journal_build(self, rows) -> bool:
        """Write the journal of a full build: `rows`, (target, key, status, error, where)
        in plan order, every target cached or built, its entry looked up (so the ledger
        holds it: a built one after its commit), or failed with its failure recorded under
        its key (`error` and `where`: what a build reports of it, and the file:line it
        names). False when nothing was written."""
        entries, self._failed = [], {}
        for target, key, status, error, where in rows:
            if status == "failed" and error is not None:
                self._failed[_tid(target)] = (error, where)
                entries.append((target, key, False, False, None))
                continue
            if status not in ("cached", "built"):
                return self._not_journaled(f"{target.label} is {status}")
            entries.append((target, key, True, status == "built", None))
        return self._journal_run(entries, history=None)

    def journal_status(self, rows: list[dict], dirs: dict) -> bool:
        """Write the journal of a full `status`: its rows (dicts as `status --json`
        prints them), `dirs` the entry folders' identities when its history was read."""
        entries, newest = [], {}
        for row in rows:
            if row["key"] is None:
                return self._not_journaled(f"{row['target']} is {row['status']}")
            launch = row.get("launch")
            target = Target(row["target"], row["signature"], row["arch"],
                            None if launch is None else launch_of(launch))
            fresh = row["status"] == "up-to-date"
            entries.append((target, row["key"], fresh, False, row.get("built_at")))
            if fresh:
                newest[_tid(target)] = row.get("newest")
        return self._journal_run(entries, history={"dirs": dirs, "newest": newest})

    def _journal_run(self, entries, history) -> bool:
        recorder, self.recorder = self.recorder, None
        if recorder is None:
            return False
        recorder.stop()
        if not (self.may_write and recorder.clean):
            return self._not_journaled("not recorded from the start" if not recorder.clean
                                       else "the journal is not written by this command")
        if recorder.unseen:
            # What the run did that no journal can check again: the journal says so, and
            # every later run keys in full, naming it, until the program stops doing it.
            why = "; ".join(recorder.unseen)
            self._write({"project": self.config.name, "unseen": why, "inputs": {},
                         "targets": {}, "store": {}})
            self.journal_note = f"not vouching: the program {why} while it was imported"
            return False
        try:
            body = self._body(recorder, entries, history)
        except Unjournalable as exc:
            return self._not_journaled(str(exc))
        return self._write(body)

    def _body(self, recorder: ReadRecorder, entries, history) -> dict:
        changed = changed_since_import()
        if changed:
            raise Unjournalable(f"{changed[0]} changed while the run read it")
        if load_config(self.config.path, check_toolchain=False) != self.config:
            raise Unjournalable(f"{self.config.path} changed while the run read it")
        # Files whose bytes the run used are known exactly: project modules (as imported),
        # modules compiled from source, the project file, the files compiles observed.
        exact = {path: None for path in imported_sources()}
        exact.update(recorder.compiled)
        exact[str(self.config.path)] = None
        targets, store = {}, {}
        self._by_target = _entries_by_target(self.ledger)
        for target, key, fresh, built, built_at in entries:
            row = {"key": key, "fresh": False}
            if fresh:
                row = self._fresh_row(target, key, built, built_at, store, exact, recorder)
            elif _tid(target) in self._failed:
                row = self._failed_row(key, *self._failed[_tid(target)], store)
            targets[_tid(target)] = row
        previous = self._journal.body if self._journal is not None else None
        inputs = snapshot(recorder, self.paths, self._state, exact=exact,
                          skip=(os.path.realpath(self.store.root), str(self.store.root)),
                          previous=previous and previous.get("inputs"),
                          previous_mtime=self._journal.mtime_ns if previous else 0)
        body = {"project": self.config.name, "inputs": inputs, "targets": targets,
                "store": store}
        if history is not None:
            body["history"] = history
        return _merged(previous, body)

    def _fresh_row(self, target: Target, key: str, built: bool, built_at, store: dict,
                   exact: dict, recorder: ReadRecorder) -> dict:
        """The journal row of an up-to-date target: the entries its freshness rests on
        (its static key's, and the variant of another observation set it used, which
        `builder.fresh_entry` looks up only when the newest set no longer holds; a target
        built by this run uses its new entry) and their blobs."""
        mine = {k: self.ledger.entries[k] for k in self._by_target.get(_tid(target), ())}
        if key not in mine:
            raise Unjournalable(f"{target.label}: its entry was not looked up")
        variants = [k for k in mine if k != key]
        used = key if built or not variants else variants[0]
        if len(variants) > 1 and not built:
            raise Unjournalable(f"{target.label}: more than one variant was looked up")
        files = []
        for entry_key in sorted({key, used}):
            rel, ident, data_digest, manifest = mine[entry_key]
            store[rel] = ident + [data_digest]
            files.append(rel)
            for name in sorted(manifest["artifacts"].values()):
                blob = self.ledger.blobs.get(name)
                if blob is None:
                    raise Unjournalable(f"{target.label}: blob {name} was not verified")
                store[blob[0]] = blob[1] + [name]
                files.append(blob[0])
        exact.update(self._observed_inputs(mine[key][3], None if used == key else used,
                                           recorder))
        manifest = mine[used][3]
        return {"key": key, "fresh": True, "entry": used, "artifacts": _launchable(manifest),
                "built_at": built_at or manifest.get("built_at"), "files": sorted(set(files))}

    def _failed_row(self, key: str, error: str, where: str | None, store: dict) -> dict:
        """The journal row of a target whose compile failed, its failure recorded under its
        key: a no-op build reports it while the record is as it was (a build that compiles
        it again removes or rewrites it)."""
        rel = failure_relpath(key)
        try:
            data, info = tree.read_file(self.store.root, rel, 1 << 24)
        except OSError:
            raise Unjournalable(f"the failure record of {key} cannot be read") from None
        store[rel] = tree.identity(info) + [digest(data)]
        return {"key": key, "fresh": False, "failed": error, "where": where, "files": [rel]}

    def _observed_inputs(self, static: dict, variant: str | None, recorder: ReadRecorder) -> dict:
        """What the observation set a fresh target rests on names, as journal inputs:
        absolute path -> digest of the files it names (link files, headers, files read
        while compiling: the set matched its digests taken in this run, so they are the
        bytes it used); and, added to `recorder`'s inputs, the variables its compile read,
        the paths it stat'ed (absent ones must stay absent; a folder by its names) and the
        folders it listed. A compile that scanned the whole environment cannot be
        journaled (a variable set later is one more it read)."""
        from ..keying import observed as obs  # a full run: numba is loaded

        try:
            record = obs.from_json(self.store.read_record(static["artifacts"]["observed"]))
        except Exception:  # noqa: BLE001 - the lookup verified it; a race is no journal
            raise Unjournalable("an observation record could not be read again") from None
        chosen = next((s for s in (record.sets if record else ())
                       if (variant is None and s is record.sets[0]) or s.key == variant), None)
        if chosen is None:
            raise Unjournalable("the observation set a target used was not found")
        files = {}
        for o in chosen.observations:
            path = os.path.normpath(os.path.join(self.paths.root, o.name))
            if o.kind in (obs.Kind.FILE, obs.Kind.LINK, obs.Kind.HEADER):
                used = _bytes_used(path, o) if obs.by_source_form(o.kind, o.name) else o.digest
                if files.get(path) not in (None, used):
                    raise Unjournalable(f"{path} changed after the run read it")
                files[path] = used
            elif o.kind is obs.Kind.ENV:
                recorder.read_env(o.name, os.environ.get(o.name))
            elif o.kind is obs.Kind.ENVIRON:  # every variable, those set later too
                raise Unjournalable("a compile scanned the whole environment, which the "
                                    "journal cannot check")
            elif o.kind in (obs.Kind.STAT, obs.Kind.LISTING):
                if os.path.isdir(path):
                    recorder.listed[path] = "program"
                elif os.path.lexists(path):
                    files.setdefault(path, None)  # a file by its bytes
                else:
                    recorder.absent.add(path)
        return files

    def _not_journaled(self, why: str) -> bool:
        self.journal_note = f"not written: {why}"
        return False

    def describe(self) -> dict:
        """How this command keyed its targets, for `--json` and `status --check`:
        {"used": "direct" | "full", "reason": why, "journal": what became of it}."""
        out = {"used": self.mode, "reason": self.reason}
        if self.journal_note:
            out["journal"] = self.journal_note
        return out

    def _write(self, body: dict) -> bool:
        if not self.may_write:
            return self._not_journaled("this command does not write it")
        if not self.store.exists() or store_root_problem(self.store.root) is not None:
            return self._not_journaled("the store is not kbuild's to write")
        try:
            journal.write(self.store.root, self.slot, body)
        except OSError as exc:  # a store that cannot be written is only slower next time
            return self._not_journaled(f"the store cannot be written ({exc.strerror or exc})")
        self.journal_note = "written"
        return True



class _StoreCheck:
    """The store files of the journal's rows checked: present, with the identity the
    journal saw (else with the bytes it saw); entries not marked used for a day marked."""

    def __init__(self, store: Store, records: dict, reference_ns: int, now_ns: int):
        self.store, self.records = store, records
        self._root = f"{store.root}{os.sep}"
        self.reference_ns, self.now_ns = reference_ns, now_ns
        self.refreshed: dict = {}
        self.history: dict | None = None
        self._done: set = set()

    def run(self, files) -> str | None:
        for rel in files:
            if rel in self._done:
                continue
            problem = self._one(rel, self.records[rel])
            if problem:
                return problem
            self._done.add(rel)
        return None

    def _one(self, rel: str, record) -> str | None:
        what = _what(rel)
        try:
            info = os.lstat(self._root + rel)
        except OSError:
            return f"{what} is gone from the store"
        if tree.identity(info) != record[:5] or racy(record, self.reference_ns):
            try:
                data, info = tree.read_file(self.store.root, rel, ENTRY_MAX_BYTES
                                            if "/entries/" in f"/{rel}" else 1 << 30)
            except OSError:
                return f"{what} cannot be read"
            if digest(_own_bytes(rel, data)) != record[5]:
                return f"{what} changed"
            self.refreshed[rel] = tree.identity(info) + [record[5]]
        if rel.startswith(f"{LAYOUT}/entries/") and not self.store.read_only \
                and self.now_ns - info.st_mtime_ns > TOUCH_AGE_NS:
            try:
                tree.touch(self.store.root, rel)
                after = os.lstat(self._root + rel)
                if after.st_ino == info.st_ino:
                    self.refreshed[rel] = tree.identity(after) + [record[5]]
            except OSError:
                pass
        return None

    def same_dirs(self, dirs: dict) -> bool:
        for rel, record in dirs.items():
            try:
                info = os.lstat(self._root + rel)
            except OSError:
                return False
            if tree.identity(info) != record[:5] or racy(record, self.reference_ns):
                return False
        return True


def entry_dirs(store: Store) -> dict:
    """The identities of the store's entry folders: an entry added, replaced or removed
    changes one (a mark of use does not)."""
    rel = f"{LAYOUT}/entries"
    found = {}
    try:
        found[rel] = tree.identity(os.lstat(store.root / rel))
    except OSError:
        return {}
    for name, info in tree.listing(store.root, rel):
        if len(name) == 2:
            found[f"{rel}/{name}"] = tree.identity(info)
    return found


def _bytes_used(path: str, observed) -> str:
    """The digest of the bytes of a file that `observed` keys by its CUDA C source form,
    read now: they must have that form still (an edit of a comment's words since is
    what the compile read; the journal holds the bytes it finds)."""
    from ..keying import observed as obs

    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        raise Unjournalable(f"{path} changed after the run read it") from None
    if obs.file_digest(observed.kind, observed.name, data) != observed.digest:
        raise Unjournalable(f"{path} changed after the run read it")
    return digest(data)


def _what(rel: str) -> str:
    name = rel.rsplit("/", 1)[-1]
    return f"entry {name[:-5]}" if rel.startswith(f"{LAYOUT}/entries/") else f"blob {name}"


def _tid(target: Target) -> str:
    """A target's name in the journal (its launch configuration too, when it has one)."""
    return _ident(target.name, target.signature, target.arch, launch_json(target.launch))


def _own_bytes(rel: str, data: bytes) -> bytes:
    """A store file's bytes as its digest names them: a blob's unpacked (it is named by
    its uncompressed bytes, see store/blobformat.py), anything else as it is."""
    from ..store import blobformat

    if f"{LAYOUT}/blobs/" not in rel:
        return data
    try:
        return blobformat.decode(data, 1 << 30)
    except ValueError:
        return data  # not a blob this kbuild can unpack: its digest will not match


def _ident(name, signature, arch, launch) -> str:
    found = f"{name}\n{signature}\n{arch}"
    return found if launch is None else f"{found}\n{json.dumps(launch, sort_keys=True)}"


def _entries_by_target(ledger: Ledger) -> dict:
    """A target's journal name (`_tid`) -> the keys of its entries the ledger holds."""
    found: dict = {}
    for key, (_, _, _, manifest) in ledger.entries.items():
        if is_target(manifest):
            ident = _ident(manifest.get("target"), manifest.get("signature"),
                           manifest.get("arch"), manifest.get("launch"))
            found.setdefault(ident, []).append(key)
    return found


def _launchable(manifest: dict) -> dict:
    return {k: v for k, v in manifest.get("artifacts", {}).items() if k != "observed"}


def _merged(previous: dict | None, body: dict) -> dict:
    """`body`, keeping the rows of targets this run did not ask for from `previous` when
    both runs read the same inputs (a build of one target after a build of all)."""
    if not previous or not _same_inputs(previous.get("inputs"), body["inputs"]):
        return body
    targets = {**previous.get("targets", {}), **body["targets"]}
    store = dict(body["store"])
    for tid, row in targets.items():
        if tid not in body["targets"]:
            for rel in row.get("files", ()):
                store.setdefault(rel, previous["store"][rel])
    merged = dict(body, targets=targets, store=store)
    if "history" not in body and "history" in previous:
        merged.pop("history", None)  # a build changed the entries: scanned again
    return merged


def _same_inputs(old, new) -> bool:
    if not isinstance(old, dict) or set(old) != set(new):
        return False
    for name in new:
        if name not in ("files", "dirs") and old[name] != new[name]:
            return False
    files_old, files_new = old["files"], new["files"]
    if set(files_old) != set(files_new) or set(old["dirs"]) != set(new["dirs"]):
        return False
    same_file = all(files_old[p][5] == files_new[p][5] if files_new[p][5] is not None
                    else files_old[p][:5] == files_new[p][:5] for p in files_new)
    return same_file and all(old["dirs"][d][5:] == new["dirs"][d][5:] for d in new["dirs"])


__all__ = ["DIRECT", "FULL", "Direct", "JournalAnswer", "entry_dirs"]
