"""The store directory as a plain tree kbuild owns: no link followed, no special file opened.

Every path below the store root is walked one component at a time with
`O_NOFOLLOW` and directory file descriptors, so a symbolic link anywhere inside
the store (`v1/blobs`, `v1/tmp`, an entry) is refused instead of followed, and
whatever is removed or written is inside the root it was built from. Files are
opened `O_NONBLOCK` and checked with `fstat`: a FIFO or a device is refused
without blocking, and a read stops at a cap instead of running out of memory.
The root itself may be a link (a user's `~/.cache` often is): it is the user's
choice, the tree below it is kbuild's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class NotPlain(OSError):
    """A path inside the store is a link, a FIFO, a device, or larger than allowed."""


@contextlib.contextmanager
def opened_dir(root: Path, parts, *, create: bool = False, replace: bool = True):
    """A file descriptor for root/parts..., no component a link (made when `create`; a
    link or file in the way is replaced when `replace`, else refused with NotPlain)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            child = _open_child(fd, part, create, replace)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _open_child(fd: int, name: str, create: bool, replace: bool = True) -> int:
    try:
        return os.open(name, _DIR, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(name, 0o777, dir_fd=fd)
        except FileExistsError:
            pass
        return _open_child(fd, name, False)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        if not (create and replace):
            raise NotPlain(exc.errno, f"{name} is not a plain directory") from None
        # Writing where a link or a file stands in for a folder: the tree is kbuild's, so
        # the link itself goes (never what it names) and a real folder takes its place.
        os.unlink(name, dir_fd=fd)
        return _open_child(fd, name, True)


def _split(rel: str):
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"not a store path: {rel!r}")
    return parts[:-1], parts[-1]


def read_file(root: Path, rel: str, cap: int) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file root/rel (at most `cap`) and its stat; NotPlain when it
    is a link, not a regular file or larger than `cap`, FileNotFoundError when absent."""
    folders, name = _split(rel)
    with opened_dir(root, folders) as dirfd:
        try:
            fd = os.open(name, _FILE, dir_fd=dirfd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise NotPlain(exc.errno, f"{rel} is not a regular file") from None
            raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotPlain(errno.EINVAL, f"{rel} is not a regular file")
        if info.st_size > cap:
            raise NotPlain(errno.EFBIG, f"{rel} is larger than {cap} bytes")
        data = _read_capped(fd, cap)
        if data is None:
            raise NotPlain(errno.EFBIG, f"{rel} is larger than {cap} bytes")
        return data, info
    finally:
        os.close(fd)


def _read_capped(fd: int, cap: int) -> bytes | None:
    chunks, total = [], 0
    while True:
        chunk = os.read(fd, min(1 << 20, cap + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > cap:
            return None


def identity(info: os.stat_result) -> list:
    """What tells one version of a file from another without reading it: [device, inode,
    size, mtime_ns, ctime_ns]. A rewrite in place changes the ctime (which only the kernel
    sets); an atomic replacement the inode."""
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def lstat(root: Path, rel: str) -> os.stat_result | None:
    """The stat of root/rel itself (a link is not followed), or None when it is absent."""
    folders, name = _split(rel)
    try:
        with opened_dir(root, folders) as dirfd:
            return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except (FileNotFoundError, NotPlain):
        return None


def remove(root: Path, rel: str) -> bool:
    """Remove root/rel (a file or a link itself, never what a link names); True if it went."""
    folders, name = _split(rel)
    try:
        with opened_dir(root, folders) as dirfd:
            os.unlink(name, dir_fd=dirfd)
        return True
    except (FileNotFoundError, NotPlain, IsADirectoryError):
        return False


def touch(root: Path, rel: str) -> None:
    folders, name = _split(rel)
    with opened_dir(root, folders) as dirfd:
        os.utime(name, dir_fd=dirfd, follow_symlinks=False)


def listing(root: Path, rel: str):
    """[(name, stat)] of what root/rel holds, links not followed; [] when it is not a
    plain directory."""
    try:
        with opened_dir(root, rel.split("/") if rel else []) as dirfd:
            names = sorted(os.listdir(dirfd))
            out = []
            for name in names:
                try:
                    out.append((name, os.stat(name, dir_fd=dirfd, follow_symlinks=False)))
                except FileNotFoundError:
                    pass
            return out
    except (FileNotFoundError, NotPlain, NotADirectoryError):
        return []


def write_atomic(root: Path, rel: str, data: bytes, tmp: str, mode: int, *,
                 prefix: str | None = None, replace: bool = True) -> None:
    """Write root/rel via a fresh file in root/tmp (named `prefix`..., default after the
    file) and a rename between the two directory descriptors: readers never see half a
    file, and nothing lands outside the root. A link on the way is replaced (`replace`:
    the tree is kbuild's) or refused with NotPlain (a tree kbuild shares with others)."""
    folders, name = _split(rel)
    tmp_parts = tmp.split("/") if tmp else []
    with opened_dir(root, tmp_parts, create=True, replace=replace) as tmpfd, \
            opened_dir(root, folders, create=True, replace=replace) as dirfd:
        temp = f"{prefix or name[:16] + '.'}{secrets.token_hex(6)}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode, dir_fd=tmpfd)
        try:
            try:
                os.fchmod(fd, mode)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(temp, name, src_dir_fd=tmpfd, dst_dir_fd=dirfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=tmpfd)
            raise


def plain_dir(root: Path, rel: str) -> bool:
    """Whether root/rel is a directory reached without following a link."""
    try:
        with opened_dir(root, rel.split("/")):
            return True
    except (OSError, ValueError):
        return False
