"""keying/bytecode.py reads instructions itself on CPython 3.11 (`_decoded`): it must
give exactly what `dis` gives (`dis_instructions`) for every code object, or keys would
change with the reader. Compared over every function (and the code nested in it) that
numba, numba-cuda, numpy and kbuild define: tens of thousands of code objects, every
kind of instruction, extended arguments, jumps both ways, closures and comparisons."""

from __future__ import annotations

import sys
import types
import warnings

import pytest

from kbuild.keying import bytecode


def _corpus() -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import numba.cuda  # noqa: F401
        import numpy  # noqa: F401

        import kbuild.builder  # noqa: F401
        import kbuild.cli.project_cmds  # noqa: F401
    codes, seen = [], set()

    def walk(code):
        if id(code) in seen:
            return
        seen.add(id(code))
        codes.append(code)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const)

    for name in sorted(sys.modules):
        if name.partition(".")[0] not in ("numba", "numba_cuda", "numpy", "kbuild"):
            continue
        try:
            values = list(vars(sys.modules[name]).values())
        except TypeError:
            continue
        for value in values:
            members = [value]
            if isinstance(value, type):
                members += list(vars(value).values())
            for member in members:
                code = _code_of(member)
                if code is not None:
                    walk(code)
    return codes


def _code_of(obj):
    try:
        obj = getattr(obj, "__func__", obj)
        code = getattr(obj, "__code__", None)
    except Exception:  # noqa: BLE001 - numba's driver objects raise on any attribute
        return None
    return code if isinstance(code, types.CodeType) else None


def _compiled(code) -> bool:
    """Whether `code` is as Python's compiler makes it. Cython makes stand-ins for its
    functions' tracebacks whose bytes are all zero, which `dis` reads as a row of CACHE
    instructions; the compiler only ever puts CACHE units after the instruction they
    serve (and kbuild fingerprints only functions numba compiles: Python's own)."""
    import dis

    return not any(ins.opname == "CACHE" for ins in dis.get_instructions(code))


@pytest.mark.skipif(not bytecode._FAST, reason="the reader of its own is for CPython 3.11")
def test_the_reader_reads_what_dis_reads():
    codes = [code for code in _corpus() if _compiled(code)]
    assert len(codes) > 5000
    differ = [code for code in codes
              if tuple(bytecode._decoded(code)) != tuple(bytecode.dis_instructions(code))]
    assert not differ, [f"{c.co_filename}:{c.co_firstlineno} {c.co_qualname}" for c in differ[:5]]


def test_fingerprints_are_those_dis_gives():
    """The fingerprint and the load chains of a function with every kind of operand."""
    def sample(x, y=2.5, *, z=(1, "a")):
        total = 0
        for i in range(x):
            if i > y and i != 3:
                total += i * len(z)
            elif i is None:
                continue
            else:
                total -= abs(i)
        inner = lambda v: v + total  # noqa: E731
        return inner(total), math_like.sqrt, [k for k in z]

    math_like = types.SimpleNamespace(sqrt=None)
    code = sample.__code__
    assert bytecode.instructions(code) == tuple(bytecode.dis_instructions(code))


def _class_reading_a_cell():
    k = 2

    def f():
        class C:
            y = k  # a class body reads a cell: LOAD_CLASSDEREF, LOAD_FROM_DICT_OR_DEREF on 3.12+
        return C
    return f


def test_a_class_body_reading_a_closure_cell_is_a_load_on_every_python():
    code = _class_reading_a_cell().__code__
    assert ("k",) in bytecode.bytecode_chains(code)
    assert ("k",) in bytecode.code_names(code)
