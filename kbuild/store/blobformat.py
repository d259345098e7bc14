"""How a blob's bytes are kept on disk in the local store: compressed, in a versioned
envelope, or as they are.

    b"\\0kbz" | format version (1 byte) | codec (1 byte) | length (8 bytes, LE) | payload

Format 1, codec 1 is zlib (level 6) over the blob's bytes. A blob is still named, and
verified on every read, by the hash of its *uncompressed* bytes, so nothing above the
store (entries, remotes, archives, bundles: they all go through `put_blob`/`read_blob`)
sees a difference. PTX and cubins shrink about 7x and 6x on the examples (LTO-IR does not
compress and is kept as it is, as is anything compression would not shrink by a tenth).

Files written before this format, or that compression did not pay for, hold the bytes as
they are and are read as they are. A file that starts with the envelope's magic but does
not verify once unpacked is tried as plain bytes before it is called corrupt, so a blob
that happens to begin with the magic still reads. An envelope of an unknown version or
codec (a newer kbuild's) is `UnknownFormat`: a miss with a warning, never a crash, and
the file is left for the kbuild that wrote it.
"""

from __future__ import annotations

import struct
import zlib

MAGIC = b"\0kbz"
FORMAT = 1
ZLIB = 1
_HEADER = struct.Struct("<4sBBQ")  # magic, format, codec, uncompressed length
HEADER_SIZE = _HEADER.size
_MIN_SIZE = 256  # smaller blobs (observation records) gain little: kept as they are
_LEVEL = 6  # zlib's default: within 1-4% of zstd's ratio on PTX and cubins


class UnknownFormat(ValueError):
    """An envelope this kbuild cannot read (a newer format or codec)."""


class Malformed(ValueError):
    """An envelope that does not unpack (truncated, corrupt, longer than allowed)."""


def encode(data: bytes) -> bytes:
    """The bytes to write for blob `data`: its envelope when compression saves a tenth."""
    if len(data) < _MIN_SIZE:
        return data
    packed = zlib.compress(data, _LEVEL)
    if HEADER_SIZE + len(packed) > 0.9 * len(data):
        return data
    return _HEADER.pack(MAGIC, FORMAT, ZLIB, len(data)) + packed


def is_packed(stored: bytes) -> bool:
    return stored[:4] == MAGIC


def length(stored_head: bytes) -> int | None:
    """The uncompressed length an envelope's header records, or None (not an envelope)."""
    if len(stored_head) < HEADER_SIZE or not is_packed(stored_head):
        return None
    return _HEADER.unpack_from(stored_head)[3]


def decode(stored: bytes, cap: int) -> bytes:
    """The blob's bytes from what was read (`stored`), at most `cap` of them: plain
    bytes as they are, an envelope unpacked. UnknownFormat or Malformed otherwise."""
    if not is_packed(stored):
        return stored
    if len(stored) < HEADER_SIZE:
        raise Malformed("truncated header")
    _, version, codec, size = _HEADER.unpack_from(stored)
    if version != FORMAT or codec != ZLIB:
        raise UnknownFormat(f"format {version}, codec {codec}; this kbuild reads format "
                            f"{FORMAT}, codec {ZLIB} (zlib): a newer kbuild's?")
    if size > cap:
        raise Malformed(f"it unpacks to {size} bytes, more than the {cap} allowed")
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(stored[HEADER_SIZE:], size + 1)
    except zlib.error as exc:
        raise Malformed(f"zlib: {exc}") from None
    if len(data) != size or not inflater.eof or inflater.unconsumed_tail \
            or inflater.unused_data:
        raise Malformed(f"it unpacks to other than the {size} bytes it records")
    return data
