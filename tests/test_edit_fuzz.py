"""Random edits, each checked against a fresh build: the net under the edit matrix.

A seeded run edits tests/editproj one random edit at a time (a constant, a name a function
reads, a comment, a blank line, a docstring, a local renamed, two definitions swapped, a
decorator's options, a file put back, an import's aliases swapped, a statement appended
that rebinds or mutates what kernels read, a device function jitted again with other
options) and after each one builds the project into one store, `-j1` or `-j2`, `-k`. Every
target must have the artifacts, or the failure, of a cold build of the same sources in an
empty store, and a second build must compile nothing. The matrices name the cases they
know; this finds the ones nobody wrote down. A failure prints the seed and the edits so far.

A stress test, out of the default run: `python -m pytest -m slow tests/test_edit_fuzz.py`
(`KBUILD_FUZZ_STEPS`, default 25 edits per seed; about 8 seconds an edit on 2 cores, a
cold build each).
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import shutil
from pathlib import Path

import pytest

from support import REPO_ROOT

STEPS = int(os.environ.get("KBUILD_FUZZ_STEPS", "25"))
EDITPROJ = REPO_ROOT / "tests" / "editproj"

# Statements appended to a module of the lab package: what it binds or mutates at import
# is what the kernels that read it compile.
APPENDED = {
    "kernels.py": ["sq = second", "mathx.cube = mathx.sq", "consts.SCALE = 4.0", "SCALE = 1.25",
                   "TABLE = TABLE * 2", "double = second", "first = mathx.shift",
                   "consts.TABLE[1] = 7.0",
                   "sq = cuda.jit(device=True, fastmath=True)(mathx.sq.py_func)",
                   "second = cuda.jit(device=True, fastmath=True)(mathx.sq.py_func)"],
    "consts.py": ["SCALE = SCALE * 2", "TABLE[0] = 9.0", "TABLE = TABLE[::-1].copy()",
                  "TABLE = TABLE.astype(np.float64)", "SCALE = np.float32(2.5)"],
    "mathx.py": ["sq = cube", "cube = sq", "twice = sq", "shift.py_func.__defaults__ = (3.0,)"],
    "closures.py": ["double = make_scaler(5.0)"],
    "vec.py": ["from lab.mathx import cube as twice"],
}
OPTIONS = ["fastmath=True", "lineinfo=True", "debug=True, opt=False", "", "max_registers=32"]


def _functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]


def _splice(text: str, node, new: str) -> str:
    """`text` with the source of `node` replaced by `new` (positions in UTF-8 bytes)."""
    lines = text.splitlines(keepends=True)
    start = sum(len(line) for line in lines[:node.lineno - 1]) + \
        len(lines[node.lineno - 1].encode()[:node.col_offset].decode())
    end = sum(len(line) for line in lines[:node.end_lineno - 1]) + \
        len(lines[node.end_lineno - 1].encode()[:node.end_col_offset].decode())
    return text[:start] + new + text[end:]


def _constant(rng, text, tree):
    found = [n for n in ast.walk(tree) if type(getattr(n, "value", None)) in (int, float)
             and isinstance(n, ast.Constant)]
    if found:
        node = rng.choice(found)
        value = node.value + 1 if isinstance(node.value, int) else node.value * 1.5 + 0.25
        return f"constant {node.value!r} -> {value!r}", _splice(text, node, repr(value))


def _module_names(tree) -> set:
    names = set()
    for statement in tree.body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in statement.names}
        elif isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
            names.add(statement.name)
        elif isinstance(statement, ast.Assign):
            names |= {t.id for t in statement.targets if isinstance(t, ast.Name)}
    return names - {"cuda", "math", "np", "numba"}


def _name(rng, text, tree):
    names = _module_names(tree)
    reads = [n for f in _functions(tree) for n in ast.walk(f)
             if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in names]
    if reads and len(names) > 1:
        node = rng.choice(reads)
        other = rng.choice(sorted(names - {node.id}))
        return f"name {node.id} -> {other}", _splice(text, node, other)


def _line(rng, text, tree, line: str):
    lines = text.splitlines(keepends=True)
    at = rng.randrange(len(lines) + 1)
    following = lines[at] if at < len(lines) else ""
    indent = re.match(r"[ \t]*", following).group(0) if following.strip() else ""
    lines.insert(at, indent + line if line.strip() else line)
    return f"{line.strip() or 'blank line'} at line {at + 1}", "".join(lines)


def _docstring(rng, text, tree):
    function = rng.choice(_functions(tree) or [None])
    if function is None:
        return None
    first = function.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
            and isinstance(first.value.value, str):
        return f"docstring of {function.name} edited", _splice(
            text, first.value, repr(first.value.value + " More."))
    lines = text.splitlines(keepends=True)
    lines.insert(first.lineno - 1, " " * first.col_offset + '"""Added."""\n')
    return f"docstring added to {function.name}", "".join(lines)


def _rename(rng, text, tree):
    for function in rng.sample(_functions(tree), len(_functions(tree))):
        bound = sorted({n.id for n in ast.walk(function)
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                       | {a.arg for a in function.args.args})
        if bound:
            old = rng.choice(bound)
            lines = text.splitlines(keepends=True)
            body = "".join(lines[function.lineno - 1:function.end_lineno])
            body = re.sub(rf"\b{re.escape(old)}\b", old + "_r", body)
            return f"{function.name}: {old} renamed", "".join(
                lines[:function.lineno - 1]) + body + "".join(lines[function.end_lineno:])


def _swap(rng, text, tree):
    defs = [s for s in tree.body if isinstance(s, ast.FunctionDef)]
    if len(defs) < 2:
        return None
    at = rng.randrange(len(defs) - 1)
    one, two = defs[at], defs[at + 1]
    lines = text.splitlines(keepends=True)
    starts = [(d.decorator_list[0].lineno if d.decorator_list else d.lineno) - 1
              for d in (one, two)]
    first, second = ("".join(lines[s:d.end_lineno]) for s, d in zip(starts, (one, two)))
    between = "".join(lines[one.end_lineno:starts[1]])
    return f"{one.name} and {two.name} swapped", "".join(lines[:starts[0]]) + second + \
        between + first + "".join(lines[two.end_lineno:])


def _options(rng, text, tree):
    decorators = [d for f in _functions(tree) for d in f.decorator_list
                  if "cuda.jit" in ast.unparse(d)]
    if decorators:
        decorator = rng.choice(decorators)
        device = ["device=True"] if "device=True" in ast.unparse(decorator) else []
        chosen = rng.choice(OPTIONS)
        arguments = ", ".join(device + ([chosen] if chosen else []))
        return f"options ({arguments})", _splice(
            text, decorator, f"cuda.jit({arguments})" if arguments else "cuda.jit")


def _aliases(rng, text, tree):
    one, two = "cube as second, sq as first", "cube as first, sq as second"
    if one in text or two in text:
        return "aliases swapped", text.replace(one, two) if one in text else text.replace(two, one)


def _appended(rng, text, tree, name: str):
    if name in APPENDED:
        statement = rng.choice(APPENDED[name])
        return f"appended {statement!r}", text + "\n" + statement + "\n"


EDITS = [_constant, _constant, _name, _name, _docstring, _rename, _swap, _options, _aliases,
         lambda rng, text, tree: _line(rng, text, tree, "# a comment\n"),
         lambda rng, text, tree: _line(rng, text, tree, "\n")]


def _edit(rng, root: Path, original: dict) -> str:
    """One random edit of a module of the lab package that still parses; what it was."""
    while True:
        path = rng.choice(sorted(original))
        text = path.read_text()
        if rng.random() < 0.1:
            done = ("put back", original[path])
        elif rng.random() < 0.2:
            done = _appended(rng, text, ast.parse(text), path.name)
        else:
            done = rng.choice(EDITS)(rng, text, ast.parse(text))
        if done is None:
            continue
        try:
            compile(done[1], str(path), "exec")
        except SyntaxError:
            continue
        path.write_text(done[1])
        return f"{path.name}: {done[0]}"


def _built(run_kbuild, root: Path, store: Path, jobs: str) -> dict:
    """(target, signature, arch) -> (failed, PTX or LTO-IR digest, status) of one build."""
    done = run_kbuild("build", "--json", jobs, "-k", cwd=root, store=store, timeout=900)
    result = json.loads(done.stdout)
    assert "targets" in result, done.stdout + done.stderr
    return {(r["target"], r["signature"], r["arch"]):
            (r["status"] == "failed", (r.get("artifacts") or {}).get("ptx"), r["status"])
            for r in result["targets"]}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_random_edit_builds_what_a_fresh_build_makes(seed, tmp_path, run_kbuild):
    rng = random.Random(seed)
    root = tmp_path / "editproj"
    shutil.copytree(EDITPROJ, root)
    original = {p: p.read_text() for p in (root / "lab").glob("*.py")}
    store = tmp_path / "store"
    _built(run_kbuild, root, store, "-j2")
    history = []
    for step in range(STEPS):
        history.append(_edit(rng, root, original))
        now = _built(run_kbuild, root, store, rng.choice(["-j1", "-j2"]))
        fresh = _built(run_kbuild, root, tmp_path / f"fresh{step}", "-j2")
        shutil.rmtree(tmp_path / f"fresh{step}")
        said = f"seed {seed}, after: " + "; ".join(history)
        assert {k: v[:2] for k, v in now.items()} == {k: v[:2] for k, v in fresh.items()}, said
        again = _built(run_kbuild, root, store, "-j1")
        assert [k for k, v in again.items() if v[2] == "built"] == [], said
