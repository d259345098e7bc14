"""Canonical, typed, length-prefixed encoding of key inputs, and the digest over it.

Every value that reaches a key goes through `encode`: each item is a one-byte
type tag, a length and a payload, so `("ab", "c")` and `("a", "bc")` never meet,
and `1`, `1.0`, `True` and `"1"` all differ. Unsupported types raise
`Unencodable`; there is deliberately no fallback to `repr()` or identity.
"""

from __future__ import annotations

import enum
import struct

import xxhash

SCHEMA = 1


class Unencodable(TypeError):
    """A value of a type the encoder does not know how to hash by content."""

    def __init__(self, value):
        self.type_name = f"{type(value).__module__}.{type(value).__qualname__}"
        super().__init__(f"cannot encode a value of type {self.type_name}")


def digest(data: bytes) -> str:
    """The full xxh3-128 digest of `data`, as 32 lowercase hex digits."""
    return xxhash.xxh3_128_hexdigest(data)


def digest_of(value) -> str:
    """The digest of the canonical encoding of `value`."""
    return digest(encode(value))


_LENGTH = struct.Struct("<Q")
_HEADER = b"\0" * 9


def encode(value) -> bytes:
    """Encode `value` canonically. Dicts and sets are encoded in sorted order."""
    out = bytearray()
    _write(value, out)
    return bytes(out)


def encode_into(value, out: bytearray) -> None:
    """Append the encoding of `value` to `out` (what `encode` returns, without a copy)."""
    _write(value, out)


def open_tuple(out: bytearray) -> int:
    """Start a tuple whose items the caller appends; pass the result to `close_tuple`."""
    return _open(b"T", out)


def close_tuple(start: int, out: bytearray) -> None:
    _close(start, out)


def _write(value, out: bytearray) -> None:
    # Written into one buffer, the length patched in after the payload: keys
    # encode whole ASTs, and building bytes per node would copy them per level.
    kind = type(value)
    if kind is tuple or kind is list:
        out += b"T" if kind is tuple else b"L"
        out += _HEADER[:8]
        start = len(out)
        for item in value:
            _write(item, out)
        _LENGTH.pack_into(out, start - 8, len(out) - start)
        return
    if kind is str:
        data = value.encode("utf-8")
        out += b"S"
        out += _LENGTH.pack(len(data))
        out += data
        return
    fast = _EXACT.get(kind)
    if fast is not None:
        tag, payload = fast(value)
    else:
        tag, payload = _scalar(value)
    if tag is None:
        if isinstance(value, enum.Enum):
            _leaf(b"E", _encode_enum(value), out)
        elif isinstance(value, tuple):  # a namedtuple or other tuple subclass
            _write(tuple(value), out)
        elif isinstance(value, list):
            _write(list(value), out)
        elif isinstance(value, dict):
            _leaf(b"D", _encode_dict(value), out)
        elif isinstance(value, (frozenset, set)):
            _leaf(b"Z", b"".join(sorted(encode(v) for v in value)), out)
        else:
            raise Unencodable(value)
        return
    _leaf(tag, payload, out)


def _scalar(value):
    """(tag, payload) of a scalar, or (None, None) for anything else."""
    # bool before int: bool is a subclass of int; enums may subclass int too.
    if value is None:
        return b"N", b""
    if isinstance(value, bool):
        return b"B", b"\x01" if value else b"\x00"
    if isinstance(value, enum.Enum):
        return None, None
    if isinstance(value, int):
        return b"I", str(int(value)).encode()
    if isinstance(value, float):
        return b"F", _float_bytes(value)
    if isinstance(value, complex):
        return b"C", _float_bytes(value.real) + _float_bytes(value.imag)
    if isinstance(value, str):
        return b"S", value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"Y", bytes(value)
    return None, None


_EXACT = {
    type(None): lambda v: (b"N", b""),
    bool: lambda v: (b"B", b"\x01" if v else b"\x00"),
    int: lambda v: (b"I", str(v).encode()),
    bytes: lambda v: (b"Y", v),
}


def _open(tag: bytes, out: bytearray) -> int:
    out += tag
    out += _HEADER[:8]
    return len(out)


def _close(start: int, out: bytearray) -> None:
    _LENGTH.pack_into(out, start - 8, len(out) - start)


def _leaf(tag: bytes, payload: bytes, out: bytearray) -> None:
    out += tag
    out += _LENGTH.pack(len(payload))
    out += payload


def _float_bytes(x: float) -> bytes:
    # The bit pattern: -0.0 and 0.0, and NaNs of another sign or payload, compile to
    # different constants (a stored NaN keeps its bits in the PTX).
    return struct.pack("<d", x)


def _encode_dict(d: dict) -> bytes:
    items = sorted((encode(k), encode(v)) for k, v in d.items())
    return b"".join(k + v for k, v in items)


def _encode_enum(member: enum.Enum) -> bytes:
    cls = type(member)
    head = encode((cls.__module__, cls.__qualname__, member.name))
    return head + encode(member.value)
