"""What a cubin says about its kernels: registers, local (stack frame) and shared memory.

Read from the ELF itself, so it needs no driver, no GPU and no CUDA tool: the
registers and frame size are attributes in the `.nv.info` section, keyed by the
function's symbol; static shared memory is the size of `.nv.shared.<function>`.
"""

from __future__ import annotations

import shutil
import struct
import subprocess

_EIATTR_FRAME_SIZE, _EIATTR_MIN_STACK_SIZE, _EIATTR_REGCOUNT = 0x11, 0x12, 0x2F
_EIFMT_SVAL = 4  # an attribute with a 16-bit length and that many bytes


class CubinError(ValueError):
    """The bytes are not a cubin this reader understands."""


def resources(cubin: bytes) -> dict:
    """Function symbol -> {registers, local_bytes, stack_bytes, shared_bytes} per function
    with code in the cubin (kernels and device functions compiled apart)."""
    sections = _sections(cubin)
    names = _symbol_names(cubin, sections)
    functions = {s["name"].removeprefix(".text."): {"registers": 0, "local_bytes": 0,
                                                    "stack_bytes": 0, "shared_bytes": 0}
                 for s in sections if s["name"].startswith(".text.")}
    attributes = {_EIATTR_REGCOUNT: "registers", _EIATTR_FRAME_SIZE: "local_bytes",
                  _EIATTR_MIN_STACK_SIZE: "stack_bytes"}
    for section in sections:
        if section["name"] == ".nv.info":
            for attr, value in _info_entries(cubin, section):
                if attr in attributes and len(value) == 8:
                    symbol, number = struct.unpack("<II", value)
                    if names.get(symbol) in functions:
                        functions[names[symbol]][attributes[attr]] = number
        elif section["name"].startswith(".nv.shared."):
            name = section["name"].removeprefix(".nv.shared.")
            if name in functions:
                functions[name]["shared_bytes"] = section["size"]
    return functions


def _sections(data: bytes) -> list[dict]:
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise CubinError("not a 64-bit ELF cubin")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = raw[shstrndx][4]
    return [{"name": _string(data, strtab + r[0]), "type": r[1], "offset": r[4], "size": r[5],
             "link": r[6], "info": r[7]} for r in raw]


def _symbol_names(data: bytes, sections) -> dict:
    """Symbol index -> name, from .symtab."""
    symtab = next((s for s in sections if s["name"] == ".symtab"), None)
    if symtab is None:
        return {}
    strings = sections[symtab["link"]]["offset"]
    names = {}
    for index in range(symtab["size"] // 24):
        (name,) = struct.unpack_from("<I", data, symtab["offset"] + 24 * index)
        names[index] = _string(data, strings + name)
    return names


def _info_entries(data: bytes, section):
    position, end = section["offset"], section["offset"] + section["size"]
    while position + 4 <= end:
        fmt, attr = data[position], data[position + 1]
        if fmt == _EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", data, position + 2)
            yield attr, data[position + 4:position + 4 + size]
            position += 4 + size
        else:
            yield attr, data[position + 2:position + 4]
            position += 4


def _string(data: bytes, offset: int) -> str:
    return data[offset:data.index(b"\0", offset)].decode("ascii", "replace")


def disassemble(cubin: bytes) -> str:
    """The SASS of a cubin through nvdisasm; RuntimeError when nvdisasm is not installed."""
    tool = cuda_tool("nvdisasm")
    if tool is None:
        raise RuntimeError("nvdisasm is not installed (it comes with the CUDA toolkit, or "
                           "`pip install nvidia-cuda-nvdisasm`); --ptx and --resources "
                           "need nothing")
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        done = subprocess.run([tool, "-c", "-g", fh.name], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvdisasm failed: {done.stderr.strip()}")
    return done.stdout


def cuda_tool(name: str) -> str | None:
    """The path of a CUDA command-line tool: on PATH, else from NVIDIA's pip wheels."""
    return shutil.which(name) or _wheel_tool(name)


def _wheel_tool(name: str) -> str | None:
    """A CUDA tool from NVIDIA's pip wheels (nvidia/cu13/bin/...), which are not on PATH."""
    try:
        import nvidia
    except ImportError:
        return None
    from pathlib import Path

    for root in getattr(nvidia, "__path__", []):
        for found in sorted(Path(root).glob(f"*/bin/{name}")):
            return str(found)
    return None
