"""`kbuild.enable()` serves numba-cuda-mlir kernels too (issue 23, item 5).

A program with a lazy numba-cuda-mlir kernel (and a device function) runs in fresh
processes. Its dispatcher's compile, as its C++ launcher asks for it
(`MLIRDispatcher._compile_impl`), is answered from kbuild's store: built and stored by
the first process, taken with no compile by the next, under the key `kbuild build` gives
the same kernel declared; an edit of the device function builds again. No driver here:
`kbuild.testing.fake_device` pins numba-cuda-mlir to the answer a GPU would give (sm_90)
and stands in for the current device.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from conftest import blob_bytes
from mlir_support import needs_mlir
from support import run

KERNELS = '''\
from numba_cuda_mlir import cuda


@cuda.jit(device=True)
def twice(x):
    return x * 2.0


@cuda.jit
def saxpy(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * twice(x[i]) + y[i]
'''

# kbuild.enable() first, numba-cuda-mlir imported by the program after it (as the
# KBUILD_ENABLE start-up hook leaves things), then one compile as its launcher asks for it.
PROGRAM = textwrap.dedent('''
    import json, sys
    import numpy as np
    import kbuild, kbuild.zeroconf
    from kbuild import testing

    if sys.argv[2] != "environment":
        kbuild.enable(store=sys.argv[1], on_miss=sys.argv[2])
    assert "numba_cuda_mlir" not in sys.modules  # enable() waits for the program's import
    sys.path.insert(0, "app")
    import zk
    session = kbuild.zeroconf.current()
    from numba_cuda_mlir import mlir_compiler

    compiles = []
    real = mlir_compiler.compile_mlir
    mlir_compiler.compile_mlir = lambda *a, **k: compiles.append(1) or real(*a, **k)
    x = np.arange(8, dtype=np.float32)
    with testing.fake_device("sm_90", session.store, compilers=("numba-cuda-mlir",)):
        cubin, entry, cooperative = zk.saxpy._compile_impl([np.float32(2), x, x, x])[:3]
    print(json.dumps({"counts": dict(session.counts), "served": session.served,
                      "entry": entry, "compiles": len(compiles),
                      "cubin": bytes(cubin).hex()}))
''')

SIG = "void(float32, float32[::1], float32[::1], float32[::1])"


def _program(root: Path, store: Path, tmp: Path, on_miss="build", env=None) -> dict:
    done = run(str(store), on_miss, cwd=root, home=tmp / "home", launcher=("-c", PROGRAM),
               env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def program(tmp_path) -> Path:
    root = tmp_path / "prog"
    (root / "app").mkdir(parents=True)
    (root / "app" / "zk.py").write_text(KERNELS)
    return root


@needs_mlir
def test_a_lazy_kernel_is_built_once_then_served_from_the_store(program, tmp_path):
    store = tmp_path / "store"
    first = _program(program, store, tmp_path)
    assert first["counts"] == {"built": 1, "served": 1}
    (name, signature, arch, key), = first["served"]
    assert (name, signature, arch) == ("zk:saxpy", SIG, "sm_90")
    assert first["entry"].startswith("_Z5saxpy")

    second = _program(program, store, tmp_path)
    assert second["counts"] == {"hits": 1, "served": 1}
    assert second["compiles"] == 0  # numba-cuda-mlir compiled nothing: the store answered
    assert second["served"] == first["served"] and second["cubin"] == first["cubin"]

    # The key and the cubin `kbuild build` gives the same kernel declared.
    (program / "kbuild.toml").write_text(
        '[project]\nname = "zk"\npaths = ["app"]\narch = ["sm_90"]\n\n'
        f'[kernels."zk:saxpy"]\nsignatures = ["{SIG}"]\n')
    built = run("build", "--json", "--store", str(tmp_path / "aot"), cwd=program,
                home=tmp_path / "home")
    assert built.returncode == 0, built.stdout + built.stderr
    row, = built.json["targets"]
    assert row["key"] == key
    aot = (tmp_path / "aot" / "v1" / "blobs")
    cubin = next(p for p in aot.rglob(row["artifacts"]["cubin"]))
    assert blob_bytes(cubin).hex() == first["cubin"]


@needs_mlir
def test_an_edited_device_function_is_built_again(program, tmp_path):
    store = tmp_path / "store"
    first = _program(program, store, tmp_path)
    kernels = program / "app" / "zk.py"
    kernels.write_text(KERNELS.replace("x * 2.0", "x * 3.0"))
    edited = _program(program, store, tmp_path)
    assert edited["counts"] == {"built": 1, "served": 1}
    assert edited["served"][0][3] != first["served"][0][3]
    assert edited["cubin"] != first["cubin"]
    kernels.write_text(KERNELS)  # back: the first build's entry again, no compile
    again = _program(program, store, tmp_path)
    assert (again["counts"], again["compiles"]) == ({"hits": 1, "served": 1}, 0)
    assert again["served"] == first["served"]


@needs_mlir
def test_on_miss_error_and_jit(program, tmp_path):
    store = tmp_path / "store"
    done = run(str(store), "error", cwd=program, home=tmp_path / "home",
               launcher=("-c", PROGRAM))
    assert done.returncode != 0 and "is not in store" in done.stderr, done.stderr
    jitted = _program(program, store, tmp_path, on_miss="jit")
    assert jitted["counts"] == {"fallback": 1} and jitted["compiles"] == 1
    assert jitted["served"] == []


# On a real device (`pytest --gpu`, numba-cuda-mlir installed): the program launches the
# kernel for real, under kbuild.enable() (built, then served in a fresh process) and
# under numba-cuda-mlir's own JIT; the results are the same.
ON_DEVICE = textwrap.dedent('''
    import json, sys
    import numpy as np
    if sys.argv[2] == "kbuild":
        import kbuild
        session = kbuild.enable(store=sys.argv[1])
    sys.path.insert(0, "app")
    import zk
    from numba_cuda_mlir import cuda

    x = np.arange(1024, dtype=np.float32)
    y = np.ones(1024, dtype=np.float32)
    out = cuda.to_device(np.zeros(1024, dtype=np.float32))
    zk.saxpy[4, 256](np.float32(0.5), cuda.to_device(x), cuda.to_device(y), out)
    cuda.synchronize()
    counts = dict(session.counts) if sys.argv[2] == "kbuild" else None
    print(json.dumps({"out": out.copy_to_host().tolist(), "counts": counts}))
''')


@needs_mlir
@pytest.mark.gpu
def test_on_a_device_served_kernels_compute_what_its_own_jit_does(program, tmp_path):
    def launched(way):
        done = run(str(tmp_path / "store"), way, cwd=program, home=tmp_path / "home",
                   launcher=("-c", ON_DEVICE))
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    built, served, jitted = launched("kbuild"), launched("kbuild"), launched("jit")
    assert built["counts"] == {"built": 1, "served": 1}
    assert served["counts"] == {"hits": 1, "served": 1}
    assert built["out"] == served["out"] == jitted["out"]
    assert jitted["out"][:3] == [1.0, 2.0, 3.0]  # 0.5 * 2x + 1


@needs_mlir
def test_kbuild_enable_in_the_environment_waits_for_numba_cuda_mlir(program, tmp_path):
    """KBUILD_ENABLE=1 (the start-up hook) with a program that imports numba-cuda-mlir and
    never numba.cuda: kbuild is enabled at that import and serves its kernel."""
    store = tmp_path / "store"
    env = {"KBUILD_ENABLE": "1", "KBUILD_STORE": str(store)}
    first = _program(program, store, tmp_path, on_miss="environment", env=env)
    assert first["counts"] == {"built": 1, "served": 1}
    second = _program(program, store, tmp_path, on_miss="environment", env=env)
    assert (second["counts"], second["compiles"]) == ({"hits": 1, "served": 1}, 0)
