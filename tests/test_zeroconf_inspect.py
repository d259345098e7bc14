"""A kernel served from the store answers what numba's own kernel objects answer: its
LLVM IR, PTX and typed IR (`inspect_llvm`, `inspect_asm`, `inspect_types`), its
signatures for argument conversion (`nopython_signatures`), and `launch_config_sensitive`
when the dispatcher was marked before it compiled. numba-cuda's own test suite, run
under kbuild on a GPU, asks all of these.

What the store does not hold comes from numba's compile of the kernel, made only when a
program asks: launching from the store still compiles nothing.
"""

from __future__ import annotations

import json

import pytest

from zeroconf_support import run, write_program

INSPECTING = """\
import io, json
import numpy as np

import app_kernels as K


def main(device_array, which):
    x = device_array(np.arange(64, dtype=np.float32))
    out = device_array(np.zeros(64, np.float32))
    K.scale[2, 32](x, out)
    if "inspect" in which:
        (sig,) = K.scale.signatures
        types = io.StringIO()
        K.scale.inspect_types(file=types)
        kernel = K.scale.overloads[sig]
        found = {"asm": K.scale.inspect_asm(sig), "llvm": K.scale.inspect_llvm(sig),
                 "asm_80": kernel.inspect_asm((8, 0)), "types": types.getvalue(),
                 "nopython": [str(s) for s in K.scale.nopython_signatures],
                 "kind": type(kernel).__name__}
        with open("inspected.json", "w") as fh:
            json.dump(found, fh)
"""


@pytest.fixture(scope="module")
def inspected(tmp_path_factory):
    """{mode: (report, what the program inspected)}: kbuild building the kernel, kbuild
    serving it from the store, and numba alone."""
    root = write_program(tmp_path_factory.mktemp("inspect"), app=INSPECTING)
    env = {"KBUILD_STORE": root / "store"}
    found = {"built": run(root, "kbuild", ("scale",), env=env)}
    for name, mode in (("served", "kbuild"), ("numba", "numba")):
        found[name] = (run(root, mode, ("scale", "inspect"), env=env),
                       json.loads((root / "inspected.json").read_text()))
    return found


def test_a_served_kernel_is_inspected_as_numba_compiles_it(inspected):
    report, served = inspected["served"]
    _, numba = inspected["numba"]
    assert report["counts"]["served"] == 1 and report["counts"].get("built", 0) == 0
    assert served["kind"] == "FastKernel"
    for what in ("asm", "llvm", "asm_80", "nopython"):
        assert served[what] == numba[what], what
    assert ".visible .entry" in served["asm"] and "define" in served["llvm"]
    assert "scale" in served["types"] and served["types"].count("\n") > 5


def test_inspecting_compiles_launching_does_not(inspected):
    """The build compiled the kernel; serving it compiled nothing until the program asked
    for its IR: then numba's one compile of it."""
    assert inspected["built"]["nvvm"] >= 1
    report, _ = inspected["served"]
    assert report["loads"] and all(kind == "cubin" for _, kind, _ in report["loads"])
    assert 1 <= report["nvvm"] <= inspected["numba"][0]["nvvm"]
