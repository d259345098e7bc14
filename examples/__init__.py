"""Example numba-cuda kernels built by kbuild (see ../kbuild.toml).

Every kernel is lazily jitted (no signature at import time), so importing
these modules never touches the CUDA driver. Each module exposes pure-numpy
``reference_<kernel>`` functions that compute the expected outputs.
"""
