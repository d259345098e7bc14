"""Write a synthetic numba-cuda kernel project for kbuild's benchmarks.

`generate(root, n_kernels, n_modules, n_device_fns)` writes

    ROOT/kbuild.toml          one arch (sm_90), every kernel declared once
    ROOT/synth/__init__.py
    ROOT/synth/consts.py      module-level constants read by device functions
    ROOT/synth/records.py     a record type `Point` (aligned numpy dtype)
    ROOT/synth/devfns.py      `common` (called by every kernel), f00..fKK, a closure factory
    ROOT/synth/mod_XX.py      the kernels, spread evenly over the modules

Kernel i calls `common` and two or three of the fNN (chosen by formula), every
fourth kernel takes an array of `Point`, every fifth calls the closure-made
`scale_half`. The output is a pure function of the arguments: no randomness.

`imports` adds import lines to every kernel module: a project whose modules
import heavy libraries (scipy, say), as real kernel code does, for the no-op
measurement against the time those imports take.

`edit_common(root, variant)` and `edit_kernel(root, i)` make the edits the
benchmark times; each variant of the `common` edit is a different constant, so a
resident `kbuild watch` rebuilds on every one of a series. Each edit changes the
file's size as well as its content (the variants' constants differ in length
too), so Python's pyc check (mtime in whole seconds + size) can never serve the
old bytecode to a process that starts within the same second as the edit.

CLI: python benchmarks/gen_project.py DIR --kernels 64 [--modules 8] [--devfns 16]
                                          [--imports scipy.optimize,...]
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

PACKAGE = "synth"
ARCH = "sm_90"
PLAIN_SIG = "void(float32[::1], float32[::1])"
POINT_SIG = "void(Point[::1], float32[::1])"

COMMON_BODY = "return x * 0.5 + 1.0"
KERNEL_TAIL = "        out[i] = acc\n"
KERNEL_TAIL_EDITED = "        out[i] = acc + 0.5\n"

# Device-function bodies, cycled by index; {a} is a per-function constant.
DEVFN_TEMPLATES = (
    "return x * {a} + BIAS",
    "return math.sqrt(abs(x) + {a})",
    "return x * x - {a} * x",
    "y = x\n    for _ in range(3):\n        y = y * 0.5 + {a}\n    return y",
    "return math.sin(x) * {a} + SCALE",
    "if x > {a}:\n        return x - {a}\n    return x + {a}",
)


def generate(root, n_kernels: int, n_modules: int, n_device_fns: int,
             imports=()) -> Path:
    """Write the project under `root` (created if needed); return `root` as a Path.
    Every kernel module imports the modules named in `imports` as well."""
    if n_kernels < 1 or n_device_fns < 3 or not 1 <= n_modules <= n_kernels:
        raise ValueError("need n_kernels >= 1, n_device_fns >= 3, 1 <= n_modules <= n_kernels")
    root = Path(root)
    pkg = root / PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text('"""A synthetic kernel project (benchmarks/gen_project.py)."""\n')
    (pkg / "consts.py").write_text(consts_source())
    (pkg / "records.py").write_text(records_source())
    (pkg / "devfns.py").write_text(devfns_source(n_device_fns))
    kernels = [kernel_spec(i, n_kernels, n_modules, n_device_fns) for i in range(n_kernels)]
    for m in range(n_modules):
        mine = [k for k in kernels if k["module"] == m]
        (pkg / f"{module_name(m)}.py").write_text(module_source(m, mine, imports))
    (root / "kbuild.toml").write_text(toml_source(kernels))
    return root


def module_name(m: int) -> str:
    return f"mod_{m:02d}"


def kernel_name(i: int) -> str:
    return f"k_{i:04d}"


def kernel_spec(i: int, n_kernels: int, n_modules: int, n_device_fns: int) -> dict:
    """Which module kernel i lives in and what it calls, by formula."""
    callees = [i % n_device_fns, (i * 7 + 3) % n_device_fns]
    if i % 2 == 0:
        callees.append((i * 13 + 5) % n_device_fns)
    callees = list(dict.fromkeys(callees))  # distinct, in order
    return {"index": i, "module": i * n_modules // n_kernels, "callees": callees,
            "record": i % 4 == 3, "closure": i % 5 == 0}


def consts_source() -> str:
    return textwrap.dedent('''\
        """Module-level constants read by the device functions and kernels."""

        SCALE = 0.75
        BIAS = 0.125
        ''')


def records_source() -> str:
    return textwrap.dedent('''\
        """A record type passed to some kernels as an array of points."""

        import numba
        import numpy as np

        POINT_DTYPE = np.dtype([("x", np.float32), ("y", np.float32), ("tag", np.uint8)],
                               align=True)
        Point = numba.from_dtype(POINT_DTYPE)
        ''')


def devfns_source(n_device_fns: int) -> str:
    parts = [textwrap.dedent(f'''\
        """Device functions shared by the synthetic kernels."""

        import math

        from numba import cuda

        from {PACKAGE}.consts import BIAS, SCALE


        @cuda.jit(device=True)
        def common(x):
            {COMMON_BODY}


        def make_scaler(factor):
            """A device function computing x * factor (a closure over `factor`)."""

            @cuda.jit(device=True)
            def scale(x):
                return x * factor

            return scale


        scale_half = make_scaler(0.5)
        ''')]
    for j in range(n_device_fns):
        body = DEVFN_TEMPLATES[j % len(DEVFN_TEMPLATES)].format(a=1.0 + j / 8)
        parts.append(f"\n\n@cuda.jit(device=True)\ndef f{j:02d}(x):\n    {body}\n")
    return "".join(parts)


def module_source(m: int, kernels: list, imports=()) -> str:
    heavy = "".join(f"import {name}  # noqa: F401 - a dependency, as real kernel modules have\n"
                    for name in imports)
    head = textwrap.dedent(f'''\
        """Synthetic kernels, module {m}."""

        from numba import cuda

        from {PACKAGE} import devfns
        from {PACKAGE}.devfns import common, scale_half
        from {PACKAGE}.records import Point  # noqa: F401 - named in kbuild.toml signatures

        GAIN = {1.0 + m / 16}
        ''')
    if heavy:
        head = head.replace("from numba import cuda\n", heavy + "from numba import cuda\n", 1)
    return head + "".join(kernel_source(k) for k in kernels)


def kernel_source(k: dict) -> str:
    """One kernel: `common`, then its callees, then a per-kernel constant factor."""
    i = k["index"]
    first = "p = x[i]\n        v = p.x + p.y" if k["record"] else "v = x[i]"
    lines = [f"{first}", "acc = common(v)"]
    for c in k["callees"]:
        lines.append(f"acc += devfns.f{c:02d}(v) * GAIN")
    if k["closure"]:
        lines.append("acc = scale_half(acc)")
    lines.append(f"acc = acc * {1.0 + (i % 7) / 8}")
    body = "".join(f"        {line}\n" for line in lines)
    return (f"\n\n@cuda.jit\ndef {kernel_name(i)}(x, out):\n    i = cuda.grid(1)\n"
            f"    if i < out.size:\n{body}{KERNEL_TAIL}")


def toml_source(kernels: list) -> str:
    head = textwrap.dedent(f'''\
        # Generated by benchmarks/gen_project.py: {len(kernels)} kernels.
        [project]
        name = "{PACKAGE}"
        paths = ["."]
        arch = ["{ARCH}"]
        ''')
    decls = [f'\n[kernels."{PACKAGE}.{module_name(k["module"])}:{kernel_name(k["index"])}"]\n'
             f'signatures = ["{POINT_SIG if k["record"] else PLAIN_SIG}"]\n' for k in kernels]
    return head + "".join(decls)


# -- the edits the benchmark times -------------------------------------------

def common_edited(variant: int = 0) -> str:
    """The body of `common` after edit `variant`: 1.0 becomes 1.25, 1.125, 1.0625, ...
    (exact in float32, and each constant one character longer than the one before)."""
    return f"return x * 0.5 + {1 + 2.0 ** -(variant + 2)!r}"


def edit_common(root, variant: int = 0) -> tuple[Path, str]:
    """Change the body of `common` (from whichever variant it has now) to `variant`'s;
    return (file, text before the edit) for restoring."""
    path = Path(root) / PACKAGE / "devfns.py"
    text = path.read_text()
    start = text.index("def common(x):\n    ") + len("def common(x):\n    ")
    end = text.index("\n", start)
    new = common_edited(variant)
    if text[start:end] == new:
        raise ValueError(f"common in {path} already has edit {variant}")
    path.write_text(text[:start] + new + text[end:])
    return path, text


def edit_kernel(root, index: int = 0) -> tuple[Path, str]:
    """Change the body of kernel `index`; return (file, original text) for restoring."""
    name = kernel_name(index)
    for path in sorted((Path(root) / PACKAGE).glob("mod_*.py")):
        text = path.read_text()
        start = text.find(f"def {name}(")
        if start >= 0:
            end = text.find("\n@cuda.jit", start)
            block = text[start:] if end < 0 else text[start:end]
            if block.count(KERNEL_TAIL) != 1:
                raise ValueError(f"kernel {name} in {path} is already edited")
            edited = block.replace(KERNEL_TAIL, KERNEL_TAIL_EDITED)
            path.write_text(text[:start] + edited + text[start + len(block):])
            return path, text
    raise ValueError(f"kernel {name} not found under {root}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write a synthetic kbuild kernel project.")
    parser.add_argument("dir", help="where to write it (created if needed)")
    parser.add_argument("--kernels", type=int, default=64)
    parser.add_argument("--modules", type=int, default=None,
                        help="default: one module per 8 kernels, at least 2 when possible")
    parser.add_argument("--devfns", type=int, default=16, help="shared device functions fNN")
    parser.add_argument("--imports", default="",
                        help="modules every kernel module imports, comma-separated")
    args = parser.parse_args(argv)
    modules = args.modules or default_modules(args.kernels)
    generate(args.dir, args.kernels, modules, args.devfns,
             [name.strip() for name in args.imports.split(",") if name.strip()])
    print(f"{args.dir}: {args.kernels} kernels in {modules} modules, "
          f"{args.devfns} device functions + common")
    return 0


def default_modules(n_kernels: int) -> int:
    return max(1, min(n_kernels, max(2, n_kernels // 8)))


if __name__ == "__main__":
    raise SystemExit(main())
