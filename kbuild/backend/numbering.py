"""numba's function numbers made a function's own, for the length of one compile.

numba numbers every FunctionIdentity from a per-process count and mangles the number
into every symbol name (a function's, its environment's); it keeps what it compiled for
later kernels. A number from the order of compiles would put a process's history into a
kernel's bytes: here a keyed function's number comes from its identity (`stable_ids`),
another function's from what it is (its code, closure and defaults by content). One of
the patches `compiler._kbuild_patches` lists; the others are in `reproducible`.
"""

from __future__ import annotations

import contextlib
import types

from .reproducible import patched


@contextlib.contextmanager
def numbering(stable_ids: dict):
    """numba's FunctionIdentity numbers: from `stable_ids` where known, else from what the
    function is (`_content_number`: an `@overload`'s implementation, a helper compiled for
    a lowering), else 1, 2, ... per kernel. numba mangles the number into every symbol
    name (a function's, its environment's), and keeps what it compiled for later kernels:
    a number from the order of compiles would put a process's history into the bytes."""
    import itertools

    from numba.core import bytecode as core_bytecode
    from numba.cuda.core import bytecode as cuda_bytecode

    classes = [m.FunctionIdentity for m in (core_bytecode, cuda_bytecode)]
    issued = set()
    content: dict = {}  # id(function) -> (function, number or None), for this kernel

    def numbered(original):
        def from_function(cls, pyfunc):
            ident = original.__func__(cls, pyfunc)
            func = getattr(ident, "func", None)
            number = stable_ids.get(func)
            if number is not None and number in issued:
                number = None  # a keyed function's re-derived copy: numbered by content
            if number is not None:
                issued.add(number)
            else:
                # One number for every copy: copies compiled with other types or flags
                # differ in their mangled names, and equal ones are one function.
                number = _content_number(func, content)
            if number is not None:
                cls._unique_ids = itertools.count(ident.unique_id)  # hand the number back
                ident.unique_id = number
                ident.unique_name = f"{ident.func_qualname}${number}"
            return ident

        return classmethod(from_function)

    for cls in classes:
        cls._unique_ids = itertools.count(1)
    with patched(classes, "from_function", numbered):
        yield


def _content_number(func, memo: dict) -> int | None:
    """A number for a function from what it is: its qualified name, its code and what its
    closure cells and defaults hold, by content (the way a stable id comes from a keyed
    function's identity). None - numba's count then - for one that holds something with
    no content form: two such functions must never share a name."""
    if not isinstance(func, types.FunctionType):
        return None
    slot = id(func)  # this kernel's compile only; the function is kept with its number
    if slot not in memo:
        memo[slot] = (func, _number_of(func))
    return memo[slot][1]


def _number_of(func) -> int | None:
    from ..errors import KeyingError
    from ..keying.bytecode import code_fingerprint
    from ..keying.encode import Unencodable, digest_of

    # The code as keys see it (no positions, local names or docstring): an edit that
    # keeps a function's key keeps its number, and its bytes.
    try:
        form = ("function-number", func.__module__, func.__qualname__,
                code_fingerprint(func.__code__, func.__qualname__),
                tuple(_held_form(c.cell_contents, 0) for c in func.__closure__ or ()),
                tuple(_held_form(d, 0) for d in func.__defaults__ or ()))
        return int(digest_of(form)[:12], 16) + (1 << 48)
    except (Unencodable, KeyingError, ValueError, TypeError, RecursionError):
        return None


def _held_form(value, depth: int):
    """A captured value by content: numbers, strings, tuples, numpy values (`canonical`);
    functions by their own form; classes and modules by name; numba types by their name.
    Raises Unencodable for anything else."""
    from ..keying.encode import Unencodable
    from ..keying.values import canonical

    if depth > 8:
        raise Unencodable(value)
    if isinstance(value, types.FunctionType):
        from ..keying.bytecode import code_fingerprint

        return ("function", value.__module__, value.__qualname__,
                code_fingerprint(value.__code__, value.__qualname__),
                tuple(_held_form(c.cell_contents, depth + 1) for c in value.__closure__ or ()))
    py_func = getattr(value, "py_func", None)
    if isinstance(py_func, types.FunctionType) and hasattr(value, "targetoptions"):
        return ("dispatcher", _held_form(py_func, depth + 1),
                _held_form(sorted(dict(value.targetoptions).items()), depth + 1))
    if isinstance(value, type):
        return ("class", value.__module__, value.__qualname__)
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_held_form(v, depth + 1) for v in value))
    try:
        return ("value", canonical(value))
    except Unencodable:
        pass
    from numba.core.types import Type

    if isinstance(value, Type) and " at 0x" not in str(value):
        return ("type", type(value).__module__, type(value).__qualname__, str(value))
    raise Unencodable(value)
