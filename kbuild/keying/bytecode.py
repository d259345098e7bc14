"""Bytecode fingerprints and the names bytecode reads: what numba compiles, by content.

A function's body is keyed by its normalized syntax tree and by the bytecode numba
compiles (`code_fingerprint`: no positions, local names or docstring), so source read
back from a file edited after import, or run with `python -O`, cannot pass for the
code that is compiled; a function without source is keyed by its code object
(`code_canonical`). The names its bytecode loads (`bytecode_chains`, `code_names`)
join the names its source reads (see `references`).
"""

from __future__ import annotations

import dis
import types as pytypes
from functools import lru_cache

from .encode import Unencodable, encode
from .values import canonical, cannot_key

_LOAD_NAME_OPS = frozenset({"LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME", "LOAD_CLASSDEREF"})
_LOAD_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


def code_names(code) -> set[tuple[str, ...]]:
    """Dotted names read by bytecode (a function without source): `helpers.typed` is
    followed through the module like in source, not keyed as the bare module."""
    names = set((n,) for n in code.co_freevars)
    chain = None
    for ins in dis.get_instructions(code):
        if ins.opname in _LOAD_NAME_OPS:
            chain = (ins.argval,)
        elif ins.opname in _LOAD_ATTR_OPS and chain is not None:
            chain += (ins.argval,)
        else:
            chain = None
            continue
        names.add(chain)
    for const in code.co_consts:
        if isinstance(const, pytypes.CodeType):
            names |= code_names(const)
    return names


def bytecode_chains(code) -> set[tuple[str, ...]]:
    """Dotted names that `code` (and the code nested in it) reads from its globals or its
    closure: its own locals and the cells it shares with nested functions are left out."""
    closure = frozenset(code.co_freevars)
    return {(chain[0],) + chain[2:] for chain in _bytecode_loads(code)
            if chain[1] == "g" or chain[0] in closure}


@lru_cache(maxsize=None)
def _bytecode_loads(code) -> frozenset:
    """(name, "g" | "d", attribute...) for every global or cell load chain in `code`, each
    as far as it goes (`a.b.c` gives only that, as the source's attribute chain does)."""
    found = set()
    chain = None
    for ins in dis.get_instructions(code):
        if ins.opname in _LOAD_ATTR_OPS and chain is not None:
            chain += (ins.argval,)
            continue
        if chain is not None:
            found.add(chain)
        chain = None
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            chain = (ins.argval, "g")
        elif ins.opname in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
            chain = (ins.argval, "d")
    if chain is not None:
        found.add(chain)
    for const in code.co_consts:
        if isinstance(const, pytypes.CodeType):
            found |= _bytecode_loads(const)
    return frozenset(found)


def code_canonical(code, where):
    """A code object by content, local names and positions included (no source to key)."""
    consts = tuple(_const_canonical(c, where, code_canonical) for c in code.co_consts)
    return ("code", code.co_code, consts, code.co_names, code.co_varnames,
            code.co_freevars, code.co_argcount, code.co_kwonlyargcount)


def code_fingerprint(code, where):
    """The instructions, minus what comments, formatting, docstrings, positions and local names change.

    Locals by slot number, constants by value (a docstring shifts their
    indices), names, comparisons and the like by their text; no line numbers. No NOPs
    either (what is left of a branch on a constant, for line tracing), so jumps go
    to instruction numbers, not offsets.
    """
    instructions = [ins for ins in dis.get_instructions(code) if ins.opname != "NOP"]
    number = {ins.offset: i for i, ins in enumerate(instructions)}
    ops = []
    for ins in instructions:
        if ins.opcode in dis.hasconst:
            # By index, not argval: dis cannot show some (3.11's KW_NAMES gives <unknown>).
            arg = _const_canonical(code.co_consts[ins.arg], where, code_fingerprint)
        elif ins.opcode in dis.hasname or ins.opcode in dis.hascompare:
            arg = ins.argrepr
        elif ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs:
            arg = ("to", _jump_target(number, ins.argval))
        else:
            arg = ins.arg
        ops.append((ins.opname, arg))
    return ("bytecode", tuple(ops), code.co_argcount, code.co_posonlyargcount,
            code.co_kwonlyargcount)


def _jump_target(number: dict, offset: int) -> int:
    """The number of the instruction at `offset`, or after it if that was a NOP."""
    while offset not in number and offset <= max(number, default=0):
        offset += 2
    return number.get(offset, len(number))


def _const_canonical(c, where, code_form):
    """A bytecode constant by content; sets in a hash-independent order."""
    if isinstance(c, pytypes.CodeType):
        return code_form(c, where)
    if c is Ellipsis:
        return ("Ellipsis",)
    if isinstance(c, frozenset):
        return ("frozenset", tuple(sorted((_const_canonical(x, where, code_form) for x in c),
                                          key=encode)))
    if isinstance(c, tuple):
        return ("tuple", tuple(_const_canonical(x, where, code_form) for x in c))
    try:
        return canonical(c)
    except Unencodable:
        cannot_key(where, f"a constant of type {type(c).__name__} in bytecode")
