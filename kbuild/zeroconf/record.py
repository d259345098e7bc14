"""`kbuild run --record`: the (kernel, signature) pairs a run launched, into kbuild.toml.

Each process of the run (the command and its Python children) appends one JSON line per
new pair to a file of its own in the recording folder, as it goes (a process that ends
with `os._exit` or a signal loses nothing written before). When the command is done,
`collect` reads them all and `tomledit.merge` writes them into kbuild.toml: created, or
merged into the existing file (new kernels as new tables, new signatures appended to a
kernel's list; nothing else in the file changes), sorted. So a CPU-only CI machine then
builds them ahead of time for every architecture with `kbuild build`.

What cannot be declared is reported instead: a kernel of the script run as `__main__`
(`kbuild build` imports the file under another module name, which compiles to other
symbols), a kernel kept on no module attribute (a closure made inside a function), a
signature whose types cannot be written as text. Pairs the project file already declares
(the same types, however written) are not recorded again.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path


class LaunchRecording:
    """One process's recording: a JSON line per (kernel, signature, launch) first seen."""

    def __init__(self, folder, declared: dict):
        self.folder = Path(folder)
        self.declared = declared  # name -> KernelSpec of the project file
        self.path = self.folder / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
        self._seen: set = set()

    def add(self, py_func, argtypes, name: str, text: str, arch, launch=None) -> None:
        """A pair compiled (or served) under `kbuild.enable()`."""
        try:
            self._add(py_func, tuple(argtypes), text, arch, launch)
        except Exception as exc:  # noqa: BLE001 - recording never stops a program
            self._write({"kernel": None, "name": name, "why": f"not recorded ({exc})"})

    def launched(self, fake_kernel, argtypes, launch=None) -> None:
        """A launch under numba's simulator (which compiles nothing)."""
        from .sigtext import checked_text

        py_func = fake_kernel.fn
        module = sys.modules.get(py_func.__module__)
        self.add(py_func, argtypes, f"{py_func.__module__}:{py_func.__qualname__}",
                 checked_text(argtypes, module) or "", None, None)

    def _add(self, py_func, argtypes, text, arch, launch) -> None:
        from .. import cells
        from ..keying.launch import launch_json
        from . import naming, sigtext

        memo = (py_func, argtypes, launch, arch)
        if memo in self._seen:
            return
        self._seen.add(memo)
        module = sys.modules.get(py_func.__module__)
        path = naming.import_path(py_func, self.declared)
        row = {"kernel": path, "name": path or f"{py_func.__module__}:{py_func.__qualname__}",
               "arch": arch, "launch": launch_json(launch)}
        spec = self.declared.get(path) if path else None
        if spec is not None and sigtext.matching_text(spec.signatures, argtypes, module) \
                and (launch is None or launch in spec.launches):
            return  # declared already
        checked = sigtext.checked_text(argtypes, module)
        if cells.is_registered(py_func.__code__.co_filename):
            row.update(kernel=None, why="defined in a notebook cell, which is no module "
                       "`kbuild build` can import to build it ahead of time (it is cached "
                       "when it runs); move the kernel into a module to declare it")
        elif not naming.importable_module(py_func.__module__):
            row.update(kernel=None, why=f"defined in the script run as {py_func.__module__} "
                       f"({_file_of(module, py_func)}): `kbuild build` imports it under "
                       "another module name; move the kernel into a module")
        elif path is None:
            row.update(why="made by a factory and kept on no module attribute (keep it as "
                           "one, like `ns.func = make_kernel(...)`)")
        elif checked is None:
            row.update(kernel=None, why=f"its argument types ({', '.join(map(str, argtypes))})"
                       " cannot be written as a signature; declare it by hand")
        else:
            row.update(signature=checked, root=_import_root(module))
        self._write(row)

    def _write(self, row: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, sort_keys=True) + "\n")


def _file_of(module, py_func) -> str:
    # A script run with IPython's %run: its namespace is no module, its code has a file.
    path = getattr(module, "__file__", "") or py_func.__code__.co_filename
    return os.path.basename(path) if os.path.isfile(path) else "no file"


def _import_root(module) -> str | None:
    """The sys.path folder a module was imported from (its file minus its dotted name)."""
    path = getattr(module, "__file__", None)
    if not path:
        return None
    parts = module.__name__.split(".")
    file = Path(path).resolve()
    depth = len(parts) if file.name == "__init__.py" else len(parts) - 1
    return str(file.parents[depth])


@dataclass
class Recording:
    """What a run recorded, all processes together."""

    kernels: dict = field(default_factory=dict)  # name -> {"signatures": set, "launch": list}
    archs: set = field(default_factory=set)
    roots: set = field(default_factory=set)
    skipped: dict = field(default_factory=dict)  # name -> why it was not recorded

    @property
    def pairs(self) -> int:
        return sum(len(k["signatures"]) for k in self.kernels.values())


def collect(folder) -> Recording:
    """Every process's lines in `folder`, merged."""
    found = Recording()
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line cut short by a killed process
            _take(found, row)
    return found


def _take(found: Recording, row: dict) -> None:
    if row.get("arch"):
        found.archs.add(row["arch"])
    name, signature = row.get("kernel"), row.get("signature")
    if not name or not signature:
        found.skipped.setdefault(row.get("name") or "?", row.get("why") or "not recorded")
        return
    kernel = found.kernels.setdefault(name, {"signatures": set(), "launch": []})
    kernel["signatures"].add(signature)
    if row.get("launch") and row["launch"] not in kernel["launch"]:
        kernel["launch"].append(row["launch"])
    if row.get("root"):
        found.roots.add(row["root"])
