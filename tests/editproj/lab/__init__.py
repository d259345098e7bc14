"""Kernels for kbuild's edit-matrix tests: each reaches a different part of the package."""
