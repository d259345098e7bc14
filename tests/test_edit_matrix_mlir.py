"""test_edit_matrix.py's tests, for numba-cuda-mlir (skipped where it is not installed).

A file of its own, the same tests, the same assertions, the same one baseline per backend
(a template, built once per run). The suite runs `--dist worksteal`, so both workers share
the cases of either file.
"""

from __future__ import annotations

import pytest

from editmatrix_support import VARIANTS
from test_edit_matrix import *  # noqa: F401,F403 - its tests and fixtures, run here


@pytest.fixture(scope="module", params=VARIANTS[1:], ids=lambda v: v.id)
def variant(request):
    """The backend this module's tests run for: numba-cuda-mlir."""
    return request.param.require()
