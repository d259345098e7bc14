"""A long-lived process (`kbuild watch`, `Project.load()` in a notebook, a zero-config
program that compiles after it rewrote a file) digests a file again whenever it may have
changed: a digest is kept by the file's whole stat (device, inode, size, mtime, ctime),
as git's index keeps it, and not kept at all while the file is racily new (changed
within the clock's coarseness of the read: a second write in the same tick keeps every
stat field)."""

from __future__ import annotations

import os
import time

from kbuild import sources


def _rewrite_keeping_mtime(path, text: str) -> None:
    before = os.stat(path)
    path.write_text(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # as `cp -p`, rsync -t do
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def _settled(monkeypatch) -> None:
    """Files written so far count as old (not racily new): a short racy window, passed."""
    monkeypatch.setattr(sources, "_RACY_NS", 20_000_000, raising=False)
    time.sleep(0.05)


def test_a_linked_file_rewritten_keeping_size_and_mtime_is_digested_again(tmp_path,
                                                                         monkeypatch):
    linked = tmp_path / "helper.cu"
    linked.write_text("int a;\n")
    _settled(monkeypatch)
    project = sources.ProjectSources([str(tmp_path)])
    first = project.file_digest(str(linked))
    _rewrite_keeping_mtime(linked, "int b;\n")
    assert project.file_digest(str(linked)) != first


def test_a_source_rewritten_keeping_size_and_mtime_is_read_again(tmp_path, monkeypatch):
    module = tmp_path / "mod.py"
    module.write_text("X = 1\n")
    _settled(monkeypatch)
    first = sources.source_digest(str(module))
    _rewrite_keeping_mtime(module, "X = 2\n")
    assert sources.source_digest(str(module)) != first


def test_a_racily_new_file_is_not_trusted_by_its_stat(tmp_path):
    """Written twice within one tick of the file system's clock, a file keeps every stat
    field; its first digest must not answer for the second."""
    linked = tmp_path / "helper.cu"
    linked.write_text("int a;\n")
    project = sources.ProjectSources([str(tmp_path)])
    first = project.file_digest(str(linked))
    linked.write_text("int b;\n")  # most often within the same tick: every field kept
    assert project.file_digest(str(linked)) != first


def test_an_unchanged_old_file_is_read_once(tmp_path, monkeypatch):
    """Precision of work: an old file whose stat is unchanged is not read again."""
    linked = tmp_path / "helper.cu"
    linked.write_text("int a;\n")
    _settled(monkeypatch)
    project = sources.ProjectSources([str(tmp_path)])
    first = project.file_digest(str(linked))
    reads = []
    real_open = open

    def counting_open(path, *args, **kwargs):
        reads.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    assert project.file_digest(str(linked)) == first
    assert str(linked) not in map(str, reads)
