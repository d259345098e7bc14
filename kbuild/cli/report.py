"""A build's rows for a person or a program: `BuildReport` (rows in a stable order, each
compile error once with its file:line, the summary line or one JSON object) and the
progress bar a terminal shows while targets compile. `build` and `watch` print through it.
"""

from __future__ import annotations

import os
import re
import shutil
import sys

from ..model import Cutoff, LinkMode, RowStatus
from .common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, error, print_json, store_warnings

_COLOURS = {RowStatus.BUILT: "32", RowStatus.CACHED: "2", RowStatus.FAILED: "1;31",
            RowStatus.SKIPPED: "33"}
_RANKS = {RowStatus.FAILED: 1, RowStatus.SKIPPED: 2}  # failed rows after the others, then skipped
_INDENT = " " * 9


class BuildReport:
    """The build's rows for a person or a program: the build's progress callback
    collects them (streamed as they finish on a terminal), `finish` prints the rest.

    Rows come out in one order every run: the plan's, failed rows after the others and
    skipped rows last, so a -j2 race between a failure and its neighbours changes no
    line's position. A kernel's repeated compile error is printed once.
    """

    def __init__(self, args, the_plan, store):
        self.args, self.the_plan, self.store = args, the_plan, store
        self.rows = []
        self.verbose, self.quiet = args.verbose, args.quiet
        terminal = not args.json and sys.stdout.isatty()
        self.stream = terminal
        self.colour = terminal and colour_wanted()
        self.bar = ProgressBar(the_plan.total) if not args.json and not args.quiet and \
            sys.stderr.isatty() else None
        # A pipe or a CI log gets a line every few seconds instead (stderr: --json's
        # stdout stays one object), so a long build is never silent.
        self.lines = ProgressLines(the_plan.total) if not args.quiet and \
            not sys.stderr.isatty() else None
        self.first_errors: dict = {}  # (kernel, error head) -> label of the row that showed it
        order = [*the_plan.targets, *the_plan.failed]
        self.order = {(t.name, t.signature, t.arch): i for i, t in enumerate(order)}
        self.mode = None  # {"used": "direct" | "full", "reason": ...}: how targets were keyed

    def __call__(self, row, done, total):
        self.rows.append(row)
        if self.stream:
            if self.bar:
                self.bar.clear()
            self._print_row(row)
        if self.bar:
            self.bar(row, done, total)
        if self.lines:
            self.lines(row, done, total)

    def started(self, target) -> None:
        """The build began compiling (or linking) `target`: the bar names what is in flight."""
        if self.bar:
            self.bar.started(target)
        if self.lines:
            self.lines.started(target)

    def finish(self, rows, seconds: float, interrupted: bool = False) -> int:
        """Print what is left to print and the summary; the build's exit code."""
        if self.bar:
            self.bar.clear()
        if self.lines:
            self.lines.stop()
        rows = sorted(rows, key=self._position)
        summary = {s.value: sum(r.status == s for r in rows) for s in RowStatus}
        summary["seconds"] = round(seconds, 3)
        checked = [r.verified for r in rows if r.verified in ("same", "differs")]
        if checked:  # --verify: how many served targets were rebuilt, how many differed
            summary["verified"] = len(checked)
            summary["differ"] = checked.count("differs")
        if interrupted:
            summary["interrupted"] = True
            error("interrupted")
        if self.args.json:
            print_json(self._answer(rows, summary, interrupted))
        else:
            if not self.stream:
                for row in rows:
                    self._print_row(row)
            print(self._summary_line(summary, len(self.order) - len(rows), interrupted))
            if self.verbose and self.mode:
                print(f"mode: {self.mode['used']} ({self.mode['reason']})")
        if interrupted:
            return EXIT_INTERRUPTED
        return EXIT_FAILED if summary[RowStatus.FAILED.value] else EXIT_OK

    def _answer(self, rows, summary: dict, interrupted: bool) -> dict:
        """The one JSON object of `build --json`."""
        answer = {"targets": [self._json_row(r) for r in rows], "summary": summary,
                  "store": str(self.store.root), "warnings": store_warnings(self.store)}
        if self.mode is not None:
            answer["mode"] = self.mode
        if interrupted:
            answer.update(error="interrupted", exit_code=EXIT_INTERRUPTED)
        return answer

    def _position(self, row):
        rank = _RANKS.get(row.status, 0)
        return rank, self.order.get((row.target, row.signature, row.arch), len(self.order))

    def _summary_line(self, summary, not_done: int, interrupted: bool) -> str:
        line = (f"{summary['built']} built, {summary['cached']} cached, "
                f"{summary['failed']} failed"
                + (f", {summary['skipped']} skipped" if summary["skipped"] else "")
                + f" in {summary['seconds']:.2f}s")
        if "verified" in summary:
            line += f"; verified {summary['verified']}, {summary['differ']} differ"
        if interrupted:
            line = f"interrupted: {line}; {not_done} not built"
        return line

    def _json_row(self, row) -> dict:
        out = row.as_json()
        if row.status == RowStatus.FAILED and row.key is not None:
            out["where"] = self._where(row)
        return out

    def _print_row(self, row) -> None:
        if self.quiet and row.status != RowStatus.FAILED:
            return
        if row.status == RowStatus.CACHED and getattr(self.args, "watching", False):
            return  # a watch prints what each save changed, not the whole project again
        line = f"{self._paint(row.status)} {row.target} {row.signature} {row.arch}"
        if row.launch is not None:
            line += f" (grid {row.launch['grid']} block {row.launch['block']})"
        if row.status == RowStatus.BUILT:
            line += f"  {row.seconds:.2f}s" + relinked(row) + unchanged(row)
        if row.verified == "same":
            line += "  verified"
        print(line, flush=self.stream)
        self._print_details(row)

    def _print_details(self, row) -> None:
        """The lines under a row: its key (-v), a whole-program fallback, its error."""
        if self.verbose and row.key:
            print(f"{_INDENT}key {row.key}")
        if row.note and row.status == RowStatus.BUILT and not self.args.whole_program:
            print(f"{_INDENT}linked as one program: {row.note}")
        if row.error and row.status == RowStatus.FAILED:
            print(_INDENT + self._error_text(row).replace("\n", "\n" + _INDENT),
                  flush=self.stream)

    def _error_text(self, row) -> str:
        """The row's error; a compile error with the kernel's file:line first, and only
        once per kernel: its other rows name the row that showed it (-v: every time)."""
        if row.key is None:  # an import failure: already one line with its file:line
            # One module's syntax error fails every target it declares: said once.
            cause = row.error.partition(": ")[2] if row.error.startswith("target '") \
                else row.error
            seen = self.first_errors.setdefault(("import", cause),
                                                f"{row.target} {row.signature} {row.arch}")
            if seen != f"{row.target} {row.signature} {row.arch}" and not self.verbose:
                return f"same error as {seen}"
            return row.error
        head = row.error.splitlines()[0]
        seen = self.first_errors.setdefault((row.target, head), f"{row.signature} {row.arch}")
        if seen != f"{row.signature} {row.arch}" and not self.verbose:
            return f"same error as {row.target} {seen}"
        return f"{self._where(row)}: {head if self.quiet else row.error}"

    def _where(self, row) -> str:
        return row.where or error_location(row.error, self.the_plan.kernels.get(row.target),
                                           self.the_plan.config.root)

    def _paint(self, status: str) -> str:
        text = f"{status:8}"
        code = _COLOURS.get(status)
        return f"\x1b[{code}m{text}\x1b[0m" if self.colour and code else text


def relinked(row) -> str:
    """'  relinked: only device function m:f changed' (the edit compilation was skipped for)."""
    if row.link != LinkMode.RELINK:
        return ""
    if not row.changed:
        return "  relinked"
    plural = "s" if len(row.changed) > 1 else ""
    return f"  relinked: only device function{plural} {', '.join(row.changed)} changed"


_CUTOFF = {Cutoff.LINK: "unchanged objects: an earlier link's PTX and cubin reused",
           Cutoff.CUBIN: "unchanged PTX: an earlier cubin reused"}


def unchanged(row) -> str:
    """'  (unchanged objects: an earlier link's PTX and cubin reused)': early cutoff."""
    return f"  ({_CUTOFF[row.cutoff]})" if row.cutoff else ""


class ProgressBar:
    """One self-rewriting line on stderr, shown only on a terminal: how many targets are
    done and what is compiling now (`[#####.....] 12/40  compiling saxpy sm_80, poly sm_90`)."""

    def __init__(self, total: int = 0):
        self.done, self.total = 0, total
        self.running: dict = {}  # (target, signature, arch) -> label, in the order started
        self.width = max(20, min(160, shutil.get_terminal_size((100, 24)).columns - 1))

    def __call__(self, row, done, total):
        self.done, self.total = done, total
        self.running.pop((row.target, row.signature, row.arch), None)
        self._draw(f"{row.status} {row.target[-40:]} {row.arch}")

    def started(self, target) -> None:
        label = f"{target.name.rpartition(':')[2]} {target.arch}"
        self.running[(target.name, target.signature, target.arch)] = label
        self._draw()

    def _draw(self, last: str = "") -> None:
        filled = 30 * self.done // max(self.total, 1)
        doing = list(dict.fromkeys(self.running.values()))  # one per kernel and arch
        what = f" compiling {', '.join(doing)}" if doing else last
        line = f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {what}"
        sys.stderr.write("\r" + line[:self.width].ljust(self.width))
        sys.stderr.flush()

    def clear(self):
        sys.stderr.write("\r" + " " * self.width + "\r")
        sys.stderr.flush()


class ProgressLines:
    """Progress for a pipe or a CI log, where a self-rewriting bar cannot be drawn and a
    silent job may be killed: on stderr, `kbuild: 12/40 done, 3 compiling (9 built, 3
    cached)` at most once every `interval` seconds as targets start and finish, and from
    a heartbeat while nothing finishes: a SIGALRM timer in the main thread, not a thread
    (build workers are forked only while no other Python thread runs, see
    `execute.parallel`). A build shorter than `interval` prints none.

    `interval` defaults to $KBUILD_PROGRESS_INTERVAL, else 5 s; 0 prints a line on every
    start and finish and needs no heartbeat. `clock` and `write` are the time source and
    the output (tests drive both: they count lines, never seconds)."""

    def __init__(self, total: int, interval: float | None = None, clock=None, write=None):
        import threading
        import time

        self.total, self.done, self.counts = total, 0, {}
        self.running: dict = {}
        self.interval = _progress_interval() if interval is None else interval
        self.clock = clock or time.monotonic
        self.write = write or _to_stderr
        self.last = self.clock()  # the build's start: the first line comes `interval` later
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.alarm = _Alarm(self.interval, self.beat) if self.interval > 0 and write is None \
            else None

    def __call__(self, row, done, total):
        with self.lock:
            self.done, self.total = done, total
            self.running.pop((row.target, row.signature, row.arch), None)
            self.counts[str(row.status)] = self.counts.get(str(row.status), 0) + 1
            self._maybe_say()

    def started(self, target) -> None:
        with self.lock:
            self.running[(target.name, target.signature, target.arch)] = True
            self._maybe_say()

    def beat(self) -> None:
        """What the heartbeat does each `interval`: a line when one is due (none when the
        signal came while a row was being counted: the next one says it)."""
        if self.lock.acquire(blocking=False):
            try:
                self._maybe_say()
            finally:
                self.lock.release()

    def stop(self) -> None:
        self.stopped.set()
        if self.alarm is not None:
            self.alarm.stop()

    def line(self) -> str:
        parts = ", ".join(f"{n} {status}" for status, n in sorted(self.counts.items()))
        return (f"kbuild: {self.done}/{self.total} done, {len(self.running)} compiling"
                + (f" ({parts})" if parts else ""))

    def _maybe_say(self) -> None:
        now = self.clock()
        if not self.stopped.is_set() and now - self.last >= self.interval:
            self.last = now
            self.write(self.line())



class _Alarm:
    """Calls `beat` every `interval` seconds from SIGALRM, in the main thread; nothing
    where that cannot be (another thread, no setitimer). System calls the signal meets are
    restarted (SA_RESTART); a forked worker inherits no timer."""

    def __init__(self, interval: float, beat):
        import signal
        import threading

        self.active = hasattr(signal, "setitimer") and \
            threading.current_thread() is threading.main_thread()
        if self.active:
            self.previous = signal.signal(signal.SIGALRM, lambda *_: beat())
            signal.siginterrupt(signal.SIGALRM, False)
            signal.setitimer(signal.ITIMER_REAL, interval, interval)

    def stop(self) -> None:
        import signal

        if self.active:
            self.active = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)


def _progress_interval() -> float:
    try:
        return max(0.0, float(os.environ.get("KBUILD_PROGRESS_INTERVAL", "") or 5.0))
    except ValueError:
        return 5.0


def _to_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


_FILE_LINE = re.compile(r'File "(?P<file>[^"]+\.py)", line (?P<line>\d+)'
                        r"|\bat (?P<file2>\S+\.py) \((?P<line2>\d+)\)")


def error_location(error: str, resolved, root) -> str:
    """file:line of a compile error: the first source position numba's message names,
    else where the kernel is defined (numba's typing errors often name none)."""
    found = _FILE_LINE.search(error or "")
    if found:
        path, line = found.group("file") or found.group("file2"), \
            found.group("line") or found.group("line2")
    else:
        backend = getattr(resolved, "backend", None)
        func = backend.python_function(resolved.kernel) if backend is not None else None
        code = getattr(func, "__code__", None)
        if code is None:
            return "?"
        path, line = code.co_filename, _def_line(code.co_filename, code.co_firstlineno)
    relative = os.path.relpath(path, root) if os.path.isabs(path) else path
    return f"{path if relative.startswith('..') else relative}:{line}"


def _def_line(path: str, first: int) -> int:
    """The `def` line of a function whose code starts at `first` (its first decorator)."""
    import linecache

    for number in range(first, first + 50):
        text = linecache.getline(path, number).lstrip()
        if text.startswith(("def ", "async def ")):
            return number
        if not text:
            break
    return first


def colour_wanted() -> bool:
    """Colour on a terminal only, and never when NO_COLOR is set (no-color.org) or
    TERM is dumb."""
    return not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
