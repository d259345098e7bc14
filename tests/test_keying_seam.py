"""The backend seam: keying learns what a compiler's objects are only through an
`ObjectModel` (keying/interfaces.py), so another compiler plugs in by implementing it.

Here a toy compiler whose kernels are `ToyKernel` wrappers (no numba objects at all)
is keyed by the real `Keyer`, real sources and real hashing.
"""

import sys
import textwrap
import types as pytypes

from numba.core import types as nbtypes

from editmatrix_support import load_module
from kbuild.keying.interfaces import Function, Role
from kbuild.keying.keyer import Keyer
from kbuild.keying.tree import LabelKind
from kbuild.sources import ProjectSources


class ToyKernel:
    """A toy compiler's kernel or device function: a Python function and a flag."""

    def __init__(self, function, device=False, unroll=4):
        self.function, self.device, self.unroll = function, device, unroll


def toy_jit(device=False, unroll=4):
    return lambda fn: ToyKernel(fn, device, unroll)


class ToyObjects:
    """The whole of what the toy compiler tells keying."""

    def function_of(self, obj):
        if isinstance(obj, ToyKernel):
            return Function(obj.function, {"unroll": obj.unroll},
                            Role.DEVICE if obj.device else Role.KERNEL)
        if isinstance(obj, pytypes.FunctionType):
            return Function(obj, {}, Role.FUNCTION)
        return None

    def options_of(self, obj):
        raise AssertionError("the toy compiler always gives its options")

    def declared_function(self, value):
        return None

    def record_of(self, value):
        return None

    def linked_item(self, item):
        return None

    def overloads_of(self, func):
        return []

    def known_to_compiler(self, value):
        return False

    def named_form(self, value):
        return None


# The toy project imports the toy compiler by this name, whatever pytest named this module.
sys.modules["kbuild_toy_compiler"] = sys.modules[__name__]

SOURCE = """
    from kbuild_toy_compiler import toy_jit

    SCALE = {scale}


    @toy_jit(device=True)
    def helper(x):
        return x * SCALE


    @toy_jit(unroll={unroll})
    def k(out, x):
        out[0] = helper(x[0])
"""


def _key(tmp_path, name, scale=2.0, unroll=4):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(SOURCE.format(scale=scale, unroll=unroll)))
    module = load_module(path, name)
    keyer = Keyer(ProjectSources([str(tmp_path)]), ToyObjects())
    array = nbtypes.float32[::1]
    node = keyer.target_node(module.k, f"{name}:k", (array, array), "sig", "toy1",
                             {"toy": "1"}, {})
    return keyer, module, node


def test_a_second_compiler_plugs_in_through_the_object_model_alone(tmp_path):
    keyer, module, node = _key(tmp_path, "toyproj")
    labels = {path[-1] for path, _, _ in node.flatten()}
    callee = LabelKind.CALLEE.label("toyproj:helper")
    assert {LabelKind.KERNEL.label("toyproj:k"), callee, LabelKind.OPTION.label("unroll"),
            LabelKind.GLOBAL.label("SCALE"), LabelKind.GLOBAL.label("helper")} <= labels
    assert keyer.device_functions == [module.helper]


def test_what_the_toy_compiler_reports_is_keyed(tmp_path):
    base = _key(tmp_path, "toy_a")[2]
    scaled = _key(tmp_path, "toy_b", scale=3.0)[2]
    unrolled = _key(tmp_path, "toy_c", unroll=8)[2]
    assert _option(scaled, "unroll") == _option(base, "unroll") != _option(unrolled, "unroll")
    assert _reads(scaled, "SCALE") != _reads(base, "SCALE") == _reads(unrolled, "SCALE")


def _option(node, name):
    return next(d for p, _, d in node.flatten() if p[-1] == LabelKind.OPTION.label(name)
                and p[-2].startswith("kernel"))


def _reads(node, name):
    return next(d for p, _, d in node.flatten() if p[-1] == LabelKind.GLOBAL.label(name))
