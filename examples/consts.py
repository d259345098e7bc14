"""Module-level constants, a global coefficient table and an enum used by kernels."""

import enum

import numpy as np

SCALE = 2.5

# Polynomial coefficients, highest degree first (np.polyval order).
COEFFS = np.array([0.5, -1.0, 2.0, 0.25], dtype=np.float32)


class Mode(enum.IntEnum):
    FAST = 1
    PRECISE = 2
