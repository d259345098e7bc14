"""Every form a kernel's inputs take is keyed, and only what numba compiles (issue #14).

The many small cases key two versions of one module in this process: `DIFFER`
must change the key; `SAME` must not, and both of its versions are compiled to
prove that numba makes identical PTX and cubin from them. What a
user sees runs the real CLI: source encodings, one unkeyable target among good
ones, and keying facts tampered with in the store.
"""

from __future__ import annotations

import builtins
import itertools
import json
import os
import sys
import textwrap

import numba
import pytest

from editmatrix_support import load_module, run_kbuild, target_key, with_status
from support import run_kbuild_in_process  # noqa: F401 - its kbuild commands run in process

F32 = numba.float32[::1]
_names = itertools.count()


def _keys(tmp_path, versions, kernel="k", before=None, compile=False):
    """The key of `kernel` in each version of one module (same module name, same file name);
    `before(i)` runs before version i is imported. With `compile`, (key, PTX, cubin), the
    version's folder named alike in both (a lineinfo or debug binary names its file)."""
    from kbuild.backend.backends import DEFAULT, get

    backend = get(DEFAULT)  # numba-cuda, through the interface the build uses

    name = f"kbuild_forms_{next(_names)}"
    keys = []
    try:
        for i, source in enumerate(versions):
            if before is not None:
                before(i)
            folder = tmp_path / f"v{i}"
            folder.mkdir(parents=True)
            path = folder / f"{name}.py"
            path.write_text(textwrap.dedent(source))
            with backend.targeting((8, 0)):  # an explicit signature compiles at import
                module = load_module(path, name)
            found = getattr(module, kernel)
            key = target_key(found, f"{name}:{kernel}", [F32], [folder]).digest
            if compile:
                made = backend.compile(found, [F32], (8, 0))
                key = (key, *(b.replace(str(folder).encode(), b"<folder>")
                              for b in (made.ptx, made.cubin)))
            keys.append(key)
    finally:
        sys.modules.pop(name, None)
    return keys


_HEAD = "import struct\nfrom numba import cuda\nfrom numba.extending import overload\n"
_NAN = "struct.unpack('<d', struct.pack('<Q', {:#x}))[0]"


def _kernel(body: str, decorator: str = "@cuda.jit", args: str = "x") -> str:
    return f"{decorator}\ndef k({args}):\n    {body}\n"


_DEV_TUPLE = """
@cuda.jit(device=True)
def sq(x):
    return x * x


@cuda.jit(device=True)
def cube(x):
    return x * x * {power}


OPS = (sq, cube)
OPS_LIST = [sq, cube]
OPS_DICT = {{"sq": sq, "cube": cube}}
"""

_OVERLOAD_DICT = """
TABLE = {{"gain": {gain}, "bias": 1.0}}


def scaled(v):
    pass


@overload(scaled, target="cuda")
def _scaled(v):
    gain = TABLE["gain"]

    def impl(v):
        return v * gain
    return impl
"""

# How an overload is registered changes what numba compiles (`strict` decides whether a
# mismatched signature is an error; `inline`, `jit_options` change the code).
_OVERLOAD_OPTION = """
def scaled(v):
    pass


@overload(scaled, target="cuda", {option})
def _scaled(v):
    def impl(v):
        return v * 2.0
    return impl
"""

_CLASS_READ_BY_OVERLOAD = """
class Base:
    GAIN = {base}


class Cfg(Base):
    OTHER = {other}  # {comment}


def scaled(v):
    pass


@overload(scaled, target="cuda")
def _scaled(v):
    gain = Cfg.GAIN{bare}

    def impl(v):
        return v * gain
    return impl
"""
_CLS = {"base": 2.0, "other": 1, "comment": "", "bare": ""}
_CLS_BARE = dict(_CLS, bare=" if isinstance(Cfg, type) else 0.0")

_EXPLICIT_SIG = """
@cuda.jit("float32(float32)", device=True)
def dev(x):
    return x * {factor}
"""

# numba prunes a branch on a global's plain value before typing (`trace` is never compiled).
_PRUNED = """
DEBUG = {debug}


@cuda.jit(device=True)
def trace(v):
    return v * {factor}
"""

# An overload's selector and the nested implementations it makes: `{use}` decides how the
# unselected `impl_int` is used (only returned; or called, decorated, captured, stored).
_SELECTOR = """
from numba.core import types

KEPT = []


def pick(v):
    pass


@overload(pick, target="cuda")
def _pick(v):
    if isinstance(v, types.Float):
        def impl_float(v):
            return v * 2.0
        return impl_float

    def impl_int(v):
        return v + {step}
{use}
    return impl_int
"""
_RETURNED = {"step": 1, "use": ""}

# A kernel made by a factory: numba prunes a branch on a closure variable's value too.
_CLOSURE_FLAG = """
@cuda.jit(device=True)
def trace(v):
    return v * {factor}


def make(debug):
    @cuda.jit
    def k(x):
        if debug:
            x[0] = trace(x[0])
        x[1] = 1.0
    return k


k = make({debug})
"""

_LAMBDAS = ("F, G = cuda.jit(device=True)(lambda x: x + 1.0), "
            "cuda.jit(device=True)(lambda x: x * {g})\n")

_KEYWORD_CALLEE = """
@cuda.jit(device=True)
def dev({args}):
    return {expr}
"""

# Functions that share a qualified name (closures of one factory, lambdas) held in one
# container: each is keyed by its place, so which one sits where is part of the key.
_SAME_NAMED = """
def make(s):
    @cuda.jit(device=True)
    def g(v):
        return v * s
    return g


FUNCS = (make({a}), make({b}))
SET = frozenset((make({a}), make(4.0)))
IMPLS = {{"a": lambda v: v * {a}, "b": lambda v: v * {b}}}


def pick(v):
    pass


@overload(pick, target="cuda")
def _pick(v):
    return IMPLS["a"]


def held(v):
    pass


held.impls = (make({a}), make({b}))


@overload(held, target="cuda")
def _held(v):
    first = held.impls[0]
    return lambda v: first(v)
"""

# An implementation a selector returns by a global's name is observed when numba compiles
# it, by its own name; one that its name does not find is keyed with the selector.
_RETURNED_GLOBAL = """
def make(s):
    def impl(v):
        return v * s
    return impl


MADE = make({a})
FAST, SLOW = lambda v: v * {a}, lambda v: v * {b}


def pick(v):
    pass


@overload(pick, target="cuda")
def _pick(v):
    if v.bitwidth == 32:
        return {returned}
    return SLOW
"""


def _pair(template: str, old, new, kernel: str) -> tuple[str, str]:
    return (_HEAD + template.format(**old) + "\n\n" + kernel,
            _HEAD + template.format(**new) + "\n\n" + kernel)


# (id, version 1, version 2): the key must change.
DIFFER = [
    ("nan-payload", *(_HEAD + f"C = {_NAN.format(bits)}\n\n" + _kernel("x[0] = C")
                      for bits in (0x7FF8000000000001, 0x7FF8000000000002))),
    ("nan-sign", *(_HEAD + f"C = {_NAN.format(bits)}\n\n" + _kernel("x[0] = C")
                   for bits in (0x7FF8000000000000, 0xFFF8000000000000))),
    ("negative-zero", *(_HEAD + f"C = {c}\n\n" + _kernel("x[0] = x[0] * C")
                        for c in ("0.0", "-0.0"))),
    # numba types a bytes constant as a read-only bytes array, numpy's bytes_ as a CharSeq
    ("bytes-vs-numpy-bytes", *(_HEAD + f"import numpy as np\nC = {c}\n\n" + _kernel("x[0] = len(C)")
                               for c in ("b'ab'", "np.bytes_(b'ab')"))),
    ("fastmath-set", *(_HEAD + _kernel("x[0] = x[0] / x[1]", f"@cuda.jit(fastmath={fm})")
                       for fm in ("{'contract'}", "{'contract', 'arcp'}"))),
    ("device-function-in-tuple", *_pair(_DEV_TUPLE, {"power": "x"}, {"power": "2.0"},
                                        _kernel("x[0] = OPS[1](x[0])"))),
    ("device-function-in-list", *_pair(_DEV_TUPLE, {"power": "x"}, {"power": "2.0"},
                                       _kernel("x[0] = OPS_LIST[1](x[0])"))),
    ("device-function-in-dict", *_pair(_DEV_TUPLE, {"power": "x"}, {"power": "2.0"},
                                       _kernel("x[0] = OPS_DICT['cube'](x[0])"))),
    *((f"same-named-functions-{name}", *_pair(_SAME_NAMED, {"a": 2.0, "b": 3.0},
                                                {"a": 3.0, "b": 2.0}, _kernel(body)))
      for name, body in (("in-a-tuple-swapped", "x[0] = FUNCS[0](x[0])"),
                         ("in-a-dict-swapped", "x[0] = pick(x[0])"),
                         ("in-an-attribute-swapped", "x[0] = held(x[0])"),
                         ("in-a-set-one-changed", "x[0] = len(SET)"))),
    *((f"returned-{name}", *_pair(_RETURNED_GLOBAL, dict(values[0], returned=returned),
                                  dict(values[1], returned=returned),
                                  _kernel("x[0] = pick(x[0])")))
      for name, returned, values in (
          ("closure-made-at-import", "MADE", ({"a": 2.0, "b": 5.0}, {"a": 3.0, "b": 5.0})),
          ("lambdas-swapped", "FAST", ({"a": 2.0, "b": 5.0}, {"a": 5.0, "b": 2.0})))),
    ("dict-read-by-an-overload", *_pair(_OVERLOAD_DICT, {"gain": 2.0}, {"gain": 3.0},
                                        _kernel("x[0] = scaled(x[0])"))),
    *((f"overload-{name}", *_pair(_OVERLOAD_OPTION, {"option": one}, {"option": two},
                                  _kernel("x[0] = scaled(x[0])")))
      for name, one, two in (("strict", "strict=True", "strict=False"),
                             ("inline", "inline='never'", "inline='always'"),
                             ("jit-options", "jit_options={'fastmath': False}",
                              "jit_options={'fastmath': True}"))),
    ("class-attribute-read-by-an-overload", *_pair(_CLASS_READ_BY_OVERLOAD, _CLS,
                                                   dict(_CLS, base=3.0),
                                                   _kernel("x[0] = scaled(x[0])"))),
    # Read bare as well (`isinstance(v, Cfg)`): the whole class counts.
    ("other-attribute-of-a-class-also-read-bare",
     *_pair(_CLASS_READ_BY_OVERLOAD, _CLS_BARE, dict(_CLS_BARE, other=2),
            _kernel("x[0] = scaled(x[0])"))),
    ("explicit-signature-device-body", *_pair(_EXPLICIT_SIG, {"factor": 2.0},
                                              {"factor": 3.0}, _kernel("x[0] = dev(x[0])"))),
    ("second-lambda-on-a-line", *_pair(_LAMBDAS, {"g": 3.0}, {"g": 4.0},
                                       _kernel("x[0] = G(x[0])"))),
    # (`dev(a=..., b=...)` binds by name: the call is observed where numba binds it, as
    # test_compile_time_system.py's parameter tests build it; its static key is the same.)
    # With debug info the argument's name is in the binary.
    ("kernel-argument-renamed-with-debug",
     _HEAD + _kernel("x[0] = 1.0", "@cuda.jit(debug=True, opt=False)"),
     _HEAD + _kernel("y[0] = 1.0", "@cuda.jit(debug=True, opt=False)", "y")),
    # Debug information names locals (a lineinfo line table does not: SAME below).
    ("local-renamed-with-debug",
     *(_HEAD + _kernel(f"{n} = x[1] * 2.0\n    x[0] = {n}", "@cuda.jit(debug=True, opt=False)")
       for n in ("t", "scaled"))),
    ("live-branch-edited", *(_HEAD + _kernel(f"if True:\n        x[0] = {c}")
                             for c in ("1.0", "2.0"))),
    # The global a pruned branch tests is keyed by value; a branch kept keeps its callee.
    ("pruned-branch-flag", *_pair(_PRUNED, {"debug": False, "factor": 2.0},
                                  {"debug": True, "factor": 2.0},
                                  _kernel("if DEBUG:\n        x[0] = trace(x[0])"))),
    ("callee-in-live-branch", *_pair(_PRUNED, {"debug": True, "factor": 2.0},
                                     {"debug": True, "factor": 3.0},
                                     _kernel("if DEBUG:\n        x[0] = trace(x[0])"))),
    ("callee-in-branch-on-a-local", *_pair(_PRUNED, {"debug": False, "factor": 2.0},
                                           {"debug": False, "factor": 3.0},
                                           _kernel("d = DEBUG\n    if d or x[1] > 0:\n"
                                                   "        x[0] = trace(x[0])"))),
    # numba prunes a comparison of plain values too; the compared global stays keyed.
    ("compared-global-flag", *_pair(_PRUNED, {"debug": False, "factor": 2.0},
                                    {"debug": True, "factor": 2.0},
                                    _kernel("if DEBUG == 1:\n        x[0] = trace(x[0])"))),
    ("callee-in-branch-on-a-true-comparison",
     *_pair(_PRUNED, {"debug": True, "factor": 2.0}, {"debug": True, "factor": 3.0},
            _kernel("if DEBUG == 1:\n        x[0] = trace(x[0])"))),
    ("closure-flag", *_pair(_CLOSURE_FLAG, {"debug": False, "factor": 2.0},
                            {"debug": True, "factor": 2.0}, "")),
    ("callee-in-branch-on-a-true-closure-flag",
     *_pair(_CLOSURE_FLAG, {"debug": True, "factor": 2.0}, {"debug": True, "factor": 3.0}, "")),
    # A local stored twice has no single definition: numba decides nothing on it.
    ("callee-in-branch-on-a-local-stored-twice",
     *_pair(_PRUNED, {"debug": False, "factor": 2.0}, {"debug": False, "factor": 3.0},
            _kernel("d = DEBUG\n    d = DEBUG\n    if d:\n        x[0] = trace(x[0])"))),
    ("callee-in-branch-on-is-none-taken",
     *_pair(_PRUNED, {"debug": None, "factor": 2.0}, {"debug": None, "factor": 3.0},
            _kernel("if DEBUG is None:\n        x[0] = trace(x[0])"))),
    # A device function read into a local that is then called is compiled.
    ("callee-called-through-a-local", *_pair(_PRUNED, {"debug": False, "factor": 2.0},
                                             {"debug": False, "factor": 3.0},
                                             _kernel("t = trace\n    x[0] = t(x[0])"))),
    # A name read and discarded is still typed: what it is (a device function or not) counts.
    ("uncalled-callee-rebound", *_pair(_PRUNED, {"debug": False, "factor": 2.0},
                                       {"debug": False, "factor": "2.0\n\n\ntrace = 1.5"},
                                       _kernel("t = trace\n    x[1] = 1.0"))),
    # A nested function the selector uses other than by returning it runs at typing time
    # (or may): its body stays the selector's.
    *((f"selector-{name}-nested-function", *_pair(_SELECTOR, dict(_RETURNED, use=use),
                                                  dict(_RETURNED, step=2, use=use),
                                                  _kernel("x[0] = pick(x[0])")))
      for name, use in (("calls", "    impl_int(1)"),
                        ("stores", "    KEPT.append(impl_int)"),
                        ("captures", "    other = lambda: impl_int"),
                        ("reads-locals-of", "    locals()"))),
]

# (id, version 1, version 2): numba compiles the same code; the key must not change.
SAME = [
    ("annotations", _HEAD + _kernel("i = 0\n    x[i] = 1.0"),
     _HEAD + "@cuda.jit\ndef k(x: 'float32[::1]') -> None:\n    i: int = 0\n    j: int\n"
             "    x[i] = 1.0\n"),
    ("kernel-argument-renamed", _HEAD + _kernel("x[0] = x[1] * 2.0"),
     _HEAD + _kernel("data[0] = data[1] * 2.0", args="data")),
    # A device function's parameters called by place: by place (`Keyer._by_place`).
    ("device-argument-renamed", *_pair(_KEYWORD_CALLEE, {"args": "a, b", "expr": "a - b"},
                                       {"args": "p, q", "expr": "p - q"},
                                       _kernel("x[0] = dev(x[0], x[1])"))),
    ("device-defaulted-argument-renamed",
     *_pair(_KEYWORD_CALLEE, {"args": "a, b=2.0", "expr": "a - b"},
            {"args": "p, q=2.0", "expr": "p - q"}, _kernel("x[0] = dev(x[0])"))),
    # A lineinfo line table holds lines, not names: renaming on the same lines is no edit.
    ("locals-and-arguments-renamed-with-lineinfo",
     _HEAD + _kernel("t = x[1] * 2.0\n    x[0] = t", "@cuda.jit(lineinfo=True)"),
     _HEAD + _kernel("scaled = data[1] * 2.0\n    data[0] = scaled", "@cuda.jit(lineinfo=True)",
                     "data")),
    ("dead-branch-if-false", _HEAD + _kernel("x[0] = 1.0"),
     _HEAD + _kernel("if False:\n        x[0] = UNDEFINED * 7.0\n    x[0] = 1.0")),
    ("unread-class-attribute", *_pair(_CLASS_READ_BY_OVERLOAD, _CLS, dict(_CLS, other=2),
                                      _kernel("x[0] = scaled(x[0])"))),
    ("comment-beside-a-class-attribute", *_pair(_CLASS_READ_BY_OVERLOAD, _CLS,
                                                dict(_CLS, comment="tuned"),
                                                _kernel("x[0] = scaled(x[0])"))),
    ("dead-branch-if-0-edited", *(_HEAD + _kernel(f"if 0:\n        x[1] = {c}\n    x[0] = 1.0")
                                  for c in ("1.0", "2.0"))),
    ("callee-in-pruned-branch", *_pair(_PRUNED, {"debug": False, "factor": 2.0},
                                       {"debug": False, "factor": 3.0},
                                       _kernel("if DEBUG:\n        x[0] = trace(x[0])\n"
                                               "    x[1] = 1.0"))),
    ("callee-in-pruned-else", *_pair(_PRUNED, {"debug": True, "factor": 2.0},
                                     {"debug": True, "factor": 3.0},
                                     _kernel("if not DEBUG:\n        x[0] = trace(x[0])\n"
                                             "    x[1] = 1.0"))),
    ("unselected-overload-implementation", *_pair(_SELECTOR, _RETURNED,
                                                  dict(_RETURNED, step=2),
                                                  _kernel("x[0] = pick(x[0])"))),
    # Dead code numba never types a call in: its callee's body is no input.
    ("callee-after-return", *_pair(_PRUNED, {"debug": False, "factor": 2.0},
                                   {"debug": False, "factor": 3.0},
                                   _kernel("x[1] = 1.0\n    return\n    x[0] = trace(x[0])"))),
    ("callee-in-branch-on-a-compared-global",
     *_pair(_PRUNED, {"debug": False, "factor": 2.0}, {"debug": False, "factor": 3.0},
            _kernel("if DEBUG == 1:\n        x[0] = trace(x[0])\n    x[1] = 1.0"))),
    ("callee-in-branch-on-a-closure-flag",
     *_pair(_CLOSURE_FLAG, {"debug": False, "factor": 2.0}, {"debug": False, "factor": 3.0},
            "")),
    ("callee-in-branch-on-a-local-flag",
     *_pair(_PRUNED, {"debug": False, "factor": 2.0}, {"debug": False, "factor": 3.0},
            _kernel("d = DEBUG\n    if d:\n        x[0] = trace(x[0])\n    x[1] = 1.0"))),
    ("callee-in-branch-on-is-none",
     *_pair(_PRUNED, {"debug": False, "factor": 2.0}, {"debug": False, "factor": 3.0},
            _kernel("if DEBUG is None:\n        x[0] = trace(x[0])\n    x[1] = 1.0"))),
    ("callee-assigned-never-called", *_pair(_PRUNED, {"debug": False, "factor": 2.0},
                                            {"debug": False, "factor": 3.0},
                                            _kernel("t = trace\n    x[1] = 1.0"))),
    ("callee-read-and-discarded", *_pair(_PRUNED, {"debug": False, "factor": 2.0},
                                         {"debug": False, "factor": 3.0},
                                         _kernel("trace\n    x[1] = 1.0"))),
]


@pytest.mark.parametrize("case", DIFFER, ids=lambda c: c[0])
def test_edit_changes_the_key(tmp_path, case):
    _, one, two = case
    first, second = _keys(tmp_path, [one, two])
    assert first != second


@pytest.mark.parametrize("case", SAME, ids=lambda c: c[0])
def test_edit_numba_does_not_compile_keeps_the_key(tmp_path, case):
    """And the proof that it may: both versions compile to the same PTX and cubin."""
    _, one, two = case
    first, second = _keys(tmp_path, [one, two], compile=True)
    assert first[1:] == second[1:], "the binaries differ: this edit must stay keyed"
    assert first[0] == second[0]


_TABLE = ("import numpy as np\nfrom numba import cuda\n"
          "BASE = np.arange(12, dtype=np.float32).reshape(3, 4)\nT = {table}\n\n"
          + _kernel("i = cuda.grid(1)\n    x[0] = T[i % 3, i % 2]"))
# One table of values in each memory layout numba types a frozen array by (C, F, A).
_TABLE_LAYOUTS = {"C": "np.ascontiguousarray(BASE[:, ::2])",
                  "F": "np.asfortranarray(BASE[:, ::2])",
                  "A": "BASE[:, ::2]",
                  "A-reversed": "np.ascontiguousarray(BASE[::-1, ::2])[::-1]"}


def test_a_global_array_is_keyed_by_the_layout_numba_compiles_it_in(tmp_path):
    """Equal values, other layout: numba types the constant C, F or A and embeds its bytes
    in that order, so each compiles to other code and must have a key of its own (a
    Fortran copy or a strided view of a table once served the C table's binary)."""
    made = dict(zip(_TABLE_LAYOUTS, _keys(tmp_path, [_TABLE.format(table=t)
                                                     for t in _TABLE_LAYOUTS.values()],
                                          compile=True)))
    for one, two in itertools.combinations(("C", "F", "A"), 2):
        assert made[one][1:] != made[two][1:], f"{one} and {two} compile alike: no proof"
        assert made[one][0] != made[two][0], f"{one} and {two} share a key"
    # A negative-strided view is copied into a contiguous constant: numba compiles it as
    # any other A-layout table of these values.
    assert made["A-reversed"] == made["A"]


_TITLED = ("import numpy as np\nfrom numba import cuda\n"
           "REC = np.dtype([(('{one}', 'x'), np.float32), (('{two}', 'y'), np.float32)])\n\n"
           + _kernel("a = cuda.local.array(1, REC)\n    a[0].x = x[0]\n    a[0].y = x[1]\n"
                     "    x[2] = a[0].a"))


def test_a_record_dtype_is_keyed_by_its_field_titles(tmp_path):
    """A title is a second name of a field that numba types (`a[0].a` reads the field
    titled `a`): two fields trading titles compile to other code (they once shared a key)."""
    first, second = _keys(tmp_path, [_TITLED.format(one="a", two="b"),
                                     _TITLED.format(one="b", two="a")], compile=True)
    assert first[1:] != second[1:], "both compile alike: no proof"
    assert first[0] != second[0]


_MODE = ("import enum\nfrom numba import cuda\n\n\nclass Mode({base}):\n    FAST = 1\n"
         "    SLOW = 2\n\n\n" + _kernel("x[0] = 1.0 if Mode.FAST == 1 else 2.0"))


def test_an_enum_member_is_keyed_by_how_numba_types_its_class(tmp_path):
    """numba types an IntEnum's members as integers and any other enum's as opaque members:
    `Mode.FAST == 1` compiles for the one and not for the other, so the two never share a
    key (they did: a kernel whose enum stopped being an IntEnum was served its old binary)."""
    from kbuild.backend.compiler import compile_kernel

    as_int, plain = _keys(tmp_path, [_MODE.format(base="enum.IntEnum"),
                                     _MODE.format(base="enum.Enum")])
    assert as_int != plain
    module = load_module(_write_module(tmp_path, _MODE.format(base="enum.Enum")), "kbuild_mode")
    try:
        with pytest.raises(numba.core.errors.TypingError):
            compile_kernel(module.k, [F32], (8, 0))
    finally:
        sys.modules.pop("kbuild_mode", None)


def _write_module(tmp_path, source: str):
    path = tmp_path / "mode" / "kbuild_mode.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


def test_set_order_does_not_change_the_key(tmp_path):
    """Sets are keyed by sorted content, whatever order the process iterates them in."""
    sets = ("{'contract', 'arcp', 'nsz', 'afn'}", "{'afn', 'nsz', 'arcp', 'contract'}")
    first, second = _keys(tmp_path, [
        _HEAD + _kernel("x[0] = x[0] / x[1]", f"@cuda.jit(fastmath={s})") for s in sets])
    assert first == second


def test_a_name_put_into_builtins_is_keyed(tmp_path):
    source = _HEAD + _kernel("x[0] = x[0] * KBUILD_TEST_GAIN")
    try:
        first, second = _keys(tmp_path, [source, source], before=lambda i: setattr(
            builtins, "KBUILD_TEST_GAIN", (2.0, 3.0)[i]))
    finally:
        del builtins.KBUILD_TEST_GAIN
    assert first != second


def test_a_function_attribute_with_no_content_form_is_keyed_by_its_module_source(tmp_path):
    """A test runner's mark on a device function (`pytestmark`, a list of pytest's Mark)
    has no content form: the function is keyed with its module's source for it (an edit
    there rebuilds), never a failed target."""
    device = ("import pytest\n\n\n@cuda.jit(device=True)\n@pytest.mark.slow\n"
              "def helper(v):\n    return v * 2\n\n\n")
    kernel = _kernel("x[0] = helper(x[0])")
    first, same, edited = _keys(tmp_path, [_HEAD + device + kernel, _HEAD + device + kernel,
                                           _HEAD + device + "NOTE = 1\n\n\n" + kernel])
    assert first == same != edited


def test_an_unkeyable_value_in_a_tuple_is_named(tmp_path):
    from kbuild.errors import KeyingError

    source = _HEAD + "class Opaque:\n    def __getattribute__(self, name):\n        return object.__getattribute__(self, name)\n\n\nTHING = (1.0, Opaque())\n\n\n" \
        + _kernel("x[0] = THING[0]")
    with pytest.raises(KeyingError, match=r"global 'THING' holds a .*Opaque, which kbuild "
                                          r"cannot key by content; hold numbers"):
        _keys(tmp_path, [source])


# -- through the CLI ------------------------------------------------------------------

def _project(root, files: dict):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
    return root


def _toml(*kernels: str) -> str:
    head = '[project]\nname = "forms"\npaths = ["."]\narch = ["sm_80"]\n'
    return head + "".join(f'\n[kernels."{k}"]\nsignatures = ["void(float32[::1])"]\n'
                          for k in kernels)


_SIMPLE = "from numba import cuda\n\n\n@cuda.jit\ndef k(x):\n    x[0] = x[0] * 2.0  # {}\n"


def test_sources_in_other_encodings_and_line_endings_build(tmp_path):
    """A BOM, a latin-1 coding line and CRLF line endings are Python source like any other;
    rewriting a file with LF endings changes no key."""
    project = _project(tmp_path / "p", {
        "kbuild.toml": _toml("app.bom:k", "app.latin:k", "app.crlf:k"),
        "app/__init__.py": "",
        "app/bom.py": b"\xef\xbb\xbf" + _SIMPLE.format("bom").encode(),
        "app/latin.py": ("# -*- coding: latin-1 -*-\n"
                         + _SIMPLE.format("caf\u00e9")).encode("latin-1"),
        "app/crlf.py": _SIMPLE.format("crlf").replace("\n", "\r\n").encode(),
    })
    store = tmp_path / "store"
    first = run_kbuild(project, store, "build")
    assert with_status(first, "built") == {"k"} and first["summary"]["built"] == 3
    (project / "app/crlf.py").write_text(_SIMPLE.format("crlf"))
    again = run_kbuild(project, store, "build")
    assert again["summary"] == {**again["summary"], "built": 0, "cached": 3}


_GOOD_AND_BAD = """from numba import cuda


class Opaque:  # every attribute read runs its code: no state to key it by
    def __getattribute__(self, name):
        return object.__getattribute__(self, name)


THING = (1.0, Opaque())


@cuda.jit
def k_good(x):
    x[0] = 1.0


@cuda.jit
def k_bad(x):
    x[0] = THING[0]
"""


def test_an_unkeyable_target_fails_alone(tmp_path):
    project = _project(tmp_path / "p", {
        "kbuild.toml": _toml("app.m:k_good", "app.m:k_bad"),
        "app/__init__.py": "", "app/m.py": _GOOD_AND_BAD})
    store = tmp_path / "store"
    result = run_kbuild(project, store, "build", expect_rc=1)
    rows = {r["target"]: r for r in result["targets"]}
    assert rows["app.m:k_good"]["status"] == "built"
    assert rows["app.m:k_bad"]["status"] == "failed" and rows["app.m:k_bad"]["key"] is None
    assert "global 'THING' holds a app.m.Opaque" in rows["app.m:k_bad"]["error"]
    keys = run_kbuild(project, store, "keys", expect_rc=1)
    assert keys["digest"] is None
    assert {r["target"]: r["key"] for r in keys["targets"]} == {
        "app.m:k_good": rows["app.m:k_good"]["key"], "app.m:k_bad": None}
    status = {r["target"]: r["status"]
              for r in run_kbuild(project, store, "status", expect_rc=1)["targets"]}
    assert status == {"app.m:k_good": "up-to-date", "app.m:k_bad": "unkeyable"}


# -- keying facts that check themselves (issue #15) ---------------------------------

_READER = """from numba import cuda

from app import consts

F, G = cuda.jit(device=True)(lambda v: v + 1.0), cuda.jit(device=True)(lambda v: v * consts.GAIN)


@cuda.jit
def k_scale(x):
    x[0] = x[0] * consts.SCALE


@cuda.jit
def k_lambda(x):
    x[0] = F(x[0]) + G(x[1])
"""


def _facts_files(store):
    """The facts tables of source files (not the kept body texts `explain` shows)."""
    return sorted(p for p in (store / "v1" / "facts").glob("*/*.json")
                  if not p.name.startswith("body-"))


def _empty_chains(record: dict, resign: bool) -> dict:
    table = {slot: ([] if slot.endswith(" chains") else value)
             for slot, value in record["table"].items()}
    if resign:  # forged consistently: only the bytecode check can tell
        from kbuild.store.facts import facts_digest as _facts_digest

        return {**record, "table": table, "digest": _facts_digest(record["source"], table)}
    return {**record, "table": table}


def _flip_a_value(record: dict) -> dict:
    table = dict(record["table"])
    slot = next(s for s, v in sorted(table.items()) if isinstance(v, str))
    table[slot] = ("0" if table[slot][0] != "0" else "1") + table[slot][1:]
    return {**record, "table": table}


TAMPERINGS = [
    # Not tampered: the second lambda on a line once got the facts of the first.
    ("untouched", lambda text: text),
    ("chains-emptied", lambda text: json.dumps(_empty_chains(json.loads(text), False))),
    ("chains-emptied-and-resigned",
     lambda text: json.dumps(_empty_chains(json.loads(text), True))),
    ("digest-flipped", lambda text: json.dumps(_flip_a_value(json.loads(text)))),
    ("truncated", lambda text: text[:len(text) // 2]),
    ("nested-deep", lambda text: "[" * 100_000 + "]" * 100_000),
]


@pytest.fixture(scope="module")
def facts_baseline(tmp_path_factory):
    root = tmp_path_factory.mktemp("facts")
    project = _project(root / "p", {
        "kbuild.toml": _toml("app.k:k_scale", "app.k:k_lambda"),
        "app/__init__.py": "", "app/k.py": _READER,
        "app/consts.py": "SCALE = 2.0\nGAIN = 3.0\n"})
    store = root / "store"
    built = run_kbuild(project, store, "build")
    assert built["summary"]["built"] == 2 and _facts_files(store)
    return project, store


def _fifo(path):
    path.unlink()
    os.mkfifo(path)


def _link_outside(path):
    outside = path.parent.parent.parent / "outside.json"
    outside.write_text(path.read_text())
    path.unlink()
    path.symlink_to(outside)


# Replaced by something that is not a facts file: never opened to block, never followed.
REPLACEMENTS = [("fifo", _fifo), ("symlink", _link_outside)]


@pytest.mark.parametrize("tamper", TAMPERINGS + REPLACEMENTS, ids=lambda t: t[0])
def test_tampered_facts_never_serve_a_stale_binary(facts_baseline, tmp_path, tamper):
    import shutil

    project = shutil.copytree(facts_baseline[0], tmp_path / "p")
    store = shutil.copytree(facts_baseline[1], tmp_path / "store")
    for path in _facts_files(store):
        if (tamper[0], tamper[1]) in REPLACEMENTS:
            tamper[1](path)
        else:
            path.write_text(tamper[1](path.read_text()))
    (project / "app/consts.py").write_text("SCALE = 2.5\nGAIN = 3.5\n")
    result = run_kbuild(project, store, "build")
    assert with_status(result, "built") == {"k_scale", "k_lambda"}
    keys = run_kbuild(project, store, "keys")
    assert {r["target"]: r["key"] for r in keys["targets"]} \
        == {r["target"]: r["key"] for r in result["targets"]}
    status = run_kbuild(project, store, "status")
    assert {r["status"] for r in status["targets"]} == {"up-to-date"}


@pytest.mark.parametrize("python, numpy_value", [("ab", "str_"), (1.5, "float64"),
                                                 (1j, "complex128")])
def test_numpy_scalars_sharing_a_key_with_python_values_type_alike(python, numpy_value):
    """numpy's str_, float64 and complex128 subclass str, float and complex and are keyed as
    them: right only while numba types them alike as constants (its bytes_ is not: above)."""
    import numpy as np
    from numba.cuda.typing.typeof import Purpose, typeof

    from kbuild.keying import values

    value = getattr(np, numpy_value)(python)
    assert values.canonical(value) == values.canonical(python)
    assert typeof(value, Purpose.constant) == typeof(python, Purpose.constant)
    assert values.canonical(np.bytes_(b"ab")) != values.canonical(b"ab")


def test_a_kbuild_compile_waits_for_a_numba_compile_in_another_thread(tmp_path):
    """kbuild's compile patches numba process-wide: it runs under numba's compiler lock, so
    a program's own JIT in another thread never compiles under its patches (and two
    in-process kbuild compiles never save each other's patch as numba's original)."""
    import threading

    from numba.cuda import cudaimpl, dispatcher
    from numba.cuda.core.compiler_lock import global_compiler_lock

    from kbuild.backend.backends import DEFAULT, get

    path = tmp_path / "kbuild_locked.py"
    path.write_text(_HEAD + _kernel("x[0] = x[0] + 1.0"))
    module = load_module(path, "kbuild_locked")
    made = []
    numbas = (cudaimpl._generic_array, dispatcher._Kernel.bind)
    compile_ = threading.Thread(
        target=lambda: made.append(get(DEFAULT).compile(module.k, [F32], (8, 0))))
    try:
        with global_compiler_lock:  # another thread's numba compile, in progress
            compile_.start()
            compile_.join(timeout=3)
            assert compile_.is_alive() and not made  # waiting for the lock
            # ... and numba is numba's meanwhile: what this thread compiles is unpatched
            assert (cudaimpl._generic_array, dispatcher._Kernel.bind) == numbas
        compile_.join()
    finally:
        sys.modules.pop("kbuild_locked", None)
    assert made and made[0].ptx.startswith(b"//")
