"""`kbuild init`: a first kbuild.toml from the `@cuda.jit` kernels found in a project's sources.

Sources are read, never imported: a project that does not import yet (the usual state of
one being set up) still gets its file, and nothing of it runs. Eager signatures
(`@cuda.jit("void(float32[::1])")`) are declared as written; a lazy kernel is written
commented out, for its signatures to be filled in. Kernels made at import time are found
too: `k = cuda.jit(sig)(f)`, and `k = make_kernel(...)` where `make_kernel` is a module
function that returns a kernel it defines (a factory); so are kernels in class bodies
(`@staticmethod` + `@cuda.jit`, declared as `module:Class.kernel`). A module whose `cuda` is
numba-cuda-mlir's (`from numba_cuda_mlir import cuda`) holds numba-cuda-mlir kernels: the
file names that backend for them (for the project when every kernel found is one).
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path

from .config import CONFIG_NAME
from .errors import ConfigError

MLIR_BACKEND = "numba-cuda-mlir"
_MLIR_PACKAGE = "numba_cuda_mlir"

# Folders that hold no project kernels, or that a walk must not enter.
SKIP_DIRS = {"build", "dist", "node_modules", "site-packages", "tests", "test", "benchmarks",
             "docs"}


@dataclass(frozen=True)
class FoundKernel:
    """A `@cuda.jit` kernel in a source file, with the signatures its decorator declares."""

    name: str  # module:function
    signatures: tuple[str, ...]
    where: str  # file:line, relative to the root
    params: int | None = None  # how many arguments the kernel takes, when known
    backend: str | None = None  # MLIR_BACKEND for a numba-cuda-mlir kernel (None: numba-cuda)


def find_kernels(root: Path, folders=()) -> list[FoundKernel]:
    """Every kernel under `folders` (default: all of `root`), in path then line order."""
    found = []
    for path in _sources(root, folders):
        found.extend(_kernels_in(root, path))
    return found


def _sources(root: Path, folders):
    starts = [_start(root, f) for f in folders] or [root]
    for start in starts:
        if start.is_file():
            yield start
            continue
        for folder, dirs, files in os.walk(start):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__"))
                             and d not in SKIP_DIRS
                             and not (Path(folder) / d / "pyvenv.cfg").exists())
            yield from (Path(folder) / f for f in sorted(files) if f.endswith(".py"))


def _start(root: Path, given: str) -> Path:
    """A folder or file to search, named by path (`src/pkg`, `pkg/mod.py`) or as Python
    names it (`pkg`, `pkg.mod`)."""
    path = root / given
    if path.exists():
        return path
    parts = given.split(".")
    if all(p.isidentifier() for p in parts):
        dotted = root.joinpath(*parts)
        for candidate in (dotted, dotted.with_name(dotted.name + ".py")):
            if candidate.exists():
                return candidate
    raise ConfigError(f"init: {given} is not a folder, a Python file or a module under "
                      f"{root}; name a package folder (kbuild init src/pkg) or a module "
                      "(kbuild init pkg.kernels)")


def _kernels_in(root: Path, path: Path) -> list[FoundKernel]:
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError):
        return []  # not ours to judge here; the build will say what is wrong with it
    module = _module_name(root, path)
    if module is None:
        return []
    statements = list(_module_statements(tree.body))
    spelling = _Spelling(_jit_names(tree), {n.name: n for n in statements if _is_def(n)})
    spelling.factories.update(_factories(statements, spelling))
    backend = MLIR_BACKEND if _imports_mlir(tree) else None
    kernels = []
    for node, prefix in _with_class_bodies(statements):  # kbuild targets are attributes
        for name, made in _declared_kernels(node, spelling):
            where = f"{path.relative_to(root)}:{node.lineno}"
            kernels.append(FoundKernel(f"{module}:{prefix}{name}", made.signatures, where,
                                       made.params, backend))
    return kernels


def _with_class_bodies(statements, prefix: str = ""):
    """(statement, attribute prefix): the module's own, and those of the classes it defines
    (`class Filters:` with a `@staticmethod @cuda.jit def smooth` gives `Filters.smooth`),
    nested classes too."""
    for node in statements:
        if isinstance(node, ast.ClassDef):
            yield from _with_class_bodies(_module_statements(node.body),
                                          f"{prefix}{node.name}.")
        else:
            yield node, prefix


def _imports_mlir(tree) -> bool:
    """Whether the module takes its `cuda` (or `jit`) from numba-cuda-mlir."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").partition(".")[0] \
                == _MLIR_PACKAGE:
            return True
        if isinstance(node, ast.Import) and any(a.name.partition(".")[0] == _MLIR_PACKAGE
                                                for a in node.names):
            return True
    return False


@dataclass(frozen=True)
class _Made:
    """What one kernel-making statement declares."""

    signatures: tuple  # () when lazy
    params: int | None  # the kernel function's argument count, when its def is seen


@dataclass
class _Spelling:
    """How one module makes kernels: its names for `cuda.jit`, its module-level functions,
    and those of them that return a kernel they define (factory -> `_Made`)."""

    jit_names: set
    functions: dict  # name -> def node
    factories: dict = field(default_factory=dict)


def _is_def(node) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))


def _module_statements(body):
    """A module's top-level statements, looking into `if`/`try`/`with` blocks (a kernel
    defined under `if cuda.is_available():` is still a module attribute)."""
    for node in body:
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody"):
                yield from _module_statements(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                yield from _module_statements(handler.body)
        else:
            yield node


def _declared_kernels(node, spelling: _Spelling):
    """(attribute name, `_Made`) of the kernels a statement makes: `@cuda.jit def k`,
    `k = cuda.jit(sig)(f)` / `k = cuda.jit(f)`, or `k = factory(...)`."""
    if _is_def(node):
        for decorator in node.decorator_list:
            signatures = _kernel_signatures(decorator, spelling.jit_names)
            if signatures is not None:
                return [(node.name, _Made(signatures, _arity(node)))]
        return []
    if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
        return []
    names = [t.id for t in node.targets if isinstance(t, ast.Name)]
    made = _made_kernel(node.value, spelling)
    if made is not None:
        return [(name, made) for name in names]
    # `ns = SimpleNamespace(func=make_kernel(3.0))`: the kernel is reached as `ns.func`.
    return [(f"{name}.{keyword.arg}", made) for keyword in node.value.keywords
            if keyword.arg and isinstance(keyword.value, ast.Call)
            and (made := _made_kernel(keyword.value, spelling)) is not None
            for name in names]


def _made_kernel(call: ast.Call, spelling: _Spelling):
    """The `_Made` of the kernel a call makes, or None when it makes none."""
    called = _dotted(call.func)
    if called in spelling.factories:
        return spelling.factories[called]
    function = spelling.functions.get(call.args[0].id) \
        if call.args and isinstance(call.args[0], ast.Name) else None
    if isinstance(call.func, ast.Call) and _dotted(call.func.func) in spelling.jit_names:
        decorator = call.func  # cuda.jit("sig", ...)(f)
    elif called in spelling.jit_names and function is not None:
        decorator = ast.Call(call.func, [], call.keywords)  # cuda.jit(f): lazy
    else:
        return None
    signatures = _kernel_signatures(decorator, spelling.jit_names)
    return None if signatures is None else _Made(signatures, function and _arity(function))


def _arity(function) -> int | None:
    args = function.args
    if args.vararg or args.kwarg:
        return None
    return len(args.posonlyargs) + len(args.args)


def _factories(statements, spelling: _Spelling) -> dict:
    """Module-level functions that return a kernel they define: name -> its `_Made`."""
    found = {}
    for node in filter(_is_def, statements):
        made = {}
        for inner in ast.walk(node):
            if inner is not node:
                made.update(_declared_kernels(inner, _Spelling(spelling.jit_names, {})))
        returned = [r.value.id for r in ast.walk(node)
                    if isinstance(r, ast.Return) and isinstance(r.value, ast.Name)]
        kernels = [made[name] for name in returned if name in made]
        if kernels:
            found[node.name] = kernels[0]
    return found


def _module_name(root: Path, path: Path) -> str | None:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


# What a kernel decorator is, whatever a module calls it.
_JIT_TARGETS = ("numba.cuda.jit", f"{_MLIR_PACKAGE}.cuda.jit")


def _jit_names(tree) -> set[str]:
    """Every dotted spelling this module has for numba-cuda's (or numba-cuda-mlir's) jit:
    `cuda.jit`, `numba.cuda.jit`, and whatever its imports and module-level assignments
    bind to it or to a module above it (`import numba as nb` gives `nb.cuda.jit`;
    `from numba import cuda as cu`, `cu.jit`; `from numba.cuda import jit as kjit`, `kjit`;
    `jit = nb.cuda.jit`, `jit`)."""
    aliases = {"cuda": "numba.cuda"}  # the usual spelling, even when imported conditionally
    aliases.update(_bindings(tree))
    for _ in range(len(aliases)):  # an alias of an alias: follow each chain to its end
        resolved = {name: _resolve(target, aliases, name) for name, target in aliases.items()}
        if resolved == aliases:
            break
        aliases = resolved
    names = set(_JIT_TARGETS)
    for name, target in aliases.items():
        for jit in _JIT_TARGETS:
            if jit == target or jit.startswith(target + "."):
                names.add(name + jit[len(target):])
    return names


def _bindings(tree) -> dict:
    """Local name -> the dotted name it is bound to, from imports and from module-level
    `name = dotted.name` assignments."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:  # `import numba.cuda` binds `numba`
                    top = alias.name.partition(".")[0]
                    bound.setdefault(top, top)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in tree.body:
        if isinstance(node, ast.Assign) and _dotted(node.value):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    bound[target.id] = _dotted(node.value)
    return bound


def _resolve(dotted: str, aliases: dict, own: str) -> str:
    """`dotted` with its first part replaced by what that name is bound to."""
    head, dot, rest = dotted.partition(".")
    if head == own and not dot or head not in aliases or aliases[head] == head:
        return dotted
    return aliases[head] + dot + rest


def _kernel_signatures(decorator, jit_names) -> tuple[str, ...] | None:
    """The declared signatures of a `@cuda.jit` kernel decorator (() when lazy), or None
    when the decorator is not one, or makes a device function."""
    call = decorator if isinstance(decorator, ast.Call) else None
    target = call.func if call else decorator
    if _dotted(target) not in jit_names:
        return None
    if call is None:
        return ()
    for keyword in call.keywords:
        if keyword.arg == "device" and not (isinstance(keyword.value, ast.Constant)
                                            and keyword.value.value is False):
            return None
    if not call.args:
        return ()
    first = call.args[0]
    items = first.elts if isinstance(first, (ast.List, ast.Tuple)) else [first]
    return tuple(i.value if isinstance(i, ast.Constant) and isinstance(i.value, str)
                 else ast.unparse(i) for i in items)


def _dotted(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def render(name: str, archs, kernels) -> str:
    """The kbuild.toml text for `kernels`: eager ones declared, lazy ones commented out."""
    lines = ["[project]", f"name = {_quote(name)}", 'paths = ["."]',
             f"arch = [{', '.join(_quote(a) for a in archs)}]"]
    everyone = {kernel.backend for kernel in kernels}
    if everyone == {MLIR_BACKEND}:
        lines.append(f"backend = {_quote(MLIR_BACKEND)}")
    lines.append("")
    for kernel in kernels:
        body = [f'[kernels."{kernel.name}"]']
        if kernel.backend and len(everyone) > 1:
            body.append(f"backend = {_quote(kernel.backend)}")
        if kernel.signatures:
            body.append("signatures = [" + ", ".join(_quote(s) for s in kernel.signatures)
                        + "]")
            lines += body
        else:
            example = ", ".join(["float32[::1]"] * (kernel.params or 1))
            lines += [f"# {kernel.where}: a lazy kernel; declare the signatures it is "
                      "launched with", *("# " + line for line in body),
                      f'# signatures = ["void({example})"]']
        lines.append("")
    return "\n".join(lines)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_config(root: Path, folders, archs, force: bool = False) -> dict:
    """Write `root`/kbuild.toml from the kernels found; refuse to overwrite one unless forced."""
    path = root / CONFIG_NAME
    if path.exists() and not force:
        raise ConfigError(f"init: {path} exists; edit it, or pass --force to write it again")
    kernels = find_kernels(root, folders)
    if not kernels:
        raise ConfigError(f"init: no @cuda.jit kernel in {', '.join(folders) or root}; "
                          "name the package that holds them (kbuild init PACKAGE)")
    path.write_text(render(root.name, archs, kernels), encoding="utf-8")
    eager = [k for k in kernels if k.signatures]
    return {"file": str(path), "kernels": [k.name for k in eager],
            "lazy": [k.name for k in kernels if not k.signatures], "next": _next_step(eager)}


def _next_step(eager) -> str:
    """What to run after init: with every kernel lazy the file declares no target yet,
    so `kbuild status` has nothing to read; the signatures come first."""
    if eager:
        return "kbuild status, then kbuild build"
    return ("declare the lazy kernels' signatures in kbuild.toml (uncomment their tables), "
            "or record them from a run: kbuild run --record -- python -m pytest; "
            "then kbuild build")
