"""`kbuild watch`'s waiting: work done while idle, and polling that stays cheap.

The end-to-end watch (rebuilds on save, one process) is in test_cli_newcomer.py.
"""

from __future__ import annotations

import time

from kbuild import watch

from support import run


def _tree(tmp_path, files=("a.py", "pkg/b.py")):
    for name in files:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n")
    return tmp_path


def test_idle_work_runs_first_and_a_save_made_during_it_is_still_seen(tmp_path, monkeypatch):
    root = _tree(tmp_path)
    before = watch.snapshot([root])
    done = []

    def idle():  # a save lands while the watcher is busy with its idle work
        (root / "pkg" / "b.py").write_text("x = 22\n")
        done.append("idle")

    real_snapshot, looks = watch.snapshot, []

    def counted_snapshot(roots, extra=()):
        looks.append(1)
        assert len(looks) <= 2, "the save made during the idle work was not seen at once"
        return real_snapshot(roots, extra)

    monkeypatch.setattr(watch, "snapshot", counted_snapshot)
    _, what = watch.wait_for_change([root], [], before, idle=[idle])
    assert done == ["idle"]
    assert what == [str(root / "pkg" / "b.py")]
    assert len(looks) == 2  # the first look found it; the second is the settle's


def test_polling_waits_longer_where_one_look_at_the_tree_takes_long(tmp_path, monkeypatch):
    """A look at a big tree taking 30 ms: the watcher waits at least 10x that between
    looks (about a tenth of a core at most), not the 0.1 s it waits on a small tree."""
    root = _tree(tmp_path)
    before = watch.snapshot([root])
    real_snapshot, pauses, looks = watch.snapshot, [], []

    def slow_snapshot(roots, extra=()):
        real_snapshot(roots, extra)  # the tree as it is, found slowly
        looks.append(1)
        time.sleep(0.03)
        if len(looks) == 4:
            (root / "a.py").write_text("x = 333\n")
        return real_snapshot(roots, extra)

    real_sleep = time.sleep

    def sleep(seconds):
        pauses.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(watch, "snapshot", slow_snapshot)
    monkeypatch.setattr(watch.time, "sleep", sleep)
    _, what = watch.wait_for_change([root], [], before, interval=0.1, settle=0.0)
    assert what == [str(root / "a.py")]
    polls = [p for p in pauses if p != 0.03 and p != 0.0]
    assert polls[0] == 0.1  # the first wait, before any look was timed
    assert all(p >= 0.3 for p in polls[1:]), polls


def test_prepare_does_numbas_first_compile_set_up_ahead_of_the_first_compile(tmp_path):
    """What the watcher does while idle: numba's typing and lowering registries loaded
    (a fresh process: the test process may have compiled already)."""
    code = ("from numba.cuda.descriptor import cuda_target as t\n"
            "from kbuild.backend.compiler import prepare\n"
            "before = len(t.typing_context._registries), len(t.target_context._registries)\n"
            "prepare()\n"
            "print(*before, len(t.typing_context._registries),"
            " len(t.target_context._registries))\n")
    done = run(launcher=("-c", code), cwd=tmp_path, home=tmp_path / "home")
    assert done.returncode == 0, done.stderr
    typing_before, target_before, typing_after, target_after = map(int, done.stdout.split())
    assert (typing_before, target_before) == (0, 0)
    assert typing_after > 0 and target_after > 0

