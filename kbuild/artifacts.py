"""What a compiled artifact is and says it is: the kinds of artifact an entry holds, and
the arch and kernel names inside PTX, cubin, LTO-IR.

The store binds every entry to its target by checking that the bytes it names
agree with the manifest: the PTX's `.target sm_XX` and `.entry` names, the
cubin's ELF arch and kernel symbols. These readers are pure Python over bytes
(no driver, no numba) and refuse, rather than guess, on anything malformed:
a `BinaryError` is a corrupt artifact.

Both the store (which verifies what it holds) and the backend (which makes it)
speak of these facts, so they live below both: this module imports nothing of
kbuild's.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

# The binaries a target's entry holds (beside the record of what its compile observed).
TARGET_KINDS = ("ptx", "cubin")
# What a compile observed (keying.observed's JSON record), beside any entry's binaries: its
# blob is verified like every blob and must be bounded JSON; the build checks that it
# names the entry's own static key.
RECORD_KIND = "observed"
# The `kind` of a separately compiled object's entry (its LTO-IR), not a target's.
OBJECT_KIND = "object"
# The `kind` of an early-cutoff record's entry: the PTX and cubin a link of LTO-IR objects
# (or an assembly of PTX) made, under the key of its input bytes (`keying.cutoff`).
OUTPUT_KIND = "output"

_PTX_TARGET = re.compile(rb"^[ \t]*\.target[ \t]+(sm_\d+[a-z]?)", re.MULTILINE)
_PTX_VERSION = re.compile(rb"^[ \t]*\.version[ \t]", re.MULTILINE)
_PTX_ENTRY = re.compile(rb"^[ \t]*(?:\.(?:visible|weak)[ \t]+)?\.entry[ \t]+([A-Za-z_$][\w$]*)",
                        re.MULTILINE)
# `.extern .func (.param .b32 r) name(` declares; `.func name(` without `.extern` defines.
_PTX_FUNC = re.compile(rb"^[ \t]*((?:\.(?:extern|visible|weak)[ \t]+)*)\.func[ \t]+"
                       rb"(?:\([^)]*\)[ \t]*)?([A-Za-z_$][\w$]*)", re.MULTILINE)
# Functions the driver's PTX JIT provides itself (printf, device malloc, assert).
_DRIVER_FUNCTIONS = frozenset({"vprintf", "malloc", "free", "__assertfail"})
_ELF_MAGIC = b"\x7fELF"
_EM_CUDA = 190
_SHT_SYMTAB = 2
_STT_FUNC = 2
_LTOIR_MAGIC = b"\xedCN\x7f"  # nvJitLink's LTO-IR container
_MAX_SECTIONS = 1 << 16
_MAX_SYMBOLS = 1 << 20


class BinaryError(ValueError):
    """The bytes are not the kind of artifact they are named as."""


@dataclass(frozen=True)
class Facts:
    """The arch an artifact was made for ('sm_90', or None when it records none) and the
    kernels it defines."""

    arch: str | None
    kernels: frozenset


def artifact_facts(kind: str, data: bytes) -> Facts:
    """The facts of an artifact of `kind` ('ptx', 'cubin', 'ltoir'); BinaryError if malformed."""
    reader = _READERS.get(kind)
    if reader is None:
        raise BinaryError(f"unknown artifact kind {kind!r}")
    return reader(data)


def ptx_facts(data: bytes) -> Facts:
    """A PTX text is one module, or several for one arch: a `debug=True` compile makes a
    module per function, which numba keeps joined (`get_asm_str`) and links one by one."""
    targets = _PTX_TARGET.findall(data)
    if len(set(targets)) != 1:
        raise BinaryError("PTX without a .target line, or with .target lines for more "
                          "than one arch")
    if len(_PTX_VERSION.findall(data)) != len(targets):
        raise BinaryError("PTX whose modules do not each have one .version and .target line")
    entries = [m.decode() for m in _PTX_ENTRY.findall(data)]
    if len(set(entries)) != len(entries):
        raise BinaryError("PTX defining a kernel more than once")
    return Facts(targets[0].decode(), frozenset(entries))


def ptx_modules(data: bytes) -> list:
    """The modules of a PTX text (see `ptx_facts`), each from its `.version` line on; the
    driver loads one module at a time, so several are linked (`loader.link_ptx`)."""
    starts = [m.start() for m in _PTX_VERSION.finditer(data)]
    if len(starts) < 2:
        return [data]
    starts[0] = 0  # what comes before the first .version (comments) stays with it
    return [data[a:b] for a, b in zip(starts, starts[1:] + [len(data)])]


def ptx_unresolved(data: bytes) -> frozenset:
    """Functions a PTX module declares `.extern` and does not define, beyond those the
    driver provides: code that was linked into its cubin (`link=` files, `declare_device`,
    cudadevrt), without which the driver cannot load the PTX alone."""
    declared, defined = set(), set()
    for qualifiers, name in _PTX_FUNC.findall(data):
        (declared if b".extern" in qualifiers else defined).add(name.decode())
    return frozenset(declared - defined - _DRIVER_FUNCTIONS)


def cubin_facts(data: bytes) -> Facts:
    """An ELF64 little-endian CUDA object: its sm number from e_flags, its kernel symbols."""
    if len(data) < 64 or data[:4] != _ELF_MAGIC or data[4] != 2 or data[5] != 1:
        raise BinaryError("cubin is not a 64-bit little-endian ELF file")
    machine, = struct.unpack_from("<H", data, 18)
    if machine != _EM_CUDA:
        raise BinaryError(f"cubin's ELF machine is {machine}, not CUDA ({_EM_CUDA})")
    flags, = struct.unpack_from("<I", data, 48)
    # CUDA's ELF ABI version 8 and later keep the sm number in bits 8-15, older ones in 0-7.
    sm = (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF
    return Facts(f"sm_{sm}", frozenset(_elf_functions(data)))


def _elf_functions(data: bytes) -> set:
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum = struct.unpack_from("<HH", data, 58)
    if shentsize != 64 or shnum > _MAX_SECTIONS or shoff + shnum * 64 > len(data):
        raise BinaryError("cubin's section table is malformed")
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * 64) for i in range(shnum)]
    names = set()
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != _SHT_SYMTAB:
            continue
        if entsize != 24 or link >= shnum or offset + size > len(data) or size > 24 * _MAX_SYMBOLS:
            raise BinaryError("cubin's symbol table is malformed")
        strtab = sections[link]
        strings = data[strtab[4]:strtab[4] + strtab[5]]
        for at in range(offset, offset + size - size % 24, 24):
            name_at, info, _, shndx = struct.unpack_from("<IBBH", data, at)
            if info & 0xF == _STT_FUNC and shndx != 0:
                names.add(_c_string(strings, name_at))
    return names


def _c_string(table: bytes, at: int) -> str:
    end = table.find(b"\0", at)
    if at >= len(table) or end < 0:
        raise BinaryError("cubin's string table is malformed")
    return table[at:end].decode("ascii", "replace")


def ltoir_facts(data: bytes) -> Facts:
    """LTO-IR is opaque here: only its container's magic number is checked."""
    if data[:4] != _LTOIR_MAGIC:
        raise BinaryError("LTO-IR without its magic number")
    return Facts(None, frozenset())


_READERS = {"ptx": ptx_facts, "cubin": cubin_facts, "ltoir": ltoir_facts}


# An arch name: 'sm_' + the cc's major and minor digits, and an optional 'a'
# (arch-specific) or 'f' (family) suffix.
ARCH = re.compile(r"^sm_(\d+)(\d)([af]?)$")


def arch_cc(arch: str) -> tuple:
    """'sm_90' -> (9, 0); 'sm_90a' -> (9, 0, 'a')."""
    major, minor, suffix = ARCH.match(arch).groups()
    return (int(major), int(minor), suffix) if suffix else (int(major), int(minor))


def arch_number(arch: str) -> str:
    """'sm_90a' -> 'sm_90': what a cubin's e_flags and a PTX's .target are compared by."""
    match = re.match(r"^sm_(\d+)", arch or "")
    return f"sm_{match.group(1)}" if match else ""


def cubin_runs_on(arch: str, device_arch: str) -> bool:
    """Whether a cubin built for `arch` loads on a device of `device_arch` ('sm_90'): the
    device's own arch, or its arch-specific target ('sm_90a', what numba-cuda's JIT
    compiles for from 9.0 on), which runs on that cc alone."""
    return bool(arch_number(arch)) and arch_number(arch) == arch_number(device_arch)


def names_kernel(entry: str, prefix: str) -> bool:
    """Whether the symbol `entry` is the kernel whose entry prefix (its mangled module and
    name, `backend.binaries.entry_prefix`) is `prefix`, and not one nested inside it: the
    prefix ends where its ABI tags or the name end."""
    return entry.startswith(prefix) and entry[len(prefix):len(prefix) + 1] in ("B", "E")
