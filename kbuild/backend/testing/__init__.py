"""Test doubles of the backend: not part of the product.

Nothing kbuild runs imports this package (tests/test_architecture.py checks it); its one
door is `kbuild.testing`, the documented fake device for users' CPU-only tests, which
kbuild's own tests and benchmarks use too. It sits under `backend/` because standing in
for the driver means swapping numba-cuda's and cuda.core's calls, which only the backend
may reach.

- `fakedriver`: a fake CUDA driver; the launch path runs for real down to the calls that
  need a GPU, and those check what they are handed as the driver would.
"""
