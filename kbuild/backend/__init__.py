"""The backend: every use of numba-cuda, NVVM and nvJitLink internals lives here."""
