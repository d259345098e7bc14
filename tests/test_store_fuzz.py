"""Fuzz the store: mutate a built store at random, then build, and never serve a wrong binary.

The examples are built once; each round copies that store, applies a few random
mutations (truncate, flip bytes, swap entries or blobs, swap artifacts between
manifests, replace files with links or FIFOs, replace folders with links, nest JSON
deeply, delete), and runs `kbuild build` (and `status` or `gc`). Every run must exit 0
or 1 without a traceback and within its timeout, every `cached` row must carry exactly
the clean build's artifacts for its target, and nothing outside the store may change.
Seeded (KBUILD_FUZZ_SEED) and bounded by a number of rounds (KBUILD_FUZZ_ROUNDS), never by
the clock: a loaded machine runs the same rounds, slower.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

import pytest
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

ARCH = "sm_90"
SEED = int(os.environ.get("KBUILD_FUZZ_SEED", "15"))
ROUNDS = int(os.environ.get("KBUILD_FUZZ_ROUNDS", "10"))


@pytest.fixture(scope="module")
def clean(tmp_path_factory, examples_template):
    """(project, store, artifacts by row) of the session's clean sm_90 build, copied."""
    base = tmp_path_factory.mktemp("fuzz")
    made = examples_template(ARCH)
    project, store = made.copy_to(base / "project", base / "store")
    artifacts = {(r["target"], r["signature"], r["arch"]): r["artifacts"]
                 for r in made.json["targets"]}
    return project, store, artifacts


def _files(store: Path, rng) -> list[Path]:
    """The store's files (not its facts: those are the keying facts' own, see sources)."""
    found = [p for p in store.rglob("*") if not p.is_symlink() and p.is_file()
             and "facts" not in p.parts and "locks" not in p.parts]
    rng.shuffle(found)
    return found


def _json_files(store: Path, rng) -> list[Path]:
    return [p for p in _files(store, rng) if p.suffix == ".json"]


def truncate(store, outside, rng):
    path = _files(store, rng)[0]
    data = path.read_bytes()
    path.write_bytes(data[:rng.randrange(len(data) + 1)])


def flip(store, outside, rng):
    path = _files(store, rng)[0]
    data = bytearray(path.read_bytes())
    for _ in range(rng.randint(1, 4)):
        if data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def swap_files(store, outside, rng, suffix=".json"):
    paths = [p for p in _files(store, rng) if (p.suffix == suffix) == (suffix == ".json")]
    if len(paths) >= 2:
        a, b = paths[:2]
        da, db = a.read_bytes(), b.read_bytes()
        a.write_bytes(db)
        b.write_bytes(da)


def swap_blobs(store, outside, rng):
    swap_files(store, outside, rng, suffix="")


def swap_artifacts(store, outside, rng):
    paths = _json_files(store, rng)[:2]
    try:
        a, b = (json.loads(p.read_text()) for p in paths)
    except (ValueError, UnicodeDecodeError):
        return
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return
    fields = rng.choice([("artifacts",), ("artifacts", "entry"), ("artifacts", "sizes", "entry")])
    for name in fields:
        a[name], b[name] = b.get(name), a.get(name)
    paths[0].write_text(json.dumps(a))
    paths[1].write_text(json.dumps(b))


def link_file(store, outside, rng):
    path = _files(store, rng)[0]
    target = rng.choice([outside / "secret.txt", Path("/dev/zero"), _files(store, rng)[-1]])
    path.unlink()
    path.symlink_to(target)


def fifo(store, outside, rng):
    path = _files(store, rng)[0]
    path.unlink()
    os.mkfifo(path)


def link_folder(store, outside, rng):
    folders = [p for p in (store / "v1").rglob("*") if p.is_dir() and not p.is_symlink()
               and "facts" not in p.parts and "locks" not in p.parts]
    path = rng.choice(folders)
    shutil.rmtree(path)
    path.symlink_to(outside)


def nest(store, outside, rng):
    path = _json_files(store, rng)[0]
    depth = rng.choice([40, 1000, 100_000])
    path.write_text('{"schema": 1, "x": ' + "[" * depth + "]" * depth + "}")


def delete(store, outside, rng):
    _files(store, rng)[0].unlink()


def stats_garbage(store, outside, rng):
    with open(store / "v1" / "stats.jsonl", "a") as fh:
        fh.write(rng.choice(['{"built": "x"}', "[" * 10_000, '{"cached": -1}', "\x00"]) + "\n")


MUTATIONS = [truncate, flip, swap_files, swap_blobs, swap_artifacts, link_file, fifo,
             link_folder, nest, delete, stats_garbage]


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _check(result, what: str, mutated: list) -> None:
    context = f"{what} after {mutated}:\n{result.stderr[-3000:]}"
    assert result.returncode in (0, 1), context
    assert "Traceback" not in result.stderr, context


def test_a_randomly_damaged_store_never_serves_a_wrong_binary(clean, run_kbuild, tmp_path):
    project, built, artifacts = clean
    rng = random.Random(SEED)
    outside = tmp_path / "outside"
    (outside / "ab" / "cd").mkdir(parents=True)
    (outside / "secret.txt").write_text("not kbuild's")
    (outside / ("ab" * 16)).write_text("looks like a blob")
    (outside / "ab" / "cd" / ("abcd" * 8)).write_text("looks like a blob too")
    for path in outside.rglob("*"):
        os.utime(path, (1, 1))  # ancient: stale by every rule gc has
    before = _snapshot(outside)
    started = time.monotonic()  # for the report below only
    for rounds in range(ROUNDS):
        store = tmp_path / f"store{rounds}"
        shutil.copytree(built, store, symlinks=True)
        mutated = []
        for mutation in rng.sample(MUTATIONS, rng.randint(1, 3)):
            mutation(store, outside, rng)
            mutated.append(mutation.__name__)
        result = run_kbuild("build", "--json", "--arch", ARCH, cwd=project, store=store,
                            timeout=180)
        _check(result, "build", mutated)
        for row in result.json["targets"]:
            if row["status"] == "cached":
                assert row["artifacts"] == artifacts[(row["target"], row["signature"],
                                                      row["arch"])], (mutated, row)
        extra = ["status", "--arch", ARCH] if rounds % 2 else ["gc", "--max-size", "1"]
        _check(run_kbuild(*extra, cwd=project, store=store, timeout=180), extra[0], mutated)
        assert _snapshot(outside) == before, f"a file outside the store changed after {mutated}"
        assert not (project / "v1").exists()
    print(f"fuzz: {ROUNDS} rounds in {time.monotonic() - started:.1f}s (seed {SEED})")
