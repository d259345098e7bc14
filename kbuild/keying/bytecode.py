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
import sys
import types as pytypes
from functools import lru_cache

from .encode import Unencodable, encode
from .values import canonical, cannot_key

# A class body reads a cell with LOAD_CLASSDEREF up to 3.11, LOAD_FROM_DICT_OR_DEREF from
# 3.12 on (and an annotation scope a global with LOAD_FROM_DICT_OR_GLOBALS).
_GLOBAL_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"})
_CELL_LOADS = frozenset({"LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_FROM_DICT_OR_DEREF"})
_LOAD_NAME_OPS = _GLOBAL_LOADS | _CELL_LOADS
_LOAD_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


# -- reading instructions ------------------------------------------------------------------
#
# `dis.get_instructions` builds a named tuple per instruction with every field worked
# out (positions, line starts, jump labels, a repr of every argument): most of keying's
# time on a project of many kernels went there, twice per function (its fingerprint and
# its load chains). Keying reads an instruction's name, opcode, argument and offset, and
# the argument's value only where it is a name, a cell, a comparison or a jump target:
# `instructions` reads those once per code object. On the Python whose bytecode layout
# it knows (3.11) it decodes them itself, exactly as `dis` does
# (tests/test_bytecode_reader.py compares the two over every function numba, numpy and
# kbuild define); elsewhere it takes them from `dis`.


# An instruction: (opname, opcode, arg, argval, argrepr, offset); argval and argrepr as
# `dis` gives them for names, cells, comparisons and jumps, else (arg, "").
OPNAME, OPCODE, ARG, ARGVAL, ARGREPR, OFFSET = range(6)


@lru_cache(maxsize=None)
def instructions(code) -> tuple:
    """The instructions of `code` (not of the code nested in it)."""
    return tuple(_decoded(code) if _FAST else dis_instructions(code))


_READ = set(dis.hasname) | set(dis.hasjrel) | set(dis.hasjabs) | set(dis.hascompare) \
    | set(dis.haslocal) | set(dis.hasfree)


def dis_instructions(code):
    """The instructions as `dis` reads them: the reference `_decoded` must equal."""
    for ins in dis.get_instructions(code):
        kept = ins.arg is not None and ins.opcode in _READ
        yield (ins.opname, ins.opcode, ins.arg, ins.argval if kept else ins.arg,
               ins.argrepr if kept else "", ins.offset)


_FAST = sys.version_info[:2] == (3, 11) and dis.opmap.get("CACHE") == 0
if _FAST:
    _HASNAME, _HASJREL, _HASJABS = set(dis.hasname), set(dis.hasjrel), set(dis.hasjabs)
    _HASCOMPARE, _HASCELL = set(dis.hascompare), set(dis.haslocal) | set(dis.hasfree)
    _LOAD_GLOBAL, _EXTENDED_ARG, _CACHE = dis.opmap["LOAD_GLOBAL"], dis.EXTENDED_ARG, 0
    _BACKWARD = {op for op, name in enumerate(dis.opname) if "JUMP_BACKWARD" in name}


def _decoded(code):
    """`dis_instructions(code)` for code CPython 3.11 compiled, read as `dis` reads it:
    `co_code` holds no specialized instruction and its inline caches are CACHE units,
    which only ever follow the instruction they serve (skipped: they change no extended
    argument); an extended argument is a signed C int; a cell's name is its index into
    the locals, then the cells that are no argument, then the free variables."""
    names, raw, have_argument = code.co_names, code.co_code, dis.HAVE_ARGUMENT
    cells = None
    out, extended = [], 0
    for offset in range(0, len(raw), 2):
        op = raw[offset]
        if op == _CACHE:
            continue
        if op >= have_argument:
            arg = raw[offset + 1] | extended
            extended = (arg << 8) if op == _EXTENDED_ARG else 0
            if extended >= 1 << 31:
                extended -= 1 << 32
        else:
            arg, extended = None, 0
        argval, argrepr = arg, ""
        if arg is not None:
            if op in _HASNAME:
                if op == _LOAD_GLOBAL:
                    argval = names[arg // 2]
                    argrepr = "NULL + " + argval if arg & 1 else argval
                else:
                    argval = argrepr = names[arg]
            elif op in _HASJABS:
                argval = arg * 2
                argrepr = "to " + repr(argval)
            elif op in _HASJREL:
                argval = offset + 2 + (-arg if op in _BACKWARD else arg) * 2
                argrepr = "to " + repr(argval)
            elif op in _HASCELL:
                if cells is None:
                    cells = code.co_varnames + tuple(
                        c for c in code.co_cellvars if c not in code.co_varnames) \
                        + code.co_freevars
                argval = argrepr = cells[arg]
            elif op in _HASCOMPARE:
                argval = argrepr = dis.cmp_op[arg]
        out.append((dis.opname[op], op, arg, argval, argrepr, offset))
    return out


def code_names(code) -> set[tuple[str, ...]]:
    """Dotted names read by bytecode (a function without source): `helpers.typed` is
    followed through the module like in source, not keyed as the bare module."""
    names = set((n,) for n in code.co_freevars)
    chain = None
    for ins in instructions(code):
        if ins[OPNAME] in _LOAD_NAME_OPS:
            chain = (ins[ARGVAL],)
        elif ins[OPNAME] in _LOAD_ATTR_OPS and chain is not None:
            chain += (ins[ARGVAL],)
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
    for ins in instructions(code):
        name = ins[OPNAME]
        if name in _LOAD_ATTR_OPS and chain is not None:
            chain += (ins[ARGVAL],)
            continue
        if chain is not None:
            found.add(chain)
        chain = None
        if name in _GLOBAL_LOADS:
            chain = (ins[ARGVAL], "g")
        elif name in _CELL_LOADS:
            chain = (ins[ARGVAL], "d")
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
    kept = [ins for ins in instructions(code) if ins[OPNAME] != "NOP"]
    number = {ins[OFFSET]: i for i, ins in enumerate(kept)}
    ops = []
    for name, opcode, oparg, argval, argrepr, _ in kept:
        if opcode in _HASCONST:
            # By index, not argval: dis cannot show some (3.11's KW_NAMES gives <unknown>).
            arg = _const_canonical(code.co_consts[oparg], where, code_fingerprint)
        elif opcode in _NAME_OR_COMPARE:
            arg = argrepr
        elif opcode in _JUMPS:
            arg = ("to", _jump_target(number, argval))
        else:
            arg = oparg
        ops.append((name, arg))
    return ("bytecode", tuple(ops), code.co_argcount, code.co_posonlyargcount,
            code.co_kwonlyargcount)


_HASCONST = frozenset(dis.hasconst)
_NAME_OR_COMPARE = frozenset(dis.hasname) | frozenset(dis.hascompare)
_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)


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
