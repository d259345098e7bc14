"""Direct mode: every kind of input the journal holds is noticed when it changes, and
nothing else stops the journal from answering.

One small project is built once for the module: a kernel in `pkg.mod` calling a device
function of the project (`pkg.dev`) and one of a package outside it (`vend.helpers`,
on PYTHONPATH), its module reading an environment variable, a file and a folder's
listing at import. Each case copies the project and the store (which hold the journal
of that build), changes one thing, and runs `kbuild status --json`: its `mode` says
whether the journal answered (`direct`) or every target was keyed (`full`, with the
first change found as the reason), and its rows must be what keying in full says.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import kbuild
from kbuild.direct.inputs import FINE_TICK_NS

from editmatrix_support import copy_tree, fresh_checkout
from support import run, shared_home

TOML = """[project]
name = "directproj"
paths = ["."]
arch = ["sm_80"]

[kernels."pkg.mod:k"]
signatures = ["void(float32[::1])"]
"""

MOD = '''import os
from pathlib import Path

from numba import cuda

from pkg.dev import inc
from vend.helpers import twice

HERE = Path(__file__).parent
SCALE = float(os.environ.get("KB_SCALE", "2.0"))
OFFSET = float((HERE / "offset.txt").read_text())
COUNT = len(os.listdir(HERE / "data"))


@cuda.jit
def k(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = inc(twice(x[i])) * SCALE + OFFSET + COUNT
'''

DEV = '''from numba import cuda


@cuda.jit(device=True)
def inc(x):
    return x + 1.0
'''

HELPERS = '''from numba import cuda


@cuda.jit(device=True)
def twice(x):
    return x * 2.0
'''

TARGET = ("pkg.mod:k", "void(float32[::1])", "sm_80")


def write(root: Path, files: dict) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@dataclass
class Run:
    """How one case runs kbuild: where, with what environment and arguments."""

    project: Path
    store: Path
    vendor: Path
    env: dict = field(default_factory=dict)
    args: list = field(default_factory=list)
    launcher: tuple = ("-m", "kbuild")
    cwd: Path | None = None

    def status(self, *extra):
        env = {"PYTHONPATH": str(self.vendor), "KB_SCALE": None, **self.env}
        return run("status", "--json", *self.args, *extra, "--store", self.store,
                   cwd=self.cwd or self.project, home=shared_home(), env=env,
                   launcher=self.launcher, bytecode=False)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """(project, store, vendor): the project built, and its status asked once (the
    journal then holds what status needs too)."""
    where = tmp_path_factory.mktemp("direct")
    vendor = where / "vendor"
    write(vendor, {"vend/__init__.py": "", "vend/helpers.py": HELPERS})
    project = where / "project"
    write(project, {"kbuild.toml": TOML, "pkg/__init__.py": "", "pkg/mod.py": MOD,
                    "pkg/dev.py": DEV, "pkg/offset.txt": "0.5\n", "pkg/data/a.txt": "a\n"})
    base = Run(project, where / "store", vendor)
    built = run("build", "--json", "--store", base.store, cwd=project, home=shared_home(),
                env={"PYTHONPATH": str(vendor), "KB_SCALE": None}, bytecode=False)
    assert built.returncode == 0, built.stderr
    assert [r["status"] for r in built.json["targets"]] == ["built"]
    # The build was too soon after the files were written for the journal to trust what
    # it read at import (offset.txt: "changed while the run read it"); a status writes it.
    first = base.status()
    assert first.returncode == 0, first.stderr
    again = base.status()
    assert again.json["mode"]["used"] == "direct", (first.json["mode"], again.json["mode"])
    return project, base.store, vendor


def checkout(baseline, where: Path) -> Run:
    """A copy of the project and its store at another path (same vendor package)."""
    project, store, vendor = baseline
    return Run(fresh_checkout(project, where, "project"), copy_tree(store, where / "store"),
               vendor)


def replace(rel: str, old: str, new: str, same_size: bool = False):
    def change(r: Run) -> None:
        path = r.project / rel
        text = path.read_text()
        assert text.count(old) == 1
        if same_size:
            assert len(old) == len(new)
        path.write_text(text.replace(old, new))
    return change


def touch(rel: str, seconds: float = 3600):
    def change(r: Run) -> None:
        path = r.project / rel
        info = path.stat()
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + int(seconds * 1e9)))
    return change


def edited_with_mtime_kept(r: Run) -> None:
    """An edit of the same size with the file's mtime put back: only the ctime (which no
    program can set) and the bytes tell."""
    path = r.project / "pkg/dev.py"
    info = path.stat()
    path.write_text(DEV.replace("x + 1.0", "x + 2.0"))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def private_vendor_edited(r: Run) -> None:
    """The package outside the project edited (its own copy: the journal of this checkout
    is written first, by a full status with that copy on PYTHONPATH)."""
    r.vendor = Path(shutil.copytree(r.vendor, r.project.parent / "vendor"))
    assert r.status().json["mode"]["used"] == "full"  # another PYTHONPATH: keyed, journaled
    assert r.status().json["mode"]["used"] == "direct"
    helpers = r.vendor / "vend" / "helpers.py"
    helpers.write_text(HELPERS.replace("x * 2.0", "x * 3.0"))


def setting(**env):
    def change(r: Run) -> None:
        r.env.update(env)
    return change


def args(*extra):
    def change(r: Run) -> None:
        r.args += list(extra)
    return change


def store_file(kind: str, damage):
    """Damage the target's entry file or one of its blobs (`kind`: entry, ptx, cubin)."""
    def change(r: Run) -> None:
        entries = list((r.store / "v1" / "entries").glob("*/*.json"))
        (entry,) = [p for p in entries if json.loads(p.read_text()).get("target") == TARGET[0]]
        if kind == "entry":
            damage(entry)
            return
        name = json.loads(entry.read_text())["artifacts"][kind]
        damage(r.store / "v1" / "blobs" / name[:2] / name[2:4] / name)
    return change


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))


def touched(path: Path) -> None:
    info = path.stat()
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 10**9))


def journal_file(r: Run) -> Path:
    (found,) = (r.store / "v1" / "journal").glob("*.json")
    return found


def journal_damaged(r: Run) -> None:
    flip_last_byte(journal_file(r))


def journal_of_another_version(r: Run) -> None:
    path = journal_file(r)
    head, _, body = path.read_bytes().partition(b"\n")
    header = json.loads(head)
    header["version"] = 99
    path.write_bytes(json.dumps(header).encode() + b"\n" + body)


def journal_from_the_future(r: Run) -> None:
    path = journal_file(r)
    later = path.stat().st_mtime_ns + 86400 * 10**9
    os.utime(path, ns=(later, later))


def python_optimized(r: Run) -> None:
    r.launcher = ("-O", "-m", "kbuild")


def from_a_subfolder(r: Run) -> None:
    r.cwd = r.project / "pkg"
    r.args += ["--config", str(r.project / "kbuild.toml")]


def shadowing_package(r: Run) -> None:
    """A folder `vend/` in the project root, which is first on the import path: it would
    shadow the package imported from PYTHONPATH."""
    shutil.copytree(r.vendor / "vend", r.project / "vend")


def numba_config_file(r: Run) -> None:
    (r.project / ".numba_config.yaml").write_text("")


def unrelated_files(r: Run) -> None:
    """What an editor leaves beside a module, and a file no import can name."""
    (r.project / "pkg" / ".dev.py.swp").write_text("swap")
    (r.project / "pkg" / "notes.md").write_text("notes")


def direct_off(r: Run) -> None:
    (r.project / "kbuild.toml").write_text(TOML + "\n[build]\ndirect = false\n")


def nothing(r: Run) -> None:
    pass


@dataclass(frozen=True)
class Case:
    id: str
    change: object
    mode: str  # "direct" or "full"
    reason: str = ""  # a substring of the mode's reason
    status: str = "up-to-date"  # what the target is after the change
    warning: str = ""  # a substring of a warning kbuild must print


CASES = [
    Case("nothing-changed", nothing, "direct"),
    Case("checkout-elsewhere-and-files-touched", touch("pkg/dev.py"), "direct"),
    Case("editor-files-beside-a-module", unrelated_files, "direct"),
    Case("entry-marked-used", store_file("entry", touched), "direct"),
    Case("module-source", replace("pkg/dev.py", "x + 1.0", "x + 3.0"), "full",
         "pkg/dev.py changed", "stale"),
    Case("module-source-same-size-mtime-put-back", edited_with_mtime_kept, "full",
         "pkg/dev.py changed", "stale"),
    Case("module-outside-the-project", private_vendor_edited, "full", "helpers.py changed",
         "stale"),
    Case("project-file", replace("kbuild.toml", 'arch = ["sm_80"]', 'arch = ["sm_80"]  # ok'),
         "full", "kbuild.toml changed"),
    Case("environment-variable-read-at-import", setting(KB_SCALE="3.0"), "full",
         "environment variable KB_SCALE changed", "stale"),
    Case("file-read-at-import", replace("pkg/offset.txt", "0.5", "0.7"), "full",
         "pkg/offset.txt changed", "stale"),
    Case("folder-listed-at-import", lambda r: (r.project / "pkg/data/b.txt").write_text("b"),
         "full", "added to or removed from pkg/data", "stale"),
    Case("numba-setting", setting(NUMBA_OPT="0"), "full", "NUMBA_", "stale"),
    Case("import-path", lambda r: r.env.update(
        PYTHONPATH=f"{r.vendor}{os.pathsep}{r.project.parent}"), "full", "sys.path"),
    Case("module-shadowed-earlier-on-the-path", shadowing_package, "full",
         "added to or removed from"),
    Case("numba-config-file-appears", numba_config_file, "full", ".numba_config.yaml appeared"),
    Case("interpreter-flags", python_optimized, "full", "interpreter"),
    Case("working-directory", from_a_subfolder, "full", "working directory"),
    Case("arch-not-journaled", args("--arch", "sm_90"), "full", "not in the journal",
         "missing"),
    Case("entry-removed", store_file("entry", Path.unlink), "full", "is gone from the store",
         "missing"),
    Case("blob-damaged-in-place", store_file("cubin", flip_last_byte), "full", "changed",
         "stale", "corrupt"),
    Case("journal-damaged", journal_damaged, "full", "cannot be used", warning="journal"),
    Case("journal-of-another-version", journal_of_another_version, "full", "version 99",
         warning="journal"),
    Case("journal-written-in-the-future", journal_from_the_future, "full", "clock skew"),
    Case("full-flag", args("--full"), "full", "--full"),
    Case("direct-off-in-the-project-file", direct_off, "full", "[build] direct = false"),
]


def _past_the_tick() -> None:
    """Wait out the journal's fine clock tick, so that what a change wrote is no longer
    'changed while the run read it' for the run that follows (waits, asserts no time)."""
    time.sleep(2 * FINE_TICK_NS / 1e9)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_change_to_each_journal_input_is_noticed(baseline, tmp_path, case):
    r = checkout(baseline, tmp_path)
    case.change(r)
    _past_the_tick()
    result = r.status()
    assert result.returncode == 0, result.stderr
    mode = result.json["mode"]
    assert mode["used"] == case.mode, mode
    assert case.reason in mode["reason"], mode
    (row,) = result.json["targets"]
    assert row["status"] == case.status, row
    if case.warning:
        assert case.warning in result.stderr, result.stderr
    if case.mode == "full" and case.id not in ("full-flag", "direct-off-in-the-project-file"):
        # What the full run wrote answers the same question next time, when the change was
        # older than a clock tick as that run read it: a file changed within a tick of its
        # read is rightly never journaled (a process served by the tests' zygote starts
        # within the tick of a change made just before it).
        again = r.status()
        assert again.json["mode"]["used"] == "direct" or row["status"] != "up-to-date", \
            again.json["mode"]
        assert again.json["targets"] == result.json["targets"]


def test_keys_from_the_journal_are_the_keys(baseline, tmp_path):
    r = checkout(baseline, tmp_path)
    direct = run("keys", "--json", "--store", r.store, cwd=r.project, home=shared_home(),
                 env={"PYTHONPATH": str(r.vendor), "KB_SCALE": None}, bytecode=False)
    full = run("keys", "--json", "--full", "--store", r.store, cwd=r.project,
               home=shared_home(), env={"PYTHONPATH": str(r.vendor), "KB_SCALE": None},
               bytecode=False)
    assert direct.returncode == full.returncode == 0
    assert direct.json == full.json


def test_a_direct_no_op_build_imports_no_numba(baseline, tmp_path):
    r = checkout(baseline, tmp_path)
    code = ("import atexit, json, sys\n"
            "atexit.register(lambda: print(json.dumps(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('numba', 'numba_cuda', 'llvmlite', 'pkg', 'vend'))), "
            "file=sys.stderr))\n"
            "import runpy\nrunpy.run_module('kbuild', run_name='__main__', alter_sys=True)\n")
    done = run("build", "--json", "--store", r.store, cwd=r.project, home=shared_home(),
               env={"PYTHONPATH": str(r.vendor), "KB_SCALE": None}, bytecode=False,
               launcher=("-c", code))
    assert done.returncode == 0, done.stderr
    assert done.json["mode"]["used"] == "direct"
    assert [t["status"] for t in done.json["targets"]] == ["cached"]
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []


def test_status_check_says_which_mode_answered(baseline, tmp_path):
    r = checkout(baseline, tmp_path)
    env = {"PYTHONPATH": str(r.vendor), "KB_SCALE": None}
    direct = run("status", "--check", "k", "--store", r.store, cwd=r.project,
                 home=shared_home(), env=env, bytecode=False)
    assert direct.returncode == 0, direct.stderr
    assert direct.stdout.splitlines()[-1] == "mode: direct (nothing the journal names changed)"
    full = run("status", "--check", "--full", "--store", r.store, cwd=r.project,
               home=shared_home(), env=env, bytecode=False)
    assert full.stdout.splitlines()[-1] == "mode: full (--full)"
    assert full.stdout.splitlines()[0] == direct.stdout.splitlines()[0]
    plain = run("status", "--store", r.store, cwd=r.project, home=shared_home(), env=env,
                bytecode=False)
    assert not any(line.startswith("mode:") for line in plain.stdout.splitlines())


def test_kbuilds_own_folders_are_no_listing_of_the_program(baseline, tmp_path):
    """kbuild lists its own keying folder (the facts' version): that is no input of the
    build. Taken as the program's listing, every name in it would count, and the
    `__pycache__` another process writes there on its first import of kbuild.keying would
    send the next no-op to full keying (CI, with bytecode written, once did)."""
    r = checkout(baseline, tmp_path)
    inputs = json.loads(journal_file(r).read_bytes().partition(b"\n")[2])["inputs"]
    package = str(Path(kbuild.__file__).resolve().parent)
    listed = {path: record[5] for path, record in inputs["dirs"].items()}
    assert any(path.startswith(package) for path in listed)  # the import system's folders
    assert {path: kind for path, kind in listed.items()
            if path.startswith(package) and kind != "import"} == {}
    assert listed["@/pkg/data"] == "program"  # what the project's module lists still counts
