"""The data model, away from the type."""

from numba.cuda import types
from numba.cuda.extending import core_models, make_attribute_wrapper, register_model

from sp.ext.types import SpanType


@register_model(SpanType)
class SpanModel(core_models.StructModel):
    def __init__(self, dmm, fe_type):
        members = [("lo", types.float32), ("hi", types.float32)]
        core_models.StructModel.__init__(self, dmm, fe_type, members)


make_attribute_wrapper(SpanType, "lo", "lo")
make_attribute_wrapper(SpanType, "hi", "hi")
