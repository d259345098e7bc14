"""Run every example kernel through `Project.load()` and compare with its numpy reference.

Used by tests/test_examples_run.py in a fresh interpreter, under numba's
simulator (CI), on a GPU (tests marked `gpu`), or with `--fake-driver SM_XY`:
the real launch path down to the driver calls, which fakes check
(`kbuild.testing.fake_device`); nothing runs, so a case is true when its launch reached
the driver with a right stream, config and parameters. Prints one JSON object:
{case: true|"error text"} plus "compiles": how many numba compiles happened
after the store was warm (must be 0 on a GPU; the simulator never compiles).
Usage: python run_examples.py KBUILD_TOML STORE [--fake-driver SM_XY]
"""

import json
import sys

import numpy as np


def cases():
    from examples import closures, consts, elementwise, geometry, reductions, saxpy

    n = 256
    x = np.linspace(-2, 2, n).astype(np.float32)
    y = np.linspace(1, 3, n).astype(np.float32)
    pts = np.zeros(n, geometry.POINT_DTYPE)
    pts["x"], pts["y"], pts["z"] = x, y, 1.0
    vals = (np.arange(n) % 3).astype(np.int64)
    return {
        "saxpy": ("examples.saxpy:saxpy", lambda o: (np.float32(2.0), x, y, o),
                  np.zeros(n, np.float32), saxpy.reference_saxpy(np.float32(2.0), x, y)),
        "square_shift32": ("examples.elementwise:square_shift", lambda o: (x, o),
                           np.zeros(n, np.float32), elementwise.reference_square_shift(x)),
        "square_shift64": ("examples.elementwise:square_shift", lambda o: (x.astype(np.float64), o),
                           np.zeros(n, np.float64),
                           elementwise.reference_square_shift(x.astype(np.float64))),
        "scaled_poly": ("examples.elementwise:scaled_poly", lambda o: (x, o),
                        np.zeros(n, np.float32), elementwise.reference_scaled_poly(x)),
        "mode_select": ("examples.elementwise:mode_select",
                        lambda o: (x, np.int64(consts.Mode.FAST), o), np.zeros(n, np.float32),
                        elementwise.reference_mode_select(x, consts.Mode.FAST)),
        "point_norms": ("examples.geometry:point_norms", lambda o: (pts, o),
                        np.zeros(n, np.float32), geometry.reference_point_norms(pts)),
        "apply_double": ("examples.closures:apply_double", lambda o: (x, o),
                         np.zeros(n, np.float32), closures.reference_apply_double(x)),
        "scale3": ("examples.closures:scale3.func", lambda o: (x, o),
                   np.zeros(n, np.float32), closures.reference_scale3(x)),
        "mirror_sum": ("examples.reductions:mirror_sum",
                       lambda o: (x, np.zeros(n, np.float32), o), np.zeros(n, np.float32),
                       reductions.reference_mirror_sum(x)),
        "count_nonzero": ("examples.reductions:count_nonzero", lambda o: (o, vals),
                          np.zeros((), np.int64), reductions.reference_count_nonzero(vals)),
    }


def main(config, store, fake_arch=None):
    import contextlib

    from numba.cuda import config as numba_config

    from kbuild import Project

    simulator = bool(numba_config.ENABLE_CUDASIM)
    counter = _count_compiles() if not simulator else [0]
    from kbuild.discover import add_import_paths

    proj = Project.load(config, store=store, on_miss="error")
    add_import_paths(proj.config)
    with _fake_driver(proj, fake_arch) if fake_arch else contextlib.nullcontext():
        result = {case: _run(proj, case, simulator, fake_arch, *spec)
                  for case, spec in cases().items()}
    result["compiles"] = len(counter)
    print(json.dumps(result))


def _run(proj, case, simulator, fake, target, args, out, expected):
    # The simulator runs a cooperative grid only as one block.
    grid, block = (1, 256) if simulator or case == "mirror_sum" else (4, 64)
    try:
        proj.kernel(target)[grid, block](*args(out))
        if fake:  # nothing ran: reaching the driver with the right arguments is the test
            return True
        return bool(np.allclose(out, expected, rtol=1e-5, atol=1e-5)) or \
            f"got {out.ravel()[:4]}, expected {np.ravel(expected)[:4]}"
    except Exception as exc:  # noqa: BLE001 - report every case
        return f"{type(exc).__name__}: {exc}"


def _fake_driver(proj, arch):
    from kbuild import testing

    return testing.fake_device(arch, proj.store)


def _count_compiles():
    import numba.cuda.compiler as compiler
    import numba.cuda.cudadrv.nvvm as nvvm

    calls = []
    for module, name in ((compiler, "compile_cuda"), (nvvm, "compile_ir")):
        original = getattr(module, name)
        setattr(module, name, lambda *a, _o=original, **k: calls.append(1) or _o(*a, **k))
    return calls


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[4] if sys.argv[3:4] == ["--fake-driver"] else None)
