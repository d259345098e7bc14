"""Configuration objects that the overloads in cp.ext read while numba compiles."""

import dataclasses
import functools
import types
from pathlib import Path

import numpy as np


@dataclasses.dataclass(frozen=True)
class Scaling:
    scale: float = 2.0
    shift: float = 1.0


@dataclasses.dataclass
class Inner:
    gain: float = 0.5


@dataclasses.dataclass
class Outer:
    inner: Inner
    label: str = "outer"


class Settings:
    def __init__(self):
        self._factor = 3.0

    @property
    def factor(self):
        return self._factor


def _times(a, b):
    return a * b


@functools.lru_cache(maxsize=None)
def cached_gain(n):
    return 0.25 * n


# Keyed by where it is in the project, never by where the checkout is.
HERE = Path(__file__).resolve().parent
FLOAT32 = np.finfo(np.float32)
SCALING = Scaling()
OUTER = Outer(Inner())
SETTINGS = Settings()
NAMESPACE = types.SimpleNamespace(bias=1.5, name="ns")
TIMES_FOUR = functools.partial(_times, 4.0)
