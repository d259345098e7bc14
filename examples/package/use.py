"""What a user of the installed kbdemo runs: no kbuild.toml, no compiler, no compile."""

import numpy as np

from kbuild import Project

proj = Project.load(package="kbdemo", on_miss="error")
proj.install()  # kbdemo.kernels.saxpy[...] now launches the bundled code
from kbdemo.kernels import saxpy, scale  # noqa: E402

x = np.arange(8, dtype=np.float32)
out = np.zeros_like(x)
saxpy[1, 32](np.float32(2), x, x, out)
scale[1, 32](out, np.float32(0.5))
assert (out == 1.5 * x).all(), out
for row in proj.describe():
    print(row["target"], row["device_arch"], row["artifact"], row["arch"])
