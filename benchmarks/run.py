"""kbuild's benchmark suite: kbuild against plain numba-cuda on synthetic projects.

    python benchmarks/run.py [--sizes 96,1024] [--repeats 3] [--cold-repeats N]
                             [--only NAMES] [--no-heavy] [--out FILE] [--kbuild-rev REV]

For each size N a project from gen_project.py (N kernels, one arch, sm_90) is
written to a temp dir, and every measurement runs in fresh subprocesses timed
from outside (interpreter start-up and imports included):

  cold              `kbuild build -j2` into an empty store  vs  seq_compile.py (one process)
  noop              `kbuild build` on the warm store (direct mode: the journal answers)
                                                          vs  `python -c "import numba.cuda"`
  noop_full         `kbuild build --full` on the warm store (every target keyed)
                                                          vs  `python -c "import numba.cuda"`
  edit_common       rebuild after editing `common`          vs  the cold kbuild build
  edit_kernel       rebuild after editing one kernel        vs  the cold kbuild build
  warm_start        warm_start.py on the warm store         vs  seq_compile.py
  warm_start_1plan  warm_start.py --one-plan                vs  seq_compile.py
  watch_edit_common `kbuild watch` on the warm store: from saving an edit of `common`
                    to the summary line of the round it starts (the watcher's
                    polling included)                        vs  the cold kbuild build

and once per run, on a project of 150 kernels in 30 modules that each import
scipy.optimize, scipy.special and scipy.constants (skipped, with a message, where
scipy is not installed):

  noop_heavy        `kbuild build` on the warm store        vs  `python -c "import numba.cuda;
                                                                 import <every kernel module>"`
  noop_heavy_full   the same with `--full`                  vs  the same imports

Each number is the median of its repeats. A measurement and its baseline run
alternately (A B A B ...), so a change in machine load hits both alike; the
1-minute load average at the start of each row and the CPU seconds and peak
resident memory of every run (user + system, workers included; the memory of the
process itself) are in the JSON to judge the noise. On a shared machine the CPU
seconds are the steadier figure: the table gives their ratio too.

HOME, XDG_CACHE_HOME, KBUILD_STORE and NUMBA_CACHE_DIR point into the temp dir,
so no user cache is read or written. The kbuild package is copied into the
temp dir when the run starts (from the working tree, or from a commit with
--kbuild-rev) and put first on PYTHONPATH: an edit to kbuild/ during a run
would otherwise change every key half-way through.

Prints one JSON object, then a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gen_project  # noqa: E402

JOBS = 2
N_DEVICE_FNS = 16

# The project for noop_heavy: about the size of a real one (29 kernel modules, 152 targets),
# its modules importing scipy-sized dependencies.
HEAVY_KERNELS, HEAVY_MODULES = 150, 30
HEAVY_IMPORTS = ("scipy.optimize", "scipy.special", "scipy.constants")

# (measurement, N, highest acceptable ratio, most seconds): the goals the table checks
# (issue 22's; a None is no goal of that kind).
TARGETS = [("noop", 1024, 0.5, None), ("noop_full", 1024, 2.0, None),
           ("noop_heavy", HEAVY_KERNELS, 0.5, None), ("noop_heavy_full", HEAVY_KERNELS, 1.3, None),
           ("noop", 96, 0.5, None), ("edit_common", 96, 0.35, None), ("cold", 96, 0.5, None),
           ("cold", 1024, None, 25.0)]
RSS_GOAL_MB = 300  # the peak resident memory of a no-op at N=1024

# kbuild watch: how long the benchmark waits after the watcher says it is watching before
# saving (a person's edit comes seconds after the last build, not at once; each save gets
# a different fraction of WATCH_SPREAD_S on top, so that saves fall at every point of the
# watcher's polling cycle rather than always at the same one), and how long any one round
# may take before the benchmark gives up on it.
WATCH_PAUSE_S, WATCH_SPREAD_S = 1.5, 0.5
WATCH_TIMEOUT_S = 600

BASELINES = {
    "cold": "sequential numba-cuda compile, one process",
    "noop": "python -c 'import numba.cuda'",
    "noop_full": "python -c 'import numba.cuda'",
    "edit_common": "cold kbuild build -j2",
    "edit_kernel": "cold kbuild build -j2",
    "warm_start": "sequential numba-cuda compile, one process",
    "warm_start_1plan": "sequential numba-cuda compile, one process",
    "watch_edit_common": "cold kbuild build -j2",
    "noop_heavy": "python -c 'import numba.cuda' + every kernel module",
    "noop_heavy_full": "python -c 'import numba.cuda' + every kernel module",
}


class BenchError(RuntimeError):
    """A subprocess failed or kbuild did something other than expected."""


@dataclass
class Timed:
    """One subprocess run."""

    wall: float  # seconds, measured from outside the process
    cpu: float  # user + system seconds of the process and the children it waited for
    data: object  # what it reported: kbuild's summary, a script's JSON, or stdout
    rss_mb: float | None = None  # the process's peak resident memory


@dataclass
class Sandbox:
    """One generated project in a temp dir, and how to run processes against it."""

    work: Path
    n: int
    kbuild_root: Path  # the directory holding the kbuild package under test

    @property
    def project(self) -> Path:
        return self.work / "project"

    def store(self, name: str) -> Path:
        return self.work / "stores" / name

    def env(self, store: Path) -> dict:
        home = self.work / "home"
        # Python's bytecode cache on, as a user has it: a shell (or a test harness) that
        # exports PYTHONDONTWRITEBYTECODE would make every run compile kbuild's own modules
        # (copied into the temp dir, so without a .pyc) from source.
        inherited = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        return dict(inherited, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
                    KBUILD_STORE=str(store), NUMBA_CACHE_DIR=str(home / "numba-cache"),
                    PYTHONPATH=str(self.kbuild_root))

    def run(self, argv, store: Path) -> Timed:
        """Run argv in the project dir, its stdout as data. Raise on a non-zero exit."""
        start = time.perf_counter()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(argv, cwd=self.project, env=self.env(store), stdout=out,
                                    stderr=err)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - start
            proc.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read().decode(), err.read().decode()
        if proc.returncode != 0:
            raise BenchError(f"{' '.join(map(str, argv))} exited {proc.returncode}:\n"
                             f"{(stdout + stderr)[-3000:]}")
        # wait4's usage: the process and the children it waited for (a build's workers);
        # ru_maxrss is the process's own peak, in KiB on Linux.
        return Timed(wall, usage.ru_utime + usage.ru_stime, stdout,
                     round(usage.ru_maxrss / 1024, 1))

    def kbuild(self, store: Path, *args) -> Timed:
        """`kbuild build --json ARGS` into `store`; its summary as data.

        The summary gains `compile_s`, the sum of the per-target seconds (time
        in compiles, across workers), to tell compiling from keying and start-up.
        """
        timed = self.run([sys.executable, "-m", "kbuild", "build", "--json",
                          "--store", str(store), *args], store)
        report = json.loads(timed.data)
        timed.data = dict(report["summary"],
                          compile_s=round(sum(t["seconds"] for t in report["targets"]), 4),
                          mode=(report.get("mode") or {}).get("used"))
        return timed

    def script(self, name: str, *args, store: Path) -> Timed:
        """Run benchmarks/NAME ARGS; the JSON line it prints last as data."""
        timed = self.run([sys.executable, str(HERE / name), *map(str, args)], store)
        timed.data = json.loads(timed.data.strip().splitlines()[-1])
        return timed


# -- measurements -------------------------------------------------------------

def expect(summary: dict, what: str, **counts) -> None:
    """Fail loudly when kbuild built or cached other than the scenario implies."""
    got = {k: summary.get(k) for k in counts}
    if got != counts:
        raise BenchError(f"{what}: expected {counts}, kbuild reported {summary}")


def alternate(repeats: int, first, second) -> tuple[list, list]:
    """Run first(r), second(r), first(r+1), ...: both see the same drift in machine load."""
    a, b = [], []
    for r in range(repeats):
        a.append(first(r))
        b.append(second(r))
    return a, b


def measure_cold(box: Sandbox, repeats: int):
    """Cold kbuild builds into fresh stores (the first one stays as the warm store)
    against the sequential compile."""
    def cold(r):
        timed = box.kbuild(box.store("warm" if r == 0 else f"cold{r}"), "-j", str(JOBS))
        expect(timed.data, "cold build", built=box.n, failed=0)
        return timed

    return alternate(repeats, cold,
                     lambda r: box.script("seq_compile.py", box.project, store=box.store("seq")))


def measure_noop(box: Sandbox, repeats: int, *flags):
    """No-op builds on the warm store (after one untimed, which settles the journal the
    cold build wrote) against importing numba.cuda. `flags`: `--full` keys every target."""
    warm = box.store("warm")
    box.kbuild(warm, *flags)

    def noop(r):
        timed = box.kbuild(warm, *flags)
        expect(timed.data, "no-op build", built=0, cached=box.n)
        if timed.data.get("mode") is not None:  # (a kbuild from before direct mode says none)
            expect(timed.data, "no-op build", mode="full" if flags else "direct")
        return timed

    return alternate(repeats, noop,
                     lambda r: box.run([sys.executable, "-c", "import numba.cuda"], warm))


def measure_edit(box: Sandbox, edit, repeats: int, expected_built: int, what: str) -> list:
    """Rebuild after `edit(project)` in a copy of the warm store; the source is restored."""
    runs = []
    for r in range(repeats):
        store = box.store(f"{what}{r}")
        shutil.copytree(box.store("warm"), store)
        path, original = edit(box.project)
        try:
            timed = box.kbuild(store, "-j", str(JOBS))
        finally:
            path.write_text(original)
        expect(timed.data, what, failed=0, built=expected_built)
        runs.append(timed)
    return runs


def measure_warm_start(box: Sandbox, repeats: int):
    """warm_start.py as launchers do it, and with one plan for all kernels."""
    def warm(*flags):
        def one(r):
            timed = box.script("warm_start.py", box.project, box.store("warm"), *flags,
                               store=box.store("warm"))
            if timed.data["kernels"] != box.n or timed.data["compiles"] != 0:
                raise BenchError(f"warm start {flags}: expected {box.n} kernels and "
                                 f"0 compiles, got {timed.data}")
            return timed
        return one

    return alternate(repeats, warm(), warm("--one-plan"))


def measure_watch(box: Sandbox, repeats: int) -> tuple[list, list]:
    """`kbuild watch` on copies of the warm store, one watcher per repeat, each timing two
    edits of `common`: the first save after start-up, and a second one in the same process.
    Each edit is a constant no earlier one used, so every round rebuilds all N targets."""
    first, second = [], []
    for r in range(repeats):
        store = box.store(f"watch{r}")
        shutil.copytree(box.store("warm"), store)
        a, b = watch_session(box, store, (2 * r + 1, 2 * r + 2))
        first.append(a)
        second.append(b)
    return first, second


_SUMMARY = re.compile(r"^(\d+) built, (\d+) cached, (\d+) failed(?:, (\d+) skipped)? "
                      r"in ([0-9.]+)s$")


def watch_session(box: Sandbox, store: Path, variants) -> list[Timed]:
    """Start `kbuild watch`, wait for its first build, then for each variant: save that edit
    of `common` and time it to the round's summary line. Timed.data says how the time
    splits: `detect_s` until the watcher printed `changed:` (its polling and settling),
    `build_s` the round's own seconds as it reports them."""
    argv = [sys.executable, "-m", "kbuild", "watch", "--store", str(store), "-j", str(JOBS),
            "-q", "--rounds", str(len(variants) + 1)]
    proc = subprocess.Popen(argv, cwd=box.project, env=box.env(store), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = _LineReader(proc)
    original, timed = None, []
    try:
        summary = _summary(lines.until(lambda ln: _SUMMARY.match(ln))[1])
        expect(summary, "watch: first build", built=0, cached=box.n, failed=0)
        for variant in variants:
            lines.until(lambda ln: ln.startswith("watching "))
            time.sleep(WATCH_PAUSE_S + (variant * 0.6180339887) % 1 * WATCH_SPREAD_S)
            cpu = _process_cpu(proc.pid)
            path, before = gen_project.edit_common(box.project, variant)
            saved = time.perf_counter()
            original = original or (path, before)
            seen, _ = lines.until(lambda ln: ln.startswith("changed: "))
            done, line = lines.until(lambda ln: _SUMMARY.match(ln))
            summary = _summary(line)
            expect(summary, f"watch: edit {variant} of common", built=box.n, cached=0, failed=0)
            timed.append(Timed(done - saved, _process_cpu(proc.pid) - cpu, dict(
                summary, detect_s=round(seen - saved, 4),
                latency_s=round(done - saved - summary["seconds"], 4))))
        if proc.wait(timeout=WATCH_TIMEOUT_S) != 0:
            raise BenchError(f"kbuild watch exited {proc.returncode}:\n{lines.text()}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if original is not None:
            original[0].write_text(original[1])
    return timed


def _summary(line: str) -> dict:
    built, cached, failed, skipped, seconds = _SUMMARY.match(line).groups()
    return {"built": int(built), "cached": int(cached), "failed": int(failed),
            "skipped": int(skipped or 0), "seconds": float(seconds)}


class _LineReader:
    """A process's output lines, each with the time it arrived (read on a thread, so a
    wait for a line can time out)."""

    def __init__(self, proc):
        self.proc, self.seen, self.lines = proc, [], queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put((time.perf_counter(), line.rstrip("\n")))
        self.lines.put((time.perf_counter(), None))

    def until(self, wanted, timeout: float = WATCH_TIMEOUT_S) -> tuple[float, str]:
        """(arrival time, line) of the next line `wanted` accepts; the lines before it are
        kept for the error message."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                at, line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise BenchError(f"kbuild watch: nothing expected within {timeout:.0f} s:\n"
                                 f"{self.text()}") from None
            if line is None:
                raise BenchError(f"kbuild watch ended early (exit {self.proc.wait()}):\n"
                                 f"{self.text()}")
            self.seen.append(line)
            if wanted(line):
                return at, line

    def text(self) -> str:
        return "\n".join(self.seen[-40:])


def _process_cpu(pid: int) -> float:
    """User + system seconds of a running process and of the children it has reaped
    (a build's workers, once it shut its pool down); 0.0 where /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def watch_settings(box: Sandbox) -> dict | None:
    """The poll interval and settle time of the kbuild under test (None: it has none)."""
    code = ("import json; from kbuild import watch\n"
            "print(json.dumps({'poll_s': getattr(watch, 'POLL_S', None), "
            "'settle_s': getattr(watch, 'SETTLE_S', None)}))")
    try:
        return json.loads(box.run([sys.executable, "-c", code], box.store("warm-up")).data)
    except (BenchError, ValueError):
        return None


def warm_up(box: Sandbox) -> None:
    """Import numba-cuda and every project module once, untimed, so that the first
    timed run finds the same warm file cache as the rest; check that kbuild is
    imported from the snapshot."""
    modules = sorted(p.stem for p in (box.project / gen_project.PACKAGE).glob("mod_*.py"))
    code = "import numba.cuda, kbuild\nprint(kbuild.__file__)\n" + "".join(
        f"import {gen_project.PACKAGE}.{m}\n" for m in modules)
    where = box.run([sys.executable, "-c", code], box.store("warm-up")).data.strip()
    if not Path(where).is_relative_to(box.kbuild_root):
        raise BenchError(f"subprocesses import kbuild from {where}, "
                         f"not the snapshot in {box.kbuild_root}")


def bench_size(box: Sandbox, repeats: int, cold_repeats: int, log, only=None) -> list[dict]:
    """Every measurement for one project size (or those in `only`; the cold builds always
    run: they make the warm store and are the baseline of the rebuilds); one result row
    per measurement."""
    n = box.n
    gen_project.generate(box.project, n, gen_project.default_modules(n), N_DEVICE_FNS)
    warm_up(box)
    rows = []

    def step(measurement, text):
        if only is not None and measurement not in only:
            return None
        log(f"N={n}: {text}")
        return os.getloadavg()[0]

    load = step("cold", f"cold builds ({cold_repeats}x kbuild -j{JOBS}, "
                        f"{cold_repeats}x sequential)") or os.getloadavg()[0]
    cold, seq = measure_cold(box, cold_repeats)
    rows.append(row("cold", n, load, cold, seq))
    if (load := step("noop", "no-op builds (direct mode)")) is not None:
        rows.append(row("noop", n, load, *measure_noop(box, repeats)))
    if (load := step("noop_full", "no-op builds with --full")) is not None:
        rows.append(row("noop_full", n, load, *measure_noop(box, repeats, "--full")))
    if (load := step("edit_common", "rebuild after editing common")) is not None:
        common = measure_edit(box, gen_project.edit_common, cold_repeats, n, "edit_common")
        rows.append(row("edit_common", n, load, common, cold))
    if (load := step("edit_kernel", "rebuild after editing one kernel")) is not None:
        one = measure_edit(box, lambda root: gen_project.edit_kernel(root, 0), repeats, 1,
                           "edit_kernel")
        rows.append(row("edit_kernel", n, load, one, cold))
    if (load := step("warm_start", "warm starts")) is not None:
        per_kernel, one_plan = measure_warm_start(box, repeats)
        rows.append(row("warm_start", n, load, per_kernel, seq))
        rows.append(row("warm_start_1plan", n, load, one_plan, seq))
    if (load := step("watch_edit_common",
                     f"kbuild watch ({repeats}x, two edits of common each)")) is not None:
        first, second = measure_watch(box, repeats)
        rows.append(dict(row("watch_edit_common", n, load, first, cold),
                         watch=watch_settings(box),
                         pause_before_save_s=[WATCH_PAUSE_S, WATCH_PAUSE_S + WATCH_SPREAD_S],
                         second_edit_s=round(statistics.median(t.wall for t in second), 4),
                         second_edit_runs=[_run_json(t) for t in second]))
    return rows


def heavy_skip_reason(box: Sandbox) -> str | None:
    """Why noop_heavy cannot run here (its dependencies do not import), or None."""
    done = subprocess.run([sys.executable, "-c", "import " + ", ".join(HEAVY_IMPORTS)],
                          env=box.env(box.store("warm-up")), capture_output=True, text=True)
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or ["it failed"])[-1]
    return f"{', '.join(HEAVY_IMPORTS)} do not import ({last}); pip install scipy to measure it"


def bench_heavy(box: Sandbox, repeats: int, log) -> list[dict]:
    """noop_heavy: a no-op build of a real-sized project whose modules import scipy, against
    importing numba.cuda and those modules."""
    gen_project.generate(box.project, box.n, HEAVY_MODULES, N_DEVICE_FNS, HEAVY_IMPORTS)
    warm_up(box)
    log(f"noop_heavy: cold build of {box.n} targets in {HEAVY_MODULES} modules (untimed)")
    expect(box.kbuild(box.store("warm"), "-j", str(JOBS)).data, "heavy cold build",
           built=box.n, failed=0)
    modules = sorted(p.stem for p in (box.project / gen_project.PACKAGE).glob("mod_*.py"))
    code = "import numba.cuda\n" + "".join(f"import {gen_project.PACKAGE}.{m}\n"
                                           for m in modules)
    warm = box.store("warm")
    rows = []
    for name, flags in (("noop_heavy", ()), ("noop_heavy_full", ("--full",))):
        load = os.getloadavg()[0]
        log(f"{name}: no-op builds{' with --full' if flags else ''}")
        box.kbuild(warm, *flags)  # settles the journal

        def noop(r, flags=flags):
            timed = box.kbuild(warm, *flags)
            expect(timed.data, "heavy no-op build", built=0, cached=box.n)
            return timed

        kbuild, imports = alternate(repeats, noop,
                                    lambda r: box.run([sys.executable, "-c", code], warm))
        rows.append(dict(row(name, box.n, load, kbuild, imports), modules=len(modules),
                         imports=list(HEAVY_IMPORTS)))
    return rows


def row(measurement: str, n: int, load: float, kbuild: list, baseline: list) -> dict:
    """One line of the report: medians, their ratio (of wall and of CPU seconds), the
    peak memory of kbuild's runs, and every run's numbers."""
    kb = statistics.median(t.wall for t in kbuild)
    base = statistics.median(t.wall for t in baseline)
    kb_cpu = statistics.median(t.cpu for t in kbuild)
    base_cpu = statistics.median(t.cpu for t in baseline)
    rss = [t.rss_mb for t in kbuild if t.rss_mb is not None]
    return {"measurement": measurement, "n": n, "kbuild_s": round(kb, 4),
            "baseline_s": round(base, 4), "ratio": round(kb / base, 4),
            "kbuild_cpu_s": round(kb_cpu, 4), "baseline_cpu_s": round(base_cpu, 4),
            "cpu_ratio": round(kb_cpu / base_cpu, 4) if base_cpu else None,
            "kbuild_peak_rss_mb": max(rss) if rss else None,
            "baseline": BASELINES[measurement], "load_1min": round(load, 2),
            "kbuild_runs": [_run_json(t) for t in kbuild],
            "baseline_runs": [_run_json(t) for t in baseline]}


def _run_json(timed: Timed) -> dict:
    out = {"wall_s": round(timed.wall, 4), "cpu_s": round(timed.cpu, 4)}
    if timed.rss_mb is not None:
        out["rss_mb"] = timed.rss_mb
    if isinstance(timed.data, dict):
        out["reported"] = timed.data
    return out


def snapshot_kbuild(dest: Path, rev: str | None) -> dict:
    """Copy the kbuild package to DEST/kbuild (working tree, or `git archive REV`)."""
    repo = HERE.parent
    if rev is None:
        shutil.copytree(repo / "kbuild", dest / "kbuild",
                        ignore=shutil.ignore_patterns("__pycache__"))
        dirty = bool(_git("status", "--porcelain", "--", "kbuild"))
        return {"source": "working tree", "commit": _git("rev-parse", "--short", "HEAD"),
                "kbuild_dirty": dirty}
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", rev, "kbuild"], cwd=repo,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return {"source": f"git {rev}", "commit": _git("rev-parse", "--short", rev),
            "kbuild_dirty": False}


def _git(*args) -> str | None:
    done = subprocess.run(["git", *args], cwd=HERE.parent, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


# -- report -------------------------------------------------------------------

def check_targets(rows: list[dict]) -> list[dict]:
    by_key = {(r["measurement"], r["n"]): r for r in rows}
    checks = []
    for measurement, n, limit, seconds in TARGETS:
        found = by_key.get((measurement, n))
        met = None
        if found is not None:
            met = (limit is None or found["ratio"] <= limit) and \
                (seconds is None or found["kbuild_s"] <= seconds)
        checks.append({"measurement": measurement, "n": n, "max_ratio": limit,
                       "max_seconds": seconds, "ratio": found and found["ratio"],
                       "seconds": found and found["kbuild_s"], "met": met})
    noop = by_key.get(("noop", 1024))
    if noop is not None and noop.get("kbuild_peak_rss_mb") is not None:
        checks.append({"measurement": "noop peak RSS", "n": 1024, "max_mb": RSS_GOAL_MB,
                       "mb": noop["kbuild_peak_rss_mb"],
                       "met": noop["kbuild_peak_rss_mb"] < RSS_GOAL_MB})
    return checks


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores": cores, "python": platform.python_version(),
            "platform": platform.platform(), "numba_cuda": _version("numba-cuda"),
            "numba": _version("numba")}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _goal(r: dict) -> str:
    for measurement, n, limit, seconds in TARGETS:
        if (measurement, n) != (r["measurement"], r["n"]):
            continue
        if limit is not None:
            return f"≤ {limit:g}× {'MET' if r['ratio'] <= limit else 'MISSED'}"
        return f"≤ {seconds:g} s {'MET' if r['kbuild_s'] <= seconds else 'MISSED'}"
    return ""


def markdown(report: dict) -> str:
    lines = ["| measurement | N | kbuild s | baseline s | ratio | CPU ratio | peak RSS MB "
             "| goal | load |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in report["results"]:
        cpu = f"{r['cpu_ratio']:.3f}×" if r.get("cpu_ratio") else ""
        rss = f"{r['kbuild_peak_rss_mb']:.0f}" if r.get("kbuild_peak_rss_mb") else ""
        lines.append(f"| {r['measurement']} | {r['n']} | {r['kbuild_s']:.3f} | "
                     f"{r['baseline_s']:.3f} | {r['ratio']:.3f}× | {cpu} | {rss} | {_goal(r)} | "
                     f"{r['load_1min']:.1f} |")
    for check in report["targets"]:
        if check["measurement"] == "noop peak RSS":
            lines.append(f"\nPeak RSS of a no-op at N=1024: {check['mb']:.0f} MB (goal < "
                         f"{check['max_mb']} MB: {'MET' if check['met'] else 'MISSED'}).")
    m, kb = report["machine"], report["kbuild"]
    dirty = " + uncommitted changes" if kb["kbuild_dirty"] else ""
    for r in report["results"]:
        if r["measurement"] == "watch_edit_common":
            detect = statistics.median(x["reported"]["detect_s"] for x in r["kbuild_runs"])
            poll = (r.get("watch") or {}).get("poll_s")
            cpu = statistics.median(x["cpu_s"] for x in r["kbuild_runs"])
            cold_cpu = statistics.median(x["cpu_s"] for x in r["baseline_runs"])
            lines.append(f"\nwatch_edit_common at N={r['n']}: median {detect:.3f} s of it from the "
                         f"save to the watcher's `changed:` line (polling every "
                         f"{poll if poll is not None else '?'} s); a second edit in the same "
                         f"process took {r['second_edit_s']:.3f} s. CPU seconds (workers "
                         f"included): {cpu:.2f} against the cold build's {cold_cpu:.2f} "
                         f"({cpu / cold_cpu:.3f}x).")
    for skipped in report.get("skipped", []):
        lines.append(f"\n{skipped['measurement']}: skipped, {skipped['reason']}.")
    lines += ["", "Baselines: " + "; ".join(f"{k}: {v}" for k, v in BASELINES.items()) + ".",
              "load: the 1-minute load average when the row started "
              f"({m['cores']} cores; above that, other processes shared the CPU).",
              f"kbuild: {kb['source']} at {kb['commit']}{dirty}. "
              f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, "
              f"numba-cuda {m['numba_cuda']}, numba {m['numba']}; "
              f"total {report['seconds_total']:.0f} s."]
    missing = [f"{c['measurement']}@N={c['n']}" for c in report["targets"]
               if c.get("met") is None]
    if missing:
        lines.append(f"Targets not measured (size not run): {', '.join(missing)}.")
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="96,1024", help="kernel counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=3,
                        help="repeats of the cheap measurements (median taken)")
    parser.add_argument("--cold-repeats", type=int, default=None,
                        help="repeats of cold builds and the shared-function edit "
                             "(default: --repeats for N <= 64, 1 above)")
    parser.add_argument("--only", metavar="NAMES",
                        help="run only these measurements, comma-separated (cold always "
                             "runs: the warm store and the rebuilds' baseline), e.g. "
                             "watch_edit_common,noop_heavy; warm_start includes warm_start_1plan")
    parser.add_argument("--no-heavy", action="store_true",
                        help="leave out noop_heavy (its project takes a cold build of "
                             f"{HEAVY_KERNELS} kernels to set up)")
    parser.add_argument("--out", help="also write the JSON object here")
    parser.add_argument("--kbuild-rev", metavar="REV",
                        help="benchmark kbuild/ as committed at REV (default: the working tree)")
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if args.only is not None:
        args.only = {name.strip() for name in args.only.split(",") if name.strip()}
        unknown = args.only - set(BASELINES)
        if unknown:
            parser.error(f"unknown measurement {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(BASELINES)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    rows = []

    def log(text):
        print(f"[{time.perf_counter() - start:6.1f}s] {text}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="kbuild-bench-") as tmp:
        kbuild_root = Path(tmp) / "kbuild-under-test"
        kbuild_info = snapshot_kbuild(kbuild_root, args.kbuild_rev)
        for n in args.sizes:
            cold_repeats = args.cold_repeats or (args.repeats if n <= 64 else 1)
            box = Sandbox(Path(tmp) / f"n{n}", n, kbuild_root)
            rows += bench_size(box, args.repeats, cold_repeats, log, args.only)
        skipped = []
        if not args.no_heavy and (args.only is None or "noop_heavy" in args.only):
            box = Sandbox(Path(tmp) / "heavy", HEAVY_KERNELS, kbuild_root)
            reason = heavy_skip_reason(box)
            if reason is None:
                rows += bench_heavy(box, args.repeats, log)
            else:
                log(f"noop_heavy: skipped, {reason}")
                skipped.append({"measurement": "noop_heavy", "reason": reason})
    report = {"machine": machine(), "kbuild": kbuild_info,
              "config": {"sizes": args.sizes, "repeats": args.repeats,
                         "only": sorted(args.only) if args.only else None,
                         "cold_repeats": args.cold_repeats, "jobs": JOBS,
                         "arch": gen_project.ARCH, "device_fns": N_DEVICE_FNS},
              "results": rows, "skipped": skipped, "targets": check_targets(rows),
              "seconds_total": round(time.perf_counter() - start, 1)}
    text = json.dumps(report, indent=1)
    print(text)
    print()
    print(markdown(report))
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
