"""Canonical, typed, length-prefixed encoding of key inputs, and the digest over it.

Every value that reaches a key goes through `encode`: each item is a one-byte
type tag, a length and a payload, so `("ab", "c")` and `("a", "bc")` never meet,
and `1`, `1.0`, `True` and `"1"` all differ. Unsupported types raise
`Unencodable`; there is deliberately no fallback to `repr()` or identity.
"""

from __future__ import annotations

import enum
import math
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


def _item(tag: bytes, payload: bytes) -> bytes:
    return tag + struct.pack("<Q", len(payload)) + payload


def encode(value) -> bytes:
    """Encode `value` canonically. Dicts are encoded with sorted keys."""
    # bool before int: bool is a subclass of int.
    if value is None:
        return _item(b"N", b"")
    if isinstance(value, bool):
        return _item(b"B", b"\x01" if value else b"\x00")
    if isinstance(value, enum.Enum):
        return _encode_enum(value)
    if isinstance(value, int):
        return _item(b"I", str(int(value)).encode())
    if isinstance(value, float):
        return _item(b"F", _float_bytes(value))
    if isinstance(value, complex):
        return _item(b"C", _float_bytes(value.real) + _float_bytes(value.imag))
    if isinstance(value, str):
        return _item(b"S", value.encode("utf-8"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _item(b"Y", bytes(value))
    if isinstance(value, tuple):
        return _item(b"T", b"".join(encode(v) for v in value))
    if isinstance(value, list):
        return _item(b"L", b"".join(encode(v) for v in value))
    if isinstance(value, dict):
        return _encode_dict(value)
    if isinstance(value, (frozenset, set)):
        return _item(b"Z", b"".join(sorted(encode(v) for v in value)))
    raise Unencodable(value)


def _float_bytes(x: float) -> bytes:
    # One NaN for all NaN payloads; -0.0 stays distinct from 0.0 (it compiles differently).
    if math.isnan(x):
        return b"nan"
    return struct.pack("<d", x)


def _encode_dict(d: dict) -> bytes:
    items = sorted((encode(k), encode(v)) for k, v in d.items())
    return _item(b"D", b"".join(k + v for k, v in items))


def _encode_enum(member: enum.Enum) -> bytes:
    cls = type(member)
    head = encode((cls.__module__, cls.__qualname__, member.name))
    return _item(b"E", head + encode(member.value))
