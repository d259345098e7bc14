"""Edits recovered in parallel: the kernels a program launched last time, rebuilt in the
background when their inputs changed.

After an edit that K kernels' code depends on, numba's JIT (and a zero-config process
serving one launch at a time) compiles those K kernels one by one, each when the program
first launches it. kbuild knows more: the program journal (`journal`) lists every
(kernel, signature, arch) the program's last run served, and a project file may declare
them. An edit of a device function's body leaves its callers' objects as they were: the
program relinks each caller from stored objects as it launches it, faster than another
process starts. So the helper starts at the *second* launch-time compile (not relink)
of a kernel the journal or the project file names (a cold store, an edit of a kernel, of
an inlined device function or of a signature: compiles, which workers do in parallel),
once that compile is done: one process (`python -m kbuild.zeroconf.background`), which
does for the other named targets what `kbuild build` does: it imports their modules,
keys each one (its key is the one a launch computes: the target is named, spelled and
keyed as zero-config names, spells and keys it), takes what the store holds, and has the
build service compile or relink the rest in `-j` worker processes (in two waves: the
targets that make missing device function objects first, then relinks from stored
objects), committing each as it is done.

Only the targets named (launched last time with those types, or declared) are ever
built, and only through the build service, under each key's lock. The program does not
wait for the helper: its launches go on in their order, each compiling (relinking, when
the changed device function's object is stored) what the helper does not hold, while
the helper works from the other end of the list, a batch of `-j` targets at a time, so
that the two meet in the middle. A launch of a kernel in the helper's batch waits on that
key's lock alone and takes the entry (the helper lets go of each key as it commits it);
a key the program holds or has committed is not compiled again by the helper, which
takes each lock without waiting and looks the entry up again under it. A background
entry is served only after the launch's own full key check: a target the program now
launches with other types, or whose globals the program changes before launching, is
only a wasted compile, never a wrong binary.

The helper is bounded (at most `MAX_TARGETS` targets, `-j` workers: the cores but the
one the program compiles on, or the number KBUILD_BACKGROUND gives) and dies with the
program: it asks the kernel to kill it when the program ends however it ends
(PR_SET_PDEATHSIG, as `kbuild build`'s workers do), the program kills it at exit (never
waits for it) and its workers die with it. What it committed is complete (manifest
last); what it had not is simply not there.

Unset, it is on from 4 cores (on 2 it measured slower than compiling in the program);
`KBUILD_BACKGROUND=0` (or `kbuild.enable(background=False)`) turns it off, `=1` on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

MAX_TARGETS = 1024
AUTO_CORES = 4  # unset, the helper is on from this many cores


def setting(wanted=None) -> int:
    """Background workers wanted: 0 (off), else their number (`wanted`: `enable()`'s
    `background`, True/False/a number; None: KBUILD_BACKGROUND). On (True): one per core
    but the one the program compiles on, at least one. Unset: on from `AUTO_CORES` cores;
    below, off: on 2 cores the helper's start (an interpreter, numba, keying the program)
    competes with the program and measured slower than compiling in it."""
    from ..builder import default_jobs

    cores = default_jobs()
    if wanted is None:
        text = os.environ.get("KBUILD_BACKGROUND", "").strip().lower()
        if text in ("0", "false", "no", "off"):
            return 0
        wanted = int(text) if text.isdigit() else \
            (True if text or cores >= AUTO_CORES else False)
    if wanted is False:
        return 0
    return max(1, cores - 1) if wanted is True else max(0, min(int(wanted), cores))


def targets(journal, declared: dict, arch: str, skip: str) -> list:
    """[(name, signature text, arch)] the program launches: what its last run served (the
    journal's), then what the project file declares for the device's `arch`;
    `skip` (the target id being compiled now), kernels no module keeps (a closure made in
    a function) and the script's own (`__main__`) left out."""
    from .journal import target_id, target_parts
    from .naming import importable_module

    found = {}
    for tid in journal.last_run() if journal is not None else ():
        parts = target_parts(tid)
        if parts is not None:
            found.setdefault(tid, parts)
    for spec in declared.values():
        for text in spec.signatures:
            found.setdefault(target_id(spec.name, text, arch), (spec.name, text, arch))
    found.pop(skip, None)
    return [t for t in found.values()
            if importable_module(t[0].partition(":")[0]) and "<locals>" not in t[0]
            and ":" in t[0]][:MAX_TARGETS]


class Starter:
    """When a serving process starts its helper (see the module's docstring): after the
    second compile (not a relink) of a kernel the program launched last time (the journal
    names it) or the project file declares, once per process. Not after the first: an
    edit of a device function's body leaves its callers' objects as they were, and the
    program relinks them faster than a helper starts; a second compile says the kernels
    need compiling (a cold store, a changed kernel or signature), which workers do in
    parallel."""

    def __init__(self, wanted=None):
        self.jobs = setting(wanted)
        self.background = None  # the helper, once started (`Background`)
        self._compiling = False  # the kernel being served was compiled (not relinked)
        self._named_compiles = 0  # compiles of kernels the helper would build too

    def compiling(self) -> None:
        """The kernel being served is compiled in this process, not relinked."""
        self._compiling = True

    def built(self, settings, journal, declared: dict, name: str, text: str, arch: str,
              warn) -> None:
        """The kernel `name` `text` for `arch` was built (relinked or compiled): start the
        helper if this was the second named compile; `warn` says why it cannot start."""
        from .journal import target_id

        compiled, self._compiling = self._compiling, False
        if self.jobs < 1 or self.background is not None or not compiled:
            return
        tid = target_id(name, text, arch)
        known = journal is not None and tid in journal.last_run()
        if not known and name not in declared:
            return
        self._named_compiles += 1
        if self._named_compiles < 2:
            return
        try:
            wanted = targets(journal, declared, arch, tid)
            self.background = Background.start(settings, wanted, self.jobs)
        except Exception as exc:  # noqa: BLE001 - the program compiles as it goes
            warn(f"kbuild: no background build ({type(exc).__name__}: {exc})")
        self.jobs = self.jobs if self.background else 0


class Background:
    """The helper process building this program's targets (see the module's docstring)."""

    def __init__(self, process, output, ready_fd: int, wanted):
        self.process, self._output = process, output
        self._ready = ready_fd  # read end: the helper writes when it starts building
        self.targets = list(wanted)  # (name, text, arch) asked for
        self._report = None

    @staticmethod
    def start(settings, wanted_targets, jobs: int) -> "Background | None":
        """Start the helper for `wanted_targets` with `jobs` workers; None when there is
        nothing to build or it cannot start (the program compiles as it goes)."""
        import atexit

        if not wanted_targets or jobs < 1:
            return None
        spec = {"parent": os.getpid(), "jobs": jobs, "sys_path": [p for p in sys.path if p],
                "store": str(settings.store), "root": str(settings.root),
                "name": settings.name, "roots": [str(r) for r in settings.roots],
                "archs": list(settings.archs), "targets": [list(t) for t in wanted_targets]}
        env = {k: v for k, v in os.environ.items() if k != "KBUILD_ENABLE"}
        env["KBUILD_BACKGROUND"] = "0"
        env["PYTHONPATH"] = os.pathsep.join(spec["sys_path"])
        ready, spec["ready_fd"] = os.pipe()
        try:
            with tempfile.TemporaryFile("w+") as given:
                json.dump(spec, given)
                given.seek(0)
                output = tempfile.TemporaryFile("w+")
                process = subprocess.Popen(
                    [sys.executable, "-m", "kbuild.zeroconf.background"], stdin=given,
                    stdout=output, stderr=subprocess.STDOUT, env=env, close_fds=True,
                    pass_fds=(spec["ready_fd"],))
        except OSError:
            os.close(ready)
            return None
        finally:
            os.close(spec["ready_fd"])
        found = Background(process, output, ready, wanted_targets)
        atexit.register(found.stop)
        return found

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Wait until the helper has keyed its targets and starts building (or has
        died). A program never needs to: its launches go on meanwhile."""
        import select

        if self._ready is None:
            return
        try:
            select.select([self._ready], [], [], timeout)
        finally:
            os.close(self._ready)
            self._ready = None

    def wait(self, timeout: float | None = None) -> dict | None:
        """Wait for the helper to finish (for tests and benchmarks: a program never needs
        to); its report: {"built": [...], "cached": [...], "failed": [...], ...}."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.report()

    def report(self) -> dict | None:
        """What the helper said, once it is done (None while it runs, or if it died)."""
        if self._report is None and self.process.poll() is not None:
            self._output.seek(0)
            text = self._output.read()
            for line in text.splitlines():
                if line.startswith("KBUILD-BACKGROUND "):
                    self._report = json.loads(line.partition(" ")[2])
            if self._report is None:
                self._report = {"error": text[-4000:], "returncode": self.process.returncode}
        return self._report

    def stop(self) -> None:
        """At exit: kill the helper if it still runs (its workers die with it); never wait
        for its compiles."""
        if self.process.poll() is None:
            try:
                self.process.kill()
                self.process.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass


# -- the helper process ---------------------------------------------------------------


def build(spec: dict) -> dict:
    """In the helper: key `spec`'s targets, compile what the store lacks, commit each."""
    from pathlib import Path

    from ..builder import Workers, plan
    from ..builder.service import BuildService
    from ..config import DEFAULT_ARCHS, KernelSpec, ProjectConfig
    from ..store.storage import open_storage

    wanted = [tuple(t) for t in spec["targets"]]
    names: dict = {}
    for name, text, arch in wanted:
        signatures, archs = names.setdefault(name, ({}, {}))
        signatures[text], archs[arch] = None, None
    archs = tuple(spec["archs"]) or DEFAULT_ARCHS
    config = ProjectConfig(
        path=Path(spec["root"]) / "kbuild.toml", name=spec["name"],
        paths=tuple(Path(p) for p in spec["roots"]), archs=archs,
        store=Path(spec["store"]), remote_timeout=None,
        kernels=tuple(KernelSpec(n, tuple(s), tuple(a)) for n, (s, a) in names.items()))
    the_plan = plan(config)
    keep = set(wanted)
    the_plan.targets = [t for t in the_plan.targets if (t.name, t.signature, t.arch) in keep]
    store = open_storage(config.store)
    report = {"built": [], "cached": [], "failed": [], "busy": [],
              "unkeyed": sorted(f"{t.name} {t.signature}" for t in the_plan.failed)}
    store.check_root()
    with store.shared():
        service = BuildService(the_plan, store)
        todo = [t for t in the_plan.targets if service.fresh(t) is None]
        report["cached"] = [t.label for t in the_plan.targets if t not in todo]
        if todo:
            store.ensure_writable()
        _compile(service, todo, Workers(spec["jobs"]), report,
                 lambda: _say_ready(spec["ready_fd"]))
    return report


def _compile(service, todo, workers, report, ready) -> None:
    """Compile `todo` through the build service from its end, `workers.jobs` targets at a
    time: the program launches from its start, relinking or compiling what it meets, so
    the two meet in the middle. Each batch's keys are taken without waiting (one the
    program holds is the program's), looked up again under the lock, and let go of as
    each entry is committed (a launch waiting for it goes on)."""
    ready()
    pending = list(reversed(todo))
    while pending:
        batch, pending = pending[:workers.jobs], pending[workers.jobs:]
        rows: dict = {}
        with service.locks(batch) as locks:
            mine = locks.take_mine(rows)
            report["cached"] += [t.label for t in rows]
            report["busy"] += [t.label for t in batch if t not in locks.mine]
            for target, outcome, seconds in service.compile_all(mine, workers):
                service.finish(target, outcome, seconds)
                locks.release(target)
                report["failed" if isinstance(outcome, Exception) else "built"].append(
                    target.label)


_SAID: set = set()


def _say_ready(fd: int) -> None:
    """Tell the program the helper starts building (see `wait_ready`),
    once (the descriptor is closed: its number may be another file's afterwards); also
    said by the helper's exit, whatever it is (the pipe closes)."""
    if fd in _SAID:
        return
    _SAID.add(fd)
    try:
        os.write(fd, b"ready")
    except OSError:
        pass
    finally:
        os.close(fd)


def main() -> int:
    """`python -m kbuild.zeroconf.background`: the spec on stdin, the report on stdout."""
    spec = json.load(sys.stdin)
    from ..execute.parallel import die_with

    die_with(spec["parent"])
    sys.path[:0] = [p for p in spec["sys_path"] if p not in sys.path]
    report = build(spec)
    _say_ready(spec["ready_fd"])  # nothing to build: said now
    from ..store.statslog import record_build
    from ..store.storage import open_storage

    counts = {"built": len(report["built"]), "cached": len(report["cached"]),
              "failed": len(report["failed"])}
    if counts["built"] or counts["failed"]:
        record_build(open_storage(spec["store"]), counts, project=spec["name"] or None,
                     source="background")
    print("KBUILD-BACKGROUND " + json.dumps(report, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
