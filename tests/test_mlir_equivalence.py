"""Compile equivalence for numba-cuda-mlir: kbuild's bytes for a target are what
numba-cuda-mlir's own JIT loads for the same kernel and types.

numba-cuda-mlir's C++ launcher asks its dispatcher's `_compile_impl(args)` for a kernel
it does not hold and loads the cubin it returns, `cres.metadata["cubin"]`: made by
`mlir_optimization.optimize` with nvJitLink for the resolved linker arch (`sm_90` on an
H100, no `a`/`f` suffix unless `chip` names one), `opt_level`, `max_registers`,
`ptxas_options`, `-g`/`-lineinfo`, and no float flags of its own (`fastmath` is given to
NVVM only, `_nvvm_options`). Whether that link is an LTO link is the
kernel's `lto` option (its decorator's default is False; `resolve_link_plan`): with
`lto=True` NVVM makes LTO-IR and nvJitLink's LTO makes the cubin (the PTX it assembles
is `get_lto_ptx`'s), else NVVM's PTX is what nvJitLink assembles.

For a small project (a kernel calling a device function, float32 and float64 math:
sqrt, exp, log, division, a comparison against a denormal constant) crossed with the
options of numba-cuda-mlir's `cuda.jit` that change code (`fastmath`, `lto`,
`opt=False`, `max_registers`, `lineinfo`, `debug`, `launch_bounds`, `ptxas_options`; its
`fastmath` takes a bool only, no set of flags; upstream's link refuses `opt_level=1`),
with and without `NUMBA_OPT=0`, and a kernel linking a `.cu` file (LTO-IR from NVRTC, so
an LTO link with `lto` off), `kbuild build` must store, per target:

- PTX with the float semantics of the PTX the JIT assembles (`test_equivalence.semantics`:
  arch, FP instruction variants, FP immediates);
- a cubin with the JIT's machine code instruction for instruction (nvdisasm, symbol
  names aside: `test_equivalence.machine_code`).

The JIT runs in a subprocess under `kbuild.testing.fake_device("sm_90")`, nothing of
kbuild's in its compile (no content names, no pinned callee names).
"""

from __future__ import annotations

import json
import textwrap

import pytest

from conftest import blob_bytes, blob_files, copy_examples
from mlir_support import MLIR, needs_mlir, port
from support import REPO_ROOT
from support import run as run_process
from test_equivalence import SIGNATURES, forms, machine_code, semantics

pytestmark = needs_mlir

ARCH = "sm_90"

FORMS = forms("from numba_cuda_mlir import cuda", '''

OPTIONS = {
    "default": {},
    "fastmath": {"fastmath": True},
    "lto": {"lto": True},
    "fastlto": {"fastmath": True, "lto": True},
    "nolto": {"lto": False},
    "noopt": {"opt": False},
    "maxreg": {"max_registers": 32},
    "lineinfo": {"lineinfo": True},
    "fastlineinfo": {"fastmath": True, "lineinfo": True},
    "debug": {"debug": True, "opt": False},
    "bounds": {"launch_bounds": (128, 2)},
    "ptxas": {"ptxas_options": "-O1"},
}
for _suffix, _options in OPTIONS.items():
    globals().update(_kernels(_suffix, _options))

# CUDA C linked from a file: compiled by NVRTC to LTO-IR, so the kernel is compiled to
# LTO-IR and linked by nvJitLink's LTO although its `lto` option is off.
scaled = cuda.declare_device("scaled", "float32(float32, float32)")
CU = os.path.join(os.path.dirname(__file__), "scaled.cu")


def _linked(suffix, options):
    def linked(x, y):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = scaled(x[i], SCALE) / 3.0

    name = linked.__name__ = linked.__qualname__ = f"linked_{suffix}"
    return {name: cuda.jit(linked, link=[CU], **options)}


for _suffix in ("default", "fastmath"):
    globals().update(_linked(_suffix, OPTIONS[_suffix]))
''', imports="import math\nimport os\n")

SCALED_CU = ('extern "C" __device__ int scaled(float* out, float a, float b)\n'
             "{ *out = a * b + 1e-39f; return 0; }\n")

SUFFIXES = ["default", "fastmath", "lto", "fastlto", "nolto", "noopt", "maxreg",
            "lineinfo", "fastlineinfo", "debug", "bounds", "ptxas"]
LINKED = ["default", "fastmath"]

# numba-cuda-mlir's JIT under a fake device of the arch: for each (module:attr, signature)
# the cubin its launcher loads (hex) and the PTX that cubin was assembled from.
MLIR_JIT = '''
import json, importlib, sys
from kbuild import testing
from kbuild.backend.backends import get

wanted = json.loads(sys.argv[1])
out = {}
with testing.fake_device(sys.argv[2], record=False, compilers=("numba-cuda-mlir",)):
    from numba_cuda_mlir import descriptor
    from numba_cuda_mlir.mlir_optimization import get_lto_ptx
    for name, signature in wanted:
        module_name, _, attr = name.partition(":")
        kernel = module = importlib.import_module(module_name)
        for part in attr.split("."):
            kernel = getattr(kernel, part)
        args, _ = get("numba-cuda-mlir").parse_signature(signature, module)
        # What its C++ launcher asks for arguments of these types (`_launch` hands their
        # types over in `_compile_arg_types`), and loads.
        descriptor._compile_arg_types.types = tuple(args)
        descriptor._compile_arg_types.values = (None,) * len(args)
        cubin, entry, _ = kernel._compile_impl((None,) * len(args))
        del descriptor._compile_arg_types.types, descriptor._compile_arg_types.values
        (cres,) = [c for sig, c in kernel.overloads.items() if tuple(sig) == tuple(args)]
        lto = cres.metadata["link_plan"].compile_new_inputs_as_ltoir
        ptx = get_lto_ptx(cres.cres) if lto else cres.metadata["ptx"]
        out[name + " " + signature] = {"cubin": bytes(cubin).hex(), "ptx": ptx, "lto": lto}
print(json.dumps(out))
'''


def _project(tmp_path):
    project = tmp_path / "proj"
    (project / "mq").mkdir(parents=True)
    (project / "mq" / "__init__.py").write_text("")
    (project / "mq" / "forms.py").write_text(textwrap.dedent(FORMS))
    lines = ["[project]", 'name = "mq"', f'backend = "{MLIR}"', 'paths = ["."]',
             f'arch = ["{ARCH}"]', ""]
    (project / "mq" / "scaled.cu").write_text(SCALED_CU)
    wanted = [(f"mq.forms:{base}_{suffix}", signature)
              for suffix in SUFFIXES for base, signature in SIGNATURES.items()]
    wanted += [(f"mq.forms:linked_{suffix}", SIGNATURES["plain"]) for suffix in LINKED]
    for name, signature in wanted:
        lines += [f'[kernels."{name}"]', f'signatures = ["{signature}"]', ""]
    (project / "kbuild.toml").write_text("\n".join(lines))
    return project, wanted


def _kbuild_side(built, store) -> dict:
    blobs = blob_files(store)
    out = {}
    for row in built.json["targets"]:
        assert row["status"] in ("built", "cached"), row
        out[row["target"] + " " + row["signature"]] = {
            "cubin": blob_bytes(blobs[row["artifacts"]["cubin"]]),
            "ptx": blob_bytes(blobs[row["artifacts"]["ptx"]]).decode()}
    return out


def _differences(ours: dict, theirs: dict) -> tuple:
    """(targets whose cubin has other machine code than the JIT's, (target, field, ours,
    theirs) for each float-semantics field of the PTX that differs)."""
    assert sorted(ours) == sorted(theirs)
    code = {name: (machine_code(ours[name]["cubin"]),
                   machine_code(bytes.fromhex(theirs[name]["cubin"]))) for name in ours}
    assert all(len(mine) > 10 for mine, _ in code.values())
    other_code = [name for name, (mine, jit) in sorted(code.items()) if mine != jit]
    other_semantics = [(name, field, a[field], b[field])
                       for name in sorted(ours)
                       for a, b in [(semantics(ours[name]["ptx"]),
                                     semantics(theirs[name]["ptx"]))]
                       for field in a if a[field] != b[field]]
    return other_code, other_semantics


def _jit_side(project, home, wanted, env=None) -> dict:
    result = run_process(json.dumps(wanted), ARCH, cwd=project, home=home, env=env,
                         launcher=("-c", MLIR_JIT))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.mark.parametrize("env", [{}, {"NUMBA_OPT": "0"}], ids=["env-default", "NUMBA_OPT=0"])
def test_every_option_has_the_machine_code_and_float_semantics_numba_cuda_mlir_loads(
        tmp_path, env):
    project, wanted = _project(tmp_path)
    home, store = tmp_path / "home", tmp_path / "store"
    built = run_process("build", "--json", cwd=project, home=home, store=store, env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    ours, theirs = _kbuild_side(built, store), _jit_side(project, home, wanted, env)
    assert sorted(ours) == sorted(theirs) and len(ours) == len(wanted)
    # The matrix reaches both of its links: LTO-IR through nvJitLink's LTO (asked for, or
    # for linked LTO-IR), and PTX.
    assert sorted(name.split()[0].partition(":")[2] for name, jit in theirs.items()
                  if jit["lto"] and "_lto" not in name and "fastlto" not in name) \
        == ["linked_default", "linked_fastmath"]
    assert sum(jit["lto"] for jit in theirs.values()) == 2 * len(SIGNATURES) + len(LINKED)
    assert _differences(ours, theirs) == ([], [])


def test_the_ported_examples_have_what_numba_cuda_mlir_loads(tmp_path):
    """The examples as a user ports them (the kernels numba-cuda-mlir 0.6.0 compiles)."""
    project = port(copy_examples(REPO_ROOT, tmp_path / "proj"))
    home, store = tmp_path / "home", tmp_path / "store"
    built = run_process("build", "--json", "--arch", ARCH, cwd=project, home=home,
                        store=store)
    assert built.returncode == 0, built.stdout + built.stderr
    wanted = [(row["target"], row["signature"]) for row in built.json["targets"]]
    assert len(wanted) >= 8
    ours, theirs = _kbuild_side(built, store), _jit_side(project, home, wanted)
    assert _differences(ours, theirs) == ([], [])
