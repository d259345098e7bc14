"""An extension type whose typing, data model and lowering live in three modules."""

from sp.ext import types as _types  # noqa: F401
from sp.ext import models as _models  # noqa: F401
from sp.ext import lowering as _lowering  # noqa: F401
from sp.ext import methods as _methods  # noqa: F401
from sp.ext import raw as _raw  # noqa: F401
from sp.ext import typer as _typer  # noqa: F401
