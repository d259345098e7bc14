"""Compile equivalence: kbuild's PTX for a target has the float semantics of numba's own JIT.

For every kernel form of a small matrix project and of the examples, crossed with the
options that change generated code (`fastmath` True or a set of flags, with numba's
default link-time optimisation and with `lto=False`, `opt`, `max_registers`, `lineinfo`,
`debug`, and `NUMBA_OPT` in the environment), `kbuild build` (separate compilation and
nvJitLink's link-time optimisation, the default) and numba's JIT of the same kernel and
types (its dispatcher, compiling for the device of a fake driver: numba's own pipeline,
nothing of kbuild's) must give PTX with:

- the same `.target`;
- the same set of floating-point instruction variants: opcode with every modifier
  (rounding `.rn`/`.rz`..., `.ftz`, `.approx`/`.full`, `.sat`), e.g. `cvt.rn.ftz.f32.f64`;
- the same set of floating-point immediates (`0f3FC00000`, `0d...`).

numba's side is the PTX of the program numba's `get_cubin` assembles and loads: with the
kernel's `lto` option on (numba-cuda's default where nvJitLink is installed) the PTX
after its link-time optimisation, whose float semantics are nvJitLink's defaults (no
`.ftz` even under `fastmath=True`: on an H100, numba's JIT keeps denormals there, see
tests/test_gpu_fastmath.py); else NVVM's PTX (`inspect_asm`). The PTX before numba's
link is never launched.

Sets, not counts or order: separate compilation inlines callees at link time rather than
in NVVM's whole-program pass, so the same instructions may appear a different number of
times (a callee's body once per call site or once as a function), which changes no
result. A variant present on one side only is another rounding or denormal behaviour.
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import blob_bytes, blob_files, copy_examples
from support import REPO_ROOT
from support import run as run_process

ARCH, CC = "sm_90", (9, 0)

# The matrix project's kernels (a kernel calling a device function, float32 and float64
# math, a comparison against a denormal constant), one set per entry of an OPTIONS table
# that follows them: `forms` makes the module for a backend's `cuda` (numba-cuda-mlir's
# matrix, test_mlir_equivalence.py, has its own options and a linked kernel).
KERNELS = '''
SCALE = np.float32(1.5)
TINY = np.float32(1e-39)  # a float32 denormal: flushed to zero under ftz


@cuda.jit(device=True)
def helper(v):
    return math.sqrt(v) / (v + SCALE)


@cuda.jit(device=True)
def blend(a, b):
    return a * 0.25 + b / 3.0


def _kernels(suffix, options):
    def calls(x, y):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = helper(x[i]) + x[i] * 0.5

    def plain(x, y):
        i = cuda.grid(1)
        if i < x.size:
            v = x[i]
            y[i] = v / 7.0 + math.exp(v) - (1.0 if v == TINY else 0.0)

    def doubles(x, y):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = blend(x[i], math.sqrt(x[i])) + math.log(x[i] + 1.0)

    found = {}
    for function in (calls, plain, doubles):
        name = f"{function.__name__}_{suffix}"
        function.__name__ = function.__qualname__ = name
        # The function-first form: numba-cuda's decorator factory (`cuda.jit(**options)`)
        # drops `lto`, so `lto=False` holds only here (or with signatures).
        found[name] = cuda.jit(function, **options)
    return found
'''


def forms(cuda_import: str, rest: str, imports: str = "import math\n") -> str:
    """The matrix module: `imports`, numpy, `cuda_import`, KERNELS, then `rest` (its OPTIONS
    table and what else the module holds)."""
    return f"\n{imports}\nimport numpy as np\n{cuda_import}\n{KERNELS}{rest}"


FORMS = forms("from numba import cuda", '''

OPTIONS = {
    "default": {},
    "fastmath": {"fastmath": True},
    "fastnolto": {"fastmath": True, "lto": False},
    "fastflags": {"fastmath": {"nsz", "arcp", "contract", "afn", "reassoc"}},
    "noopt": {"opt": False},
    "maxreg": {"max_registers": 32},
    "lineinfo": {"lineinfo": True},
    "fastlineinfo": {"fastmath": True, "lineinfo": True},
    "debug": {"debug": True, "opt": False},
}
for _suffix, _options in OPTIONS.items():
    globals().update(_kernels(_suffix, _options))
''')

SIGNATURES = {"calls": "void(float32[::1], float32[::1])",
              "plain": "void(float32[::1], float32[::1])",
              "doubles": "void(float64[::1], float64[::1])"}
SUFFIXES = ["default", "fastmath", "fastnolto", "fastflags", "noopt", "maxreg", "lineinfo",
            "fastlineinfo", "debug"]

# numba's JIT under a fake device of CC: for each (module:attr, signature) the PTX its
# get_cubin assembles and the cubin it loads (hex), from one compile.
NUMBA_JIT = '''
import json, importlib, sys
from kbuild import testing
from kbuild.backend.backends import DEFAULT, get

wanted = json.loads(sys.argv[1])
out = {}
cc = tuple(json.loads(sys.argv[2]))
# The fake device stands in for the GPU and pins numba-cuda to its arch: numba's
# device-function typing asks the current device's compute capability (the same cc).
with testing.fake_device("sm_%d%d" % cc, record=False):
    for name, signature in wanted:
        module_name, _, attr = name.partition(":")
        kernel = module = importlib.import_module(module_name)
        for part in attr.split("."):
            kernel = getattr(kernel, part)
        # The signature text read as kbuild.toml's is (the module's dtypes by name); the
        # compile is numba's dispatcher's own.
        args, _ = get(DEFAULT).parse_signature(signature, module)
        kernel.compile(tuple(args))
        # What numba's get_cubin assembles: after its link-time optimisation when the
        # kernel's lto option is on, NVVM's PTX otherwise; and the cubin it loads on a
        # device of cc (LTO-IR through nvJitLink when lto is on).
        library = kernel.overloads[tuple(args)].library
        cubin = library.get_cubin(cc=cc)
        out[name + " " + signature] = {
            "ptx": (library.get_lto_ptx(cc=cc) if library._lto
                    else kernel.inspect_asm(tuple(args))),
            "cubin": bytes(getattr(cubin, "code", cubin)).hex()}
print(json.dumps(out))
'''


_FLOAT_OP = re.compile(
    r"^\s*(?:@!?%p\d+\s+)?((?:add|sub|mul|div|fma|mad|sqrt|rsqrt|rcp|cvt|setp|set|min|max|abs"
    r"|neg|ex2|lg2|sin|cos|tanh|testp|copysign|frc|cvta)\.[\w.]*\.f(?:16|32|64)\w*(?:\.\w+)*)",
    re.M)
_IMMEDIATE = re.compile(r"\b0[fd][0-9A-F]{8,16}\b")
_TARGET = re.compile(r"^\s*\.target\s+(\w+)", re.M)


def semantics(ptx: str) -> dict:
    """What of a PTX text decides float results: its arch, its FP instruction variants and
    its FP immediates."""
    return {"target": sorted(set(_TARGET.findall(ptx))),
            "float ops": sorted(set(_FLOAT_OP.findall(ptx))),
            "immediates": sorted(set(_IMMEDIATE.findall(ptx)))}


def _kbuild_side(result, store, kind: str) -> dict:
    """'module:attr signature' -> the stored blob of `kind` of each target of a build."""
    blobs = blob_files(store)
    out = {}
    for row in result.json["targets"]:
        assert row["status"] in ("built", "cached"), row
        out[row["target"] + " " + row["signature"]] = \
            blob_bytes(blobs[row["artifacts"][kind]])
    return out


def _kbuild_ptx(result, store) -> dict:
    return {name: ptx.decode() for name, ptx in _kbuild_side(result, store, "ptx").items()}


def _numba_side(project, home, wanted, env=None) -> dict:
    """'module:attr signature' -> {"ptx": text, "cubin": hex}: numba's JIT (NUMBA_JIT)."""
    result = run_process(json.dumps(wanted), json.dumps(list(CC)), cwd=project, home=home,
                         launcher=("-c", NUMBA_JIT), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def _ptx_of(numba: dict) -> dict:
    return {name: side["ptx"] for name, side in numba.items()}


_SASS = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", re.M)
_SYMBOL = re.compile(r"_Z\w+|\$[\w$.]+")


def machine_code(cubin: bytes) -> list:
    """A cubin's SASS instructions in order, symbol names (content-named by kbuild,
    counted by numba) and addresses set aside."""
    from kbuild.backend import disassemble

    return [_SYMBOL.sub("SYM", ins) for ins in _SASS.findall(disassemble(cubin))]


def _compare(kbuild: dict, numba: dict) -> list:
    """(name, field, kbuild's, numba's) for each `semantics` field where two PTX texts of
    a target differ."""
    assert sorted(kbuild) == sorted(numba)
    return [(name, field, a[field], b[field])
            for name in sorted(kbuild)
            for a, b in [(semantics(kbuild[name]), semantics(numba[name]))]
            for field in a if a[field] != b[field]]


def _matrix_project(tmp_path):
    project = tmp_path / "proj"
    (project / "eq").mkdir(parents=True)
    (project / "eq" / "__init__.py").write_text("")
    (project / "eq" / "forms.py").write_text(textwrap.dedent(FORMS))
    lines = ["[project]", 'name = "eq"', 'paths = ["."]', f'arch = ["{ARCH}"]', ""]
    wanted = []
    for suffix in SUFFIXES:
        for base, signature in SIGNATURES.items():
            name = f"eq.forms:{base}_{suffix}"
            lines += [f'[kernels."{name}"]', f'signatures = ["{signature}"]', ""]
            wanted.append((name, signature))
    (project / "kbuild.toml").write_text("\n".join(lines))
    return project, wanted


@dataclass
class Matrix:
    """The matrix project built by `kbuild build` in one environment, and numba's JIT of
    each of its targets there (`_numba_side`)."""

    built: object
    store: Path
    numba: dict


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """env -> its Matrix, made once per worker that asks for it: the float semantics and
    the machine code of the default environment's targets are checked on one build and
    one JIT."""
    made = {}

    def get(env: dict) -> Matrix:
        name = json.dumps(env, sort_keys=True)
        if name not in made:
            project, wanted = _matrix_project(tmp_path_factory.mktemp("matrix"))
            home, store = project.parent / "home", project.parent / "store"
            built = run_process("build", "--json", cwd=project, home=home, store=store,
                                env=env)
            assert built.returncode == 0, built.stdout + built.stderr
            made[name] = Matrix(built, store, _numba_side(project, home, wanted, env))
        return made[name]

    return get


@pytest.mark.parametrize("env", [{}, {"NUMBA_OPT": "0"}], ids=["env-default", "NUMBA_OPT=0"])
def test_every_option_of_the_matrix_has_numbas_float_semantics(matrix, env):
    made = matrix(env)
    links = {r["target"]: r["link"] for r in made.built.json["targets"]}
    # Separate compilation is what is checked: the plain options link from objects (under
    # NUMBA_OPT=0 every kernel is one program, as opt=False kernels are).
    expected = "whole" if env else "lto"
    assert links["eq.forms:calls_fastmath"] == links["eq.forms:calls_default"] == expected
    assert _compare(_kbuild_ptx(made.built, made.store), _ptx_of(made.numba)) == []


def test_every_option_of_the_matrix_has_numbas_machine_code(matrix):
    """Stronger than the float semantics: the cubin kbuild stores for each target has the
    machine code of the cubin numba's dispatcher makes and loads for the same kernel,
    instruction for instruction (symbol names aside): the kernels linked from separately
    compiled objects (with and without `lto`), and those kept as one program (`opt=False`,
    `lineinfo`, `debug`)."""
    made = matrix({})
    assert _machine_code_differs(made.built, made.store, made.numba) == []


def _machine_code_differs(built, store, numba: dict) -> list:
    """The targets whose stored cubin's machine code is not that of numba's own cubin."""
    ours = {name: machine_code(cubin)
            for name, cubin in _kbuild_side(built, store, "cubin").items()}
    theirs = {name: machine_code(bytes.fromhex(side["cubin"])) for name, side in numba.items()}
    assert sorted(ours) == sorted(theirs)
    assert all(len(code) > 10 for code in ours.values())
    return [name for name in sorted(ours) if ours[name] != theirs[name]]


def test_the_examples_have_numbas_float_semantics(tmp_path):
    project = copy_examples(REPO_ROOT, tmp_path / "proj")
    home, store = tmp_path / "home", tmp_path / "store"
    built = run_process("build", "--json", "--arch", ARCH, cwd=project, home=home, store=store)
    assert built.returncode == 0, built.stdout + built.stderr
    wanted = [(r["target"], r["signature"]) for r in built.json["targets"]]
    numba = _numba_side(project, home, wanted)
    assert _compare(_kbuild_ptx(built, store), _ptx_of(numba)) == []
    assert _machine_code_differs(built, store, numba) == []


@pytest.mark.parametrize("kernel, ftz", [("calls_fastmath", False), ("calls_fastnolto", True)])
def test_a_fastmath_link_has_the_denormal_behaviour_numba_launches(tmp_path, kernel, ftz):
    """A fastmath kernel calling a device function, linked from separately compiled
    objects. numba links a kernel whose `lto` option is on (its default) with nvJitLink's
    own float defaults, so the binary it launches keeps denormals (`cvt.f64.f32`) though
    its PTX before the link says `cvt.ftz.f64.f32`; kbuild's link does the same. With
    `lto=False` numba assembles NVVM's `.ftz` PTX, and kbuild's link keeps `.ftz`."""
    project, wanted = _matrix_project(tmp_path)
    home, store = tmp_path / "home", tmp_path / "store"
    built = run_process("build", "--json", f"eq.forms:{kernel}", cwd=project, home=home,
                        store=store)
    assert built.returncode == 0, built.stdout + built.stderr
    assert built.json["targets"][0]["link"] == "lto"
    (ptx,) = _kbuild_ptx(built, store).values()
    ops = semantics(ptx)["float ops"]
    if ftz:
        assert "cvt.ftz.f64.f32" in ops and "cvt.f64.f32" not in ops, ops
    else:
        assert "cvt.f64.f32" in ops and "cvt.ftz.f64.f32" not in ops, ops


LINKING = '''
import math
import os

import numpy as np
from numba import cuda

CU = os.path.join(os.path.dirname(__file__), "scaled.cu")
scaled = cuda.declare_device("scaled", "float32(float32, float32)")


def linking(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = scaled(x[i], np.float32(1.5)) / x[i] + math.sqrt(np.float64(x[i]))


def syncing(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = 1.0 / x[i] + math.sqrt(np.float64(x[i]))
    cuda.cg.this_grid().sync()


linking = cuda.jit(linking, link=[CU], fastmath=True)
syncing = cuda.jit(syncing, fastmath=True)
'''


def test_a_program_linking_files_stores_the_ptx_numba_launches(tmp_path):
    """A fastmath kernel kept as one program because it links a file (`link=[.cu]`) or
    cudadevrt (a grid sync): its stored PTX, which a device newer than its arch links
    with those files, has the float semantics of the program numba launches (its LTO
    link's: no `.ftz`), not those of NVVM's PTX before the link; and it still links with
    them, for its arch and a newer one."""
    from kbuild.backend.loader import link_ptx

    project = tmp_path / "proj"
    (project / "lk").mkdir(parents=True)
    (project / "lk" / "__init__.py").write_text("")
    (project / "lk" / "forms.py").write_text(textwrap.dedent(LINKING))
    (project / "lk" / "scaled.cu").write_text(
        'extern "C" __device__ int scaled(float* out, float a, float b)\n'
        "{ *out = a * b; return 0; }\n")
    wanted = [(f"lk.forms:{name}", SIGNATURES["calls"]) for name in ("linking", "syncing")]
    lines = ["[project]", 'name = "lk"', 'paths = ["."]', f'arch = ["{ARCH}"]', ""]
    for name, signature in wanted:
        lines += [f'[kernels."{name}"]', f'signatures = ["{signature}"]', ""]
    (project / "kbuild.toml").write_text("\n".join(lines))
    home, store = tmp_path / "home", tmp_path / "store"
    built = run_process("build", "--json", cwd=project, home=home, store=store)
    assert built.returncode == 0, built.stdout + built.stderr
    assert {r["link"] for r in built.json["targets"]} == {"whole"}
    ours = _kbuild_ptx(built, store)
    assert _compare(ours, _ptx_of(_numba_side(project, home, wanted))) == []
    files = {"linking": [str(project / "lk" / "scaled.cu")], "syncing": []}
    for name, ptx in ours.items():
        kernel = name.split()[0].partition(":")[2]
        for cc in (CC, (10, 0)):
            assert link_ptx(ptx.encode(), cc, files[kernel], kernel == "syncing")


def test_numba_force_cuda_cc_chooses_the_arch_built_and_served(tmp_path):
    """numba compiles for NUMBA_FORCE_CUDA_CC's arch (NVVM's `-arch`) and assembles that
    PTX for the device; kbuild under zero-config builds and keys that arch's target and
    assembles its PTX for the device the same way."""
    import zeroconf_support as zc

    root = zc.write_program(tmp_path / "prog")
    env = {"HARNESS_CC": "[9, 0]", "NUMBA_FORCE_CUDA_CC": "8.0"}
    forced = zc.run(root, "kbuild", enable={"store": str(tmp_path / "store")}, env=env)
    assert {arch for _, _, arch, _ in forced["served"]} == {"sm_80"}, forced["stderr"]
    assert forced["counts"]["built"] == 2 and forced["launches"]
    for _, _, _, key in forced["served"]:
        entry = zc.cubin_of(tmp_path / "store", key)  # the stored cubin: sm_80's
        assert entry not in {digest for _, _, digest in forced["loads"]}
    plain = zc.run(root, "kbuild", enable={"store": str(tmp_path / "store")},
                   env={"HARNESS_CC": "[9, 0]"})
    # numba's JIT target on an sm_90 device: the arch-specific sm_90a
    assert {arch for _, _, arch, _ in plain["served"]} == {"sm_90a"}
    assert plain["counts"]["built"] == 2  # another arch, another key


GAINED = '''\
from numba import cuda

GAIN = 2.5


@cuda.jit(device=True)
def gained(v):
    return v * GAIN + 0.625


@cuda.jit
def first(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = gained(x[i])


@cuda.jit
def second(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = gained(x[i]) - 1.0
'''

GAINED_APP = '''\
import numpy as np

import app_kernels as K


def main(device_array, which=()):
    x = device_array(np.arange(64, dtype=np.float32))
    out = device_array(np.zeros(64, np.float32))
    K.first[2, 32](x, out)
    K.GAIN = 3.5  # after numba compiled `gained` for `first`
    K.second[2, 32](x, out)
    with open("second.ptx", "w") as f:
        f.write(K.second.inspect_asm(K.second.signatures[0]))
'''


def test_a_device_function_numba_compiled_is_reused_as_numba_reuses_it(tmp_path):
    """numba compiles `gained` for `first` (GAIN 2.5) and reuses that code for `second`
    after the program sets GAIN = 3.5: `second` computes with 2.5. kbuild, keying
    `second` with today's 3.5, would serve other code: it lets numba compile it, with the
    code numba holds. (When `first` came from the store, numba holds no code for `gained`
    and compiles it with 3.5, as numba does after its own cache served `first`.)"""
    import zeroconf_support as zc

    root = zc.write_program(tmp_path / "prog", kernels=GAINED, app=GAINED_APP)
    reference = zc.run(root, "numba")
    numba_ptx = (root / "second.ptx").read_text()
    assert "0d4004000000000000" in numba_ptx and "0d400C000000000000" not in numba_ptx
    report = zc.run(root, "kbuild", enable={"store": str(tmp_path / "store")})
    assert reference["launches"] and report["counts"]["fallback"] == 1
    assert any("device function gained changed since numba compiled it" in w
               for w in report["warnings"])
    assert semantics((root / "second.ptx").read_text()) == semantics(numba_ptx)
