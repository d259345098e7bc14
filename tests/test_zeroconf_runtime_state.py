"""Zero-config serves what numba compiles for the program's state now, set at run time.

Each case is a program whose state numba's compile reads - a value a typing-time function
reads through an object, a registration, an option - and a statement the program runs
before its first launch that changes that state (in no file). The program runs once as
it was, filling a store; then changed, against that store twice (the second answered by
the program journal where it vouches) and against an empty one. Every binary the changed
program loads must be the one the empty store's run makes, and it must differ from the
first run's (else the case proves nothing).
"""

from __future__ import annotations

import pytest

from zeroconf_support import APP, dedent, run, write_program

# The device function `twice` in mathlib is unused here; `shift` is a control kernel.
HEAD = dedent("""\
    from numba import cuda
    from numba.extending import overload


    def gain():
        pass


    @overload(gain, target="cuda")
    def _gain():
        g = {read}
        return lambda: g


    @cuda.jit
    def scale(x, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = x[i] * gain()


    @cuda.jit
    def shift(x, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = x[i] + 1.0
    """)


def _case(name, defs, read, change):
    return pytest.param(defs, read, change, id=name)


CASES = [
    # `C.G` found on C's metaclass: no class of C's MRO holds it, `dir(C)` leaves it out.
    _case("metaclass-attribute-read-through-the-class",
          "class Meta(type):\n    G = 2.0\n\n\nclass C(metaclass=Meta):\n    pass\n",
          "C.G", "K.Meta.G = 7.0"),
    # `C.G` answered by the metaclass's `__getattr__`, from a global set at run time.
    _case("metaclass-getattr",
          "FACT = 2.0\n\n\nclass Meta(type):\n    def __getattr__(cls, name):\n"
          "        if name == 'G':\n            return FACT\n        raise AttributeError(name)\n"
          "\n\nclass C(metaclass=Meta):\n    pass\n",
          "C.G", "K.FACT = 7.0"),
    # An attribute set on a function object is no global, cell or default of it.
    _case("function-attribute", "def helper():\n    pass\n\n\nhelper.g = 2.0\n",
          "helper.g", "K.helper.g = 7.0"),
    # An optional dependency the overload tries, made importable by the program (no
    # file of the first run changes: the folder is new, and on sys.path only now).
    _case("module-made-importable",
          "def have():\n    try:\n        import zz_optional  # noqa: F401\n"
          "        return 7.0\n    except ImportError:\n        return 2.0\n",
          "have()", "import os, sys; os.makedirs('extra', exist_ok=True); "
          "open('extra/zz_optional.py', 'w').close(); "
          "sys.path.insert(0, os.path.abspath('extra'))"),
]


def _program(root, defs, read, change="pass"):
    """The program; `change` runs in `app.main` (no file of its kernels holds it), on the
    kernels' module `K`, before the first launch."""
    kernels = defs + "\n\n" + HEAD.replace("{read}", read)
    app = APP.replace("    x = device_array(", f"    {change}\n    x = device_array(", 1)
    return write_program(root, kernels=kernels, app=app)


def _loads(report):
    return {name: [d for entry, kind, d in report["loads"] if name in entry]
            for name in ("scale", "shift")}


@pytest.mark.parametrize(("defs", "read", "change"), CASES)
def test_state_set_at_run_time_serves_what_numba_compiles(tmp_path, defs, read, change):
    store, root = tmp_path / "store", tmp_path / "prog"
    first = run(_program(root, defs, read), "kbuild", enable={"store": str(store)})
    assert first["counts"] == {"built": 2, "served": 2}, first["stderr"]
    _program(root, defs, read, change)
    fresh = run(root, "kbuild", enable={"store": str(tmp_path / "fresh")})
    assert _loads(fresh)["scale"] != _loads(first)["scale"], "the change compiles nothing new"
    for attempt in ("incremental", "journal"):
        again = run(root, "kbuild", enable={"store": str(store)})
        assert _loads(again) == _loads(fresh), f"{attempt}: a stale binary was served"
