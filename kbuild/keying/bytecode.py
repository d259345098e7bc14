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
import operator
import sys
import types as pytypes
from functools import lru_cache

from . import made
from .encode import Unencodable, encode
from .values import canonical, cannot_key

# A class body reads a cell with LOAD_CLASSDEREF up to 3.11, LOAD_FROM_DICT_OR_DEREF from
# 3.12 on (and an annotation scope a global with LOAD_FROM_DICT_OR_GLOBALS).
_GLOBAL_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"})
_CELL_LOADS = frozenset({"LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_FROM_DICT_OR_DEREF"})
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
    for chain, *_ in _chain_loads(instructions(code)):
        names.update(chain[:end] for end in range(1, len(chain) + 1))
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


_END = (None,) * 6  # stands after the last instruction: what consumes a chain loaded last


def _chain_loads(ins: tuple):
    """Each global or cell load chain in the instructions `ins` (of one code object, not
    the code nested in it), in order, as far as it goes (`a.b.c` gives only that, as the
    source's attribute chain does): (chain, "g" for a global | "d" for a cell, the index
    of its first load, its last load, the instruction that consumes it (`_END` after the
    last)). A chain is a load of a name, then every LOAD_ATTR / LOAD_METHOD on it."""
    chain = kind = start = last = None
    for index, one in enumerate(ins + (_END,)):
        name = one[OPNAME]
        if name in _LOAD_ATTR_OPS and chain is not None:
            chain, last = chain + (one[ARGVAL],), one
            continue
        if chain is not None:
            yield chain, kind, start, last, one
        chain = None
        if name in _GLOBAL_LOADS or name in _CELL_LOADS:
            kind = "g" if name in _GLOBAL_LOADS else "d"
            chain, start, last = (one[ARGVAL],), index, one


def _plain(load) -> bool:
    """A load of the value alone: "NULL + name" or a method load pushes a call's parts."""
    return load[ARGREPR] == load[ARGVAL]


def _nested_chains(code) -> set:
    """The chains (as `bytecode_chains` gives them) of the code nested in `code`."""
    return {(c[0],) + c[2:] for const in code.co_consts if isinstance(const, pytypes.CodeType)
            for c in _bytecode_loads(const)}


@lru_cache(maxsize=None)
def _bytecode_loads(code) -> frozenset:
    """(name, "g" | "d", attribute...) for every global or cell load chain in `code` and
    the code nested in it (see `_chain_loads`)."""
    found = {(chain[0], kind) + chain[1:] for chain, kind, *_ in _chain_loads(instructions(code))}
    for const in code.co_consts:
        if isinstance(const, pytypes.CodeType):
            found |= _bytecode_loads(const)
    return frozenset(found)


def code_canonical(code, where):
    """A code object by content, local names and positions included (no source to key)."""
    consts = tuple(_const_canonical(c, where, code_canonical) for c in code.co_consts)
    return ("code", code.co_code, consts, code.co_names, code.co_varnames,
            code.co_freevars, code.co_argcount, code.co_kwonlyargcount)


def code_fingerprint(code, where, elided: frozenset = frozenset()):
    """The instructions, minus what comments, formatting, docstrings, positions and local names change.

    Locals by slot number, constants by value (a docstring shifts their
    indices), names, comparisons and the like by their text; no line numbers. No NOPs
    either (what is left of a branch on a constant, for line tracing), so jumps go
    to instruction numbers, not offsets. A nested code object in `elided` by its name
    and arguments only (`returned_functions`).
    """
    kept = [ins for ins in instructions(code) if ins[OPNAME] != "NOP"]
    number = {ins[OFFSET]: i for i, ins in enumerate(kept)}
    ops = []
    for name, opcode, oparg, argval, argrepr, _ in kept:
        if opcode in _HASCONST and any(code.co_consts[oparg] is c for c in elided):
            nested = code.co_consts[oparg]
            arg = ("elided", nested.co_name, nested.co_argcount, nested.co_posonlyargcount,
                   nested.co_kwonlyargcount, nested.co_varnames[:nested.co_argcount],
                   nested.co_freevars)
        elif opcode in _HASCONST:
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


# -- branches numba prunes before typing --------------------------------------------------
#
# numba's dead-branch pruning (`dead_branch_prune`, run before typing) replaces a branch
# whose predicate is `bool(g)` of a frozen global `g` by a jump: the branch not taken is
# never typed, so what only it reads (a debugging device function under `if DEBUG:`) is
# not compiled into the kernel. Its interpreter makes that predicate of exactly one
# bytecode form: a global loaded and tested by a conditional jump (3.13's TO_BOOL
# between them is a copy to numba).

_JUMP_IF_TRUE = frozenset({"POP_JUMP_IF_TRUE", "POP_JUMP_FORWARD_IF_TRUE",
                           "POP_JUMP_BACKWARD_IF_TRUE"})
_JUMP_IF_FALSE = frozenset({"POP_JUMP_IF_FALSE", "POP_JUMP_FORWARD_IF_FALSE",
                            "POP_JUMP_BACKWARD_IF_FALSE"})
# 3.11's and later `if x is None:` (numba: `bool(x is not None)`, so the same prune).
_JUMP_IF_NONE = frozenset({"POP_JUMP_IF_NONE", "POP_JUMP_FORWARD_IF_NONE",
                           "POP_JUMP_BACKWARD_IF_NONE"})
_JUMP_IF_NOT_NONE = frozenset({"POP_JUMP_IF_NOT_NONE", "POP_JUMP_FORWARD_IF_NOT_NONE",
                               "POP_JUMP_BACKWARD_IF_NOT_NONE"})
_CONDITIONAL = _JUMP_IF_TRUE | _JUMP_IF_FALSE | _JUMP_IF_NONE | _JUMP_IF_NOT_NONE
_IS_NONE = "is None"
# Instructions after which the next one is not run. Any other is taken to fall through:
# treating too many as falling through only keeps more code live.
_NO_FALLTHROUGH = frozenset({"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE",
                             "JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_ABSOLUTE", "JUMP",
                             "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_NO_INTERRUPT"})
# The values a prune decides by: plain values, compared by exact type.
_PRUNED_ON = (bool, int, float, str, type(None))
# How numba's interpreter makes each comparison a binop (`dead_branch_prune` runs its
# `fn` on the two constant operands).
_COMPARED = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
             ">": operator.gt, ">=": operator.ge}
_NOT_A_CONSTANT = object()


@lru_cache(maxsize=None)
def _constant_tests(code) -> tuple:
    """(index of the jump, its operands, the comparison or None, whether it jumps when
    true) for every conditional jump numba's `dead_branch_prune` can decide: on one
    operand (`bool(g)`, `g is None`) or on a comparison of two, each loaded just before
    by one instruction no other jump lands on (so its value came only from that load): a
    global the code never sets, a free variable, a constant, or a local stored once, from
    one of those (numba follows a name's single definition). An operand is ("global" |
    "free", name) or ("const", index). () for code with exception handlers (their
    entries are in a table, not in jumps: nothing is pruned there)."""
    if getattr(code, "co_exceptiontable", b""):
        return ()
    found, ins = [], instructions(code)
    landed = {i[ARGVAL] for i in ins if i[OPCODE] in _JUMPS}
    # A global the code itself sets (Python running it at typing time) may not hold then
    # what it held when keyed; a cell the code sets is no constant either.
    stored = {i[ARGVAL] for i in ins if i[OPNAME] in ("STORE_GLOBAL", "DELETE_GLOBAL")}
    cells = {i[ARGVAL] for i in ins if i[OPNAME] in ("STORE_DEREF", "DELETE_DEREF")}
    free = frozenset(code.co_freevars) - cells
    once = _locals_stored_once(code, ins) if not _INTROSPECTION & set(code.co_names) else {}

    def operand(at, local=True):
        one = ins[at] if at >= 0 else None
        if one is None or one[OFFSET] in landed:
            return None
        if local and one[OPNAME] in ("LOAD_FAST", "LOAD_FAST_CHECK") and one[ARGVAL] in once:
            store = once[one[ARGVAL]]
            return None if ins[store][OFFSET] in landed else operand(store - 1, False)
        if one[OPNAME] == "LOAD_GLOBAL" and one[ARGREPR] == one[ARGVAL] \
                and one[ARGVAL] not in stored:  # "NULL + name": a call follows
            return ("global", one[ARGVAL])
        if one[OPNAME] == "LOAD_DEREF" and one[ARGVAL] in free:
            return ("free", one[ARGVAL])
        if one[OPCODE] in _HASCONST:
            return ("const", one[ARG])
        return None

    for index, jump in enumerate(ins):
        if jump[OPNAME] not in _CONDITIONAL:
            continue
        if jump[OPNAME] in _JUMP_IF_NONE or jump[OPNAME] in _JUMP_IF_NOT_NONE:
            found_operand = None if jump[OFFSET] in landed else operand(index - 1)
            if found_operand is not None:
                found.append((index, (found_operand,), _IS_NONE, jump[OPNAME] in _JUMP_IF_NONE))
            continue
        test = index - 1
        if test >= 0 and ins[test][OPNAME] == "TO_BOOL":
            test -= 1
        if test < 0 or jump[OFFSET] in landed or ins[test + 1][OFFSET] in landed:
            continue
        compared = _comparison(ins[test])
        if compared is None:
            operands = (operand(test),)
        elif ins[test][OFFSET] in landed:
            continue
        else:
            operands = (operand(test - 2), operand(test - 1))
        if None not in operands:
            found.append((index, operands, compared, jump[OPNAME] in _JUMP_IF_TRUE))
    return tuple(found)


_PLAIN_LOCAL_READS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST"})


def _locals_stored_once(code, ins: tuple) -> dict:
    """Local (not an argument) -> the index of its only store, for each local stored by
    exactly one plain STORE_FAST and written no other way."""
    nargs = code.co_argcount + code.co_kwonlyargcount \
        + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    arguments = set(code.co_varnames[:nargs])
    stores: dict = {}
    for index, one in enumerate(ins):
        # Every instruction on a local but a plain read writes it (3.12's
        # LOAD_FAST_AND_CLEAR too).
        if one[OPCODE] in _HASLOCAL and one[OPNAME] not in _PLAIN_LOCAL_READS \
                or one[OPNAME] == "STORE_FAST_LOAD_FAST":
            names = one[ARGVAL] if isinstance(one[ARGVAL], tuple) else (one[ARGVAL],)
            for name in names:
                stores.setdefault(name, []).append(
                    index if one[OPNAME] == "STORE_FAST" else None)
    return {name: found[0] for name, found in stores.items()
            if len(found) == 1 and found[0] is not None and name not in arguments}


def _comparison(one):
    """The operator of a comparison instruction numba prunes on (3.13's COMPARE_OP may
    carry a bool coercion: its text is still the operator), else None."""
    if one[OPNAME] == "COMPARE_OP":
        return _COMPARED.get(str(one[ARGREPR]).replace("bool(", "").rstrip(")"))
    if one[OPNAME] == "IS_OP":
        return operator.is_not if one[ARG] else operator.is_
    return None


def _operand_value(code, operand, scope: dict, closure: dict):
    kind, what = operand
    if kind == "const":
        value = code.co_consts[what]
    elif kind == "global":
        value = scope.get(what, _NOT_A_CONSTANT)
    else:
        try:
            cell = closure[what]
            value = made.item(cell, "contents", cell.cell_contents)  # a compile's: unset
        except (KeyError, ValueError):  # no such cell, or an empty one
            return _NOT_A_CONSTANT
    return value if type(value) in _PRUNED_ON else _NOT_A_CONSTANT


def _decided(code, scope: dict, closure: dict) -> dict:
    """Index of a conditional jump -> whether it is taken, for each numba prunes given
    the values now (the globals in `scope`, the cells in `closure`)."""
    decided = {}
    for index, operands, compared, when_true in _constant_tests(code):
        values = [_operand_value(code, one, scope, closure) for one in operands]
        if any(v is _NOT_A_CONSTANT for v in values):
            continue
        try:
            if compared is _IS_NONE:
                truth = values[0] is None
            else:
                truth = bool(values[0]) if compared is None else bool(compared(*values))
        except TypeError:  # `1 < "a"`: numba does not prune what cannot be compared
            continue
        decided[index] = truth == when_true
    return decided


def pruned_chains(code, scope: dict, closure: dict | None = None) -> frozenset:
    """The global load chains (as `bytecode_chains` gives them) that `code` reads only in
    branches numba prunes, given the globals `scope` and the cells `closure` (free
    variable name -> cell) hold now: none of its reachable instructions and no code
    nested in it reads them. The values a pruned test reads are reachable (so keyed by
    value: changing one brings the branch back)."""
    decided = _decided(code, scope, closure or {})
    if not decided:
        return frozenset()
    ins = instructions(code)
    reached = _reachable(ins, decided)
    if reached is None:
        return frozenset()
    live, dead = _nested_chains(code), set()
    for chain, _, start, _, _ in _chain_loads(ins):
        (live if start in reached else dead).add(chain)
    return frozenset(dead - live)


def _reachable(ins: tuple, decided: dict) -> set | None:
    """Indexes of the instructions reached from the first, a decided jump going one way;
    None where a jump lands on no instruction (code this reader does not follow)."""
    index_of = {one[OFFSET]: i for i, one in enumerate(ins)}
    seen, todo = set(), [0]
    while todo:
        i = todo.pop()
        if i in seen or i >= len(ins):
            continue
        seen.add(i)
        one = ins[i]
        jumps = one[OPCODE] in _JUMPS
        taken = decided.get(i)
        if jumps and taken is not False:
            if one[ARGVAL] not in index_of:
                return None
            todo.append(index_of[one[ARGVAL]])
        if one[OPNAME] not in _NO_FALLTHROUGH and taken is not True:
            todo.append(i + 1)
    return seen



# -- implementations an overload's selector only makes and returns -----------------------
#
# An `@overload` function (the selector) runs at typing time and returns the
# implementation numba compiles, often one of several nested ones chosen by the argument
# types. A nested function the selector only makes and returns is never run by it: what
# it holds is what numba compiles when it is chosen, and the compile observes that one
# (backend/observe/). Any other use of it (a call, a decorator, a closure capturing it,
# a container, the frame's locals) keeps it part of the selector.

_RETURNED_LOADS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK"})
_MADE_TAIL = frozenset({"SET_FUNCTION_ATTRIBUTE"})  # 3.13: closure, defaults set after
_INTROSPECTION = frozenset({"locals", "vars", "eval", "exec", "_getframe", "currentframe",
                            "f_locals"})
_HASLOCAL = frozenset(dis.haslocal)


def returned_functions(code) -> frozenset:
    """The nested code objects `code` only makes into functions (stored in a local of its
    own) and returns: every store of that local is such a function, every read of it is
    `return NAME`. Those of `code` itself, compared by identity: not remembered, since a
    cache looks code up by equality and would hand back another module's equal objects."""
    if _INTROSPECTION & set(code.co_names):
        return frozenset()
    ins = instructions(code)
    made: dict = {}  # local -> the nested code objects made into it
    other: set = set()  # locals used any other way
    for index, one in enumerate(ins):
        if one[OPCODE] not in _HASLOCAL:
            continue
        names = one[ARGVAL] if isinstance(one[ARGVAL], tuple) else (one[ARGVAL],)
        if len(names) == 1 and one[OPNAME] in _RETURNED_LOADS and index + 1 < len(ins) \
                and ins[index + 1][OPNAME] == "RETURN_VALUE":
            continue
        nested = _made_into(code, ins, index) if len(names) == 1 else None
        if nested is not None:
            made.setdefault(names[0], []).append(nested)
            continue
        other.update(names)
    loads = [code.co_consts[one[ARG]] for one in ins if one[OPCODE] in _HASCONST
             and isinstance(code.co_consts[one[ARG]], pytypes.CodeType)]
    found = [c for name, codes in made.items() if name not in other for c in codes]
    # Each made exactly once: a code object loaded elsewhere too is used otherwise.
    return frozenset(c for c in found if sum(1 for x in loads if x is c) == 1)


def _made_into(code, ins: tuple, index: int):
    """The nested code object that instruction `index` stores as a function just made
    from it (LOAD_CONST code, MAKE_FUNCTION, STORE_FAST), or None."""
    if ins[index][OPNAME] != "STORE_FAST":
        return None
    before = index - 1
    while before >= 0 and ins[before][OPNAME] in _MADE_TAIL:
        before -= 1
    if before < 1 or ins[before][OPNAME] != "MAKE_FUNCTION":
        return None
    for loaded in ins[before - 1], ins[before - 2] if before >= 2 else None:
        # Python 3.10 loads the qualified name between the code and MAKE_FUNCTION.
        if loaded is None or loaded[OPCODE] not in _HASCONST:
            return None
        found = code.co_consts[loaded[ARG]]
        if isinstance(found, pytypes.CodeType):
            return found
        if not (isinstance(found, str) and sys.version_info < (3, 11)):
            return None
    return None


# -- names read and thrown away ------------------------------------------------------------
#
# A device function read but never called (`trace` as a statement, `t = trace` with `t`
# never read again) is typed by numba as the value it is, never compiled: what the kernel
# gets of it is that it is a device function, not its body.

_LOCAL_LOADS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR",
                          "LOAD_FAST_LOAD_FAST", "LOAD_CLOSURE"})


@lru_cache(maxsize=None)
def discarded_chains(code) -> frozenset:
    """The global and cell load chains (as `bytecode_chains` gives them) whose every load
    in `code` is thrown away (popped, or stored in a local never read) and which no code
    nested in it reads."""
    ins = instructions(code)
    if _INTROSPECTION & set(code.co_names):
        return frozenset()
    read = set()
    for one in ins:
        if one[OPNAME] in _LOCAL_LOADS or one[OPNAME] == "STORE_FAST_LOAD_FAST":
            read.update(one[ARGVAL] if isinstance(one[ARGVAL], tuple) else (one[ARGVAL],))
    kept, thrown = _nested_chains(code), set()
    for chain, _, _, last, then in _chain_loads(ins):
        dropped = then[OPNAME] == "POP_TOP" or (then[OPNAME] == "STORE_FAST"
                                                and then[ARGVAL] not in read)
        (thrown if _plain(last) and dropped else kept).add(chain)
    return frozenset(thrown - kept)


def loaded_bases(code) -> frozenset:
    """The global and cell names `code` (or code nested in it) loads at all."""
    return frozenset(chain[0] for chain in _bytecode_loads(code))


@lru_cache(maxsize=None)
def returned_globals(code) -> frozenset:
    """The global load chains (as `bytecode_chains` gives them) that `code` only returns:
    every load of the chain is returned at once (an overload's selector handing numba an
    implementation defined elsewhere), and no code nested in it reads it."""
    ins = instructions(code)
    if _INTROSPECTION & set(code.co_names):
        return frozenset()
    kept, returned = _nested_chains(code), set()
    for chain, _, _, last, then in _chain_loads(ins):
        (returned if _plain(last) and then[OPNAME] == "RETURN_VALUE" else kept).add(chain)
    return frozenset(returned - kept)


def nested_code(code, path: str):
    """The code object of the function `path` names inside the one `code` is (`inner`,
    or `inner.<locals>.deeper`, as a qualified name goes on past `.<locals>.`), or None
    where no such function, or more than one, is defined there."""
    for part in path.split(".<locals>."):
        found = [c for c in code.co_consts
                 if isinstance(c, pytypes.CodeType) and c.co_name == part]
        if len(found) != 1:
            return None
        code = found[0]
    return code


def parameters_form(code) -> tuple:
    """A function's parameters as a call binds them: their names in order, and how many
    are positional-only, positional and keyword-only, and whether `*args` and `**kw`
    take the rest."""
    flags = code.co_flags
    star, stars = bool(flags & _CO_VARARGS), bool(flags & _CO_VARKEYWORDS)
    count = code.co_argcount + code.co_kwonlyargcount + star + stars
    return ("parameters", tuple(code.co_varnames[:count]), code.co_posonlyargcount,
            code.co_argcount, code.co_kwonlyargcount, star, stars)


_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08  # inspect.CO_VARARGS, inspect.CO_VARKEYWORDS
