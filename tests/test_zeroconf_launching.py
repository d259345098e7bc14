"""What a served kernel's launches look like at the driver: kbuild's own launcher behind
numba's dispatcher, numba's semantics (argument kinds, host arrays copied back, the
launch configuration forms). The fake driver checks every parameter against the stored
PTX's `.entry` (its `record=True` mode), down to the `cuda.core` call."""

import json
import subprocess
import sys

from zeroconf_support import env_for

KERNELS = """\
import numpy as np
from numba import cuda

POINT = np.dtype([("x", np.float32), ("y", np.float32)], align=True)


@cuda.jit
def many(dev, host, a, n, pair, pts):
    i = cuda.grid(1)
    if i < dev.size:
        host[i] = dev[i] * a + n + pair[0] + pts[0].x


@cuda.jit(debug=True, opt=False)
def checked(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = 1.0
"""

SCRIPT = """\
import json, sys
import numpy as np
import kbuild
from kbuild import testing

store = sys.argv[1]
session = kbuild.enable(store=store)
# The store's ABI is read again when a kernel compiled in the block is loaded.
with testing.fake_device("sm_80", store) as fake:
    import kernels as K
    dev = fake.array(np.arange(64, dtype=np.float32))
    host = np.zeros(64, np.float32)
    pts = np.zeros(2, K.POINT)
    K.many[2, 32](dev, host, np.float32(2.0), 3, (1.0, 2.0), pts)
    K.many[(2, 1), (32, 1, 1), 0, 0](dev, host, np.float32(2.5), 4, (1.5, 2.5), pts)
    K.many[2, 32](dev, host, np.float32(1.0), 5, (0.5, 0.5), pts)
    K.checked[1, 64](dev)
    kinds = sorted(type(k).__name__ for d in (K.many, K.checked) for k in d.overloads.values())
    print(json.dumps({"launches": [[l.entry[:20], list(l.grid), list(l.block),
                                    len(l.args)] for l in fake.launches],
                      "copies_back": fake.copies_back, "kinds": kinds,
                      "counts": dict(session.counts), "loads": len(fake.loads)}))
"""


def test_served_kernels_launch_through_kbuilds_launcher(tmp_path):
    (tmp_path / "kernels.py").write_text(KERNELS)
    (tmp_path / "script.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, "script.py", str(tmp_path / "store")], cwd=tmp_path,
                          env=env_for(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    # numba typed three launches alike: one overload, served and launched by kbuild; the
    # debug kernel is numba's own launch (device-side exceptions) of the served binary
    # (numba's `_Kernel`, as loaded from the store: `loader.stored_classes`).
    assert result["counts"] == {"built": 2, "served": 2}
    assert result["kinds"] == ["FastKernel", "StoredKernel"]
    assert [l[1:] for l in result["launches"]] == [
        [[2, 1, 1], [32, 1, 1], 25], [[2, 1, 1], [32, 1, 1], 25], [[2, 1, 1], [32, 1, 1], 25],
        [[1, 1, 1], [64, 1, 1], 7]]
    assert result["copies_back"] == 6  # the host array and the record array, each launch
    assert result["loads"] == 2  # each binary loaded once
