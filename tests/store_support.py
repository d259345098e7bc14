"""Small artifacts that read as what they claim: a PTX text and a CUDA ELF cubin, made
by hand so store tests need no compile (the readers are tested on real ones elsewhere)."""

from __future__ import annotations

import struct


def make_ptx(arch: str = "sm_80", entry: str = "k") -> bytes:
    return (f"//\n.version 8.0\n.target {arch}\n.address_size 64\n\n"
            f".visible .entry {entry}()\n{{\n\tret;\n}}\n").encode()


def make_cubin(sm: int = 80, symbols=("k",), abi: int = 8) -> bytes:
    """An ELF64 little-endian file for machine 190 (CUDA) with a .symtab of FUNC symbols."""
    strtab = b"\0" + b"".join(s.encode() + b"\0" for s in symbols)
    shstrtab = b"\0.strtab\0.symtab\0.shstrtab\0"
    syms = bytes(24)  # the null symbol
    at = 1
    for name in symbols:
        syms += struct.pack("<IBBHQQ", at, 0x12, 0, 1, 0, 0)  # GLOBAL FUNC in section 1
        at += len(name) + 1
    body = strtab + syms + shstrtab
    shoff = 64 + len(body)
    flags = (sm << 8) if abi >= 8 else sm
    header = (b"\x7fELF\x02\x01\x01\x41" + bytes([abi]) + bytes(7)
              + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, flags, 64, 0, 0, 64, 4, 3))
    sections = bytes(64)
    sections += struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, 64, len(strtab), 0, 0, 1, 0)
    sections += struct.pack("<IIQQQQIIQQ", 9, 2, 0, 0, 64 + len(strtab), len(syms), 1, 1, 8, 24)
    sections += struct.pack("<IIQQQQIIQQ", 17, 3, 0, 0, 64 + len(strtab) + len(syms),
                            len(shstrtab), 0, 0, 1, 0)
    return header + body + sections
