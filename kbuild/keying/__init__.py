"""Keying: normalizing, encoding and keying what a kernel's code depends on. Pure: no I/O."""
