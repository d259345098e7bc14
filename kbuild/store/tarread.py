"""Reading a tar archive nobody vouches for: every header bounded before it is parsed.

`tarfile` reads a pax header or a GNU long name of whatever size the archive
declares (a 500 MB long name is 500 MB of memory) and parses pax records in
time that grows with the square of their length on some Pythons (a 1 MB pax
header of digits: over a minute of CPU). Reading is simple in what kbuild needs
(regular files with short names), so this module reads the 512-byte header
blocks itself, one at a time from the (decompressed) stream: an extended header
(pax ``x``/``g``, GNU ``L``/``K``) larger than `MAX_EXTENDED` is refused at its
header, before its bytes are read, and pax records are checked in one linear pass;
at most `MAX_EXTENDED_RUN` extended headers may precede a member. The caller
sees each member's name (after pax ``path`` / GNU long names), kind and size, and
decides before any of its data is read. Nothing here writes a file.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from dataclasses import dataclass

BLOCK = 512
MAX_EXTENDED = 64 << 10  # bytes of one pax header or GNU long name / long link
MAX_EXTENDED_RUN = 8  # extended headers before one member (pax, global pax, long name, link)
_CHUNK = 1 << 20
_REGULAR = (b"0", b"\0", b"7")  # a file (7: "contiguous", a file to every reader)
_KINDS = {b"1": "hard link", b"2": "symbolic link", b"3": "character device",
          b"4": "block device", b"5": "directory", b"6": "FIFO", b"S": "sparse file"}
_EXTENDED = {b"x": "pax header", b"X": "pax header", b"g": "global pax header",
             b"L": "GNU long name", b"K": "GNU long link"}
# What the decompressors raise on a damaged stream (beside OSError and EOFError).
DAMAGE = (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError)


class TarProblem(Exception):
    """Why the archive cannot be read; `unreadable` when it is no tar archive at all."""

    def __init__(self, message: str, unreadable: bool = False):
        super().__init__(message)
        self.unreadable = unreadable


@dataclass(frozen=True)
class Member:
    """One member as its headers declare it: `kind` is "file" or what it is instead."""

    name: str
    kind: str
    size: int


def opened(fileobj):
    """The tar stream in `fileobj`, decompressed when it is gzip, bzip2 or xz (told by its
    first bytes, as tarfile's "r:*" does)."""
    head = fileobj.peek(6)[:6] if hasattr(fileobj, "peek") else b""
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=fileobj, mode="rb")
    if head.startswith(b"BZh"):
        return bz2.BZ2File(fileobj, "rb")
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(fileobj, "rb")
    return fileobj


class TarReader:
    """Iterate the members of the tar `stream`; `read(member)` gives the data of the one
    just yielded (not read: skipped). Raises TarProblem; the stream's own errors
    (`DAMAGE`) pass through."""

    def __init__(self, stream):
        self.stream = stream
        self._unread = 0  # bytes of the current member's data (and padding) not read
        self._global: dict = {}  # records of global pax headers: they apply to all after

    def __iter__(self):
        first = True
        while True:
            member = self._next(first)
            first = False
            if member is None:
                return
            self._unread = member.size + -member.size % BLOCK
            yield member
            self._skip(self._unread)
            self._unread = 0

    def read(self, member: Member) -> bytes:
        data = self._exact(member.size, f"member '{_shown(member.name)}'")
        self._unread -= member.size
        return data

    # -- headers ----------------------------------------------------------------------------

    def _next(self, first: bool) -> Member | None:
        """The next member, its extended headers applied; None at the end of the archive."""
        local: dict = {}
        for _ in range(MAX_EXTENDED_RUN + 1):
            block = self._block()
            if first and not block:
                raise TarProblem("it is empty", unreadable=True)
            if not block or block == bytes(BLOCK):
                return None  # the end (a stream that stops at a header is read as one)
            if len(block) < BLOCK:
                raise TarProblem("it ends in the middle of a header", unreadable=first)
            _check_sum(block, first)
            first = False
            kind, size = block[156:157], _size(block)
            if kind not in _EXTENDED:
                return self._member(block, kind, size, {**self._global, **local})
            what = _EXTENDED[kind]
            if size > MAX_EXTENDED:
                raise TarProblem(f"a {what} of {size} bytes, more than the {MAX_EXTENDED} "
                                 "allowed")
            data = self._exact(size, f"a {what}")
            self._skip(-size % BLOCK)
            if kind == b"L":
                local["path"] = _text(data.split(b"\0", 1)[0])
            elif kind == b"K":
                local["linkpath"] = _text(data.split(b"\0", 1)[0])
            else:
                (self._global if kind == b"g" else local).update(_pax_records(data))
        raise TarProblem(f"more than {MAX_EXTENDED_RUN} extended headers precede a member")

    def _member(self, block: bytes, kind: bytes, size: int, pax: dict) -> Member:
        name = _text(block[:100].split(b"\0", 1)[0])
        prefix = block[345:500].split(b"\0", 1)[0] if block[257:263] == b"ustar\0" else b""
        if prefix:
            name = f"{_text(prefix)}/{name}"
        name = pax.get("path", name)
        if "size" in pax:
            size = _decimal(pax["size"], "size")
        if kind in _REGULAR and any(k.startswith("GNU.sparse.") for k in pax):
            kind = b"S"
        named = "file" if kind in _REGULAR else _KINDS.get(kind, f"member of type {kind!r}")
        return Member(name, named, size)

    # -- bytes ------------------------------------------------------------------------------

    def _block(self) -> bytes:
        """The next 512 bytes (fewer only at the end of the stream)."""
        block = self.stream.read(BLOCK)
        while block and len(block) < BLOCK:
            more = self.stream.read(BLOCK - len(block))
            if not more:
                break
            block += more
        return block

    def _exact(self, size: int, what: str) -> bytes:
        chunks, left = [], size
        while left:
            chunk = self.stream.read(min(left, _CHUNK))
            if not chunk:
                raise TarProblem(f"it ends in the middle of {what} (truncated)")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _skip(self, size: int) -> None:
        while size:
            chunk = self.stream.read(min(size, _CHUNK))
            if not chunk:
                return  # padding or data at the very end: the next read finds the end
            size -= len(chunk)


def _check_sum(block: bytes, first: bool) -> None:
    """A header's checksum (the unsigned sum, or the signed one old tars wrote)."""
    stored = block[148:156].split(b"\0", 1)[0].strip()
    unsigned = sum(block[:148]) + 256 + sum(block[156:])
    signed = unsigned - 256 * sum(1 for b in block[:148] + block[156:] if b > 127)
    try:
        ok = int(stored, 8) in (unsigned, signed)
    except ValueError:
        ok = False
    if not ok:
        raise TarProblem("a header's checksum does not match" if not first else
                         "its first block is not a tar header", unreadable=first)


def _size(block: bytes) -> int:
    field = block[124:136]
    if field[0] == 0x80:  # GNU base-256, positive
        return int.from_bytes(field[1:], "big")
    if field[0] & 0x80:
        raise TarProblem("a header declares a negative size")
    digits = field.split(b"\0", 1)[0].strip()
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise TarProblem(f"a header's size {digits[:20]!r} is not a number") from None


def _pax_records(data: bytes) -> dict:
    """The records of a pax header ("LENGTH KEY=VALUE\\n" each), read in one pass; any
    record that does not say its own length right is refused (tarfile would search on)."""
    records, pos = {}, 0
    while pos < len(data):
        if not data[pos:].strip(b"\0"):
            break  # NUL padding after the last record
        space = data.find(b" ", pos, pos + 21)
        length = _decimal(data[pos:space], "record length") if space > pos else 0
        end = pos + length
        if length <= space - pos + 1 or end > len(data) or data[end - 1:end] != b"\n":
            raise TarProblem(f"a malformed pax header (record at byte {pos})")
        key, eq, value = data[space + 1:end - 1].partition(b"=")
        if not eq or not key:
            raise TarProblem(f"a malformed pax header (record at byte {pos})")
        records[_text(key)] = _text(value)
        pos = end
    return records


def _decimal(text, what: str) -> int:
    text = text.decode("ascii", "replace") if isinstance(text, bytes) else text
    if not text.isdigit() or not text.isascii() or len(text) > 20:
        raise TarProblem(f"a malformed pax header ({what} {text[:20]!r})")
    return int(text)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _shown(name: str) -> str:
    return ascii(name)[1:-1][:120]
