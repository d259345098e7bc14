"""Recorded kernels written into a project file, editing it rather than rewriting it.

A kbuild.toml is the user's: its comments, order, spelling and line endings stay. The
edit goes through tomlkit, a TOML parser that keeps all of them (every string, table and
array form TOML has: triple-quoted strings, inline tables, non-ASCII names, CRLF files). New
kernels become new `[kernels."module:attr"]` tables at the end (in name order); a declared
kernel's new signatures are appended to its `signatures` array (new launch
configurations to its `launch` array, or a new `launch` key); a commented-out placeholder
`kbuild init` left for a lazy kernel is replaced by the real table. Nothing else changes.
The result is read back (tomllib, as every command reads it) and must declare
everything recorded, else nothing is written. In a pyproject.toml the tables are
`[tool.kbuild.kernels."..."]`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import InlineTable

from ..config import DEFAULT_ARCHS, parse_toml
from ..errors import ConfigError

HEADER = "# Written by `kbuild run --record`: the kernels and signatures a run launched.\n"


def merge(path: Path, kernels: dict, *, name: str, paths=(".",), archs=DEFAULT_ARCHS,
          served=()) -> dict:
    """Write `kernels` (name -> {"signatures": [...], "launch": [{grid, block, shared}]})
    into the project file `path` (created when missing, declaring `archs`). `served`: the
    archs the launches looked up (sm_90a on an sm_90), added to an existing file's
    project archs (and a recorded kernel's own) that lack them: `kbuild build` then holds
    the keys those launches look up. Returns what was added: {"file", "created",
    "added": [[kernel, signature], ...], "launches": [[kernel, launch]], "archs": [...]}."""
    created = not path.exists()
    # Bytes, not text mode: universal newlines would turn a CRLF file into an LF one.
    text = _new_file(name, paths, archs) if created else \
        path.read_bytes().decode("utf-8", "surrogateescape")
    prefix = "tool.kbuild." if path.name == "pyproject.toml" else ""
    newline = "\r\n" if "\r\n" in text else "\n"
    doc = _parse(path, text)
    undeclared = [k for k in sorted(kernels) if k not in (_kernels_table(doc, prefix) or {})]
    if any(_header(prefix, k, commented=True).search(text) for k in undeclared):
        for kernel in undeclared:
            text = _drop_placeholder(text, prefix, kernel)
        doc = _parse(path, text)
    declared = _kernels_table(doc, prefix)
    added_archs = [] if created else _add_archs(path, doc, prefix, served)
    added, launches, new_tables = [], [], []
    for kernel in sorted(kernels):
        want = kernels[kernel]
        signatures = sorted(set(want["signatures"]))
        wanted_launch = [_launch_value(x) for x in want.get("launch") or ()]
        have = declared.get(kernel) if declared is not None else None
        if have is None:
            new_tables.append((kernel, signatures, wanted_launch))
            added += [[kernel, s] for s in signatures]
            launches += [[kernel, x] for x in wanted_launch]
            continue
        if not isinstance(have, dict):
            raise ConfigError(f"{path}: kernel '{kernel}' is not a table; add "
                              f"{', '.join(signatures)} to it by hand")
        new, new_launch = _extend(path, kernel, have, signatures, wanted_launch)
        _extend_archs(path, f"kernel '{kernel}'", have, served)
        added += [[kernel, s] for s in new]
        launches += [[kernel, x] for x in new_launch]
    text = _with_new_tables(doc, declared, prefix, new_tables)
    text = re.sub(r"(?<!\r)\n", newline, text) if newline == "\r\n" else text
    _check(path, text, prefix, kernels)
    if added or launches or created or added_archs:
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
    return {"file": str(path), "created": created, "added": added, "launches": launches,
            "archs": added_archs}


def _add_archs(path: Path, doc, prefix: str, served) -> list:
    """The `served` archs the project's `arch` list lacked, appended to it (a file
    without one builds sm_80, now said); [] when it has them or has no project table."""
    data = doc
    for part in prefix.split(".")[:-1]:
        data = data.get(part, {}) if isinstance(data, dict) else {}
    project = data.get("project") if isinstance(data, dict) else None
    if not isinstance(project, dict) or not served:
        return []
    if "arch" not in project:
        project["arch"] = tomlkit.array()
        project["arch"].extend(DEFAULT_ARCHS)  # what `config` gives a file without one
    return _extend_archs(path, "[project]", project, served)


def _extend_archs(path: Path, where: str, table, served) -> list:
    """Append to `table`'s own `arch` list the `served` archs it lacks (none when it
    has no list); returns them."""
    have = table.get("arch")
    if have is None:
        return []
    if not isinstance(have, list):
        raise ConfigError(f"{path}: {where} arch is not an array; add "
                          f"{', '.join(served)} to it by hand")
    new = [a for a in sorted(set(served)) if a not in have]
    have.extend(new)
    return new


def _parse(path: Path, text: str):
    try:
        parse_toml(text, path)  # tomllib's verdict (and the nesting bound) first
        return tomlkit.parse(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML, nothing recorded into it: {exc}") from None
    except (TOMLKitError, ValueError) as exc:
        raise ConfigError(f"{path}: kbuild cannot edit this file ({exc}); add the recorded "
                          "signatures by hand") from None


def _extend(path, kernel: str, have, signatures, wanted_launch):
    """Append what is new to a declared kernel's table (a `[kernels."..."]` table or an
    inline one); returns (new signatures, new launches)."""
    declared = have.get("signatures", [])
    new = [s for s in signatures if s not in declared]
    known = [_launch_value(x) for x in have.get("launch", []) if isinstance(x, dict)]
    new_launch = [x for x in wanted_launch if x not in known]
    for key, items in (("signatures", new), ("launch", [_launch_item(x) for x in new_launch])):
        if not items:
            continue
        if key not in have:
            have[key] = tomlkit.array()
        if not isinstance(have[key], list):
            raise ConfigError(f"{path}: kernel '{kernel}' has a '{key}' that is not an array; "
                              "add the recorded ones to it by hand")
        have[key].extend(items)
    return new, new_launch


def _with_new_tables(doc, declared, prefix: str, new_tables) -> str:
    """The document's text with a table per new kernel: appended as text at the end (a
    `[kernels."..."]` table), or into an inline `kernels = {...}` table where the file
    declares them so."""
    if declared is not None and isinstance(declared, InlineTable):
        for kernel, signatures, launch in new_tables:
            table = tomlkit.inline_table()
            table["signatures"] = signatures
            if launch:
                table["launch"] = [_launch_item(x) for x in launch]
            declared[kernel] = table
        new_tables = []
    text = tomlkit.dumps(doc)
    if new_tables:
        text = text.rstrip("\r\n") + "\n\n" + "\n\n".join(
            _table(prefix, *table) for table in new_tables) + "\n"
    return text


def _new_file(name: str, paths, archs) -> str:
    return (HEADER + "\n[project]\n" f"name = {_q(name)}\n"
            f"paths = [{', '.join(_q(p) for p in paths)}]\n"
            f"arch = [{', '.join(_q(a) for a in archs)}]\n")


def _kernels_table(data, prefix: str):
    """The kernels table under `prefix` ({} when not a table), or None when absent."""
    for part in prefix.split(".")[:-1]:
        data = data.get(part, {}) if isinstance(data, dict) else {}
    found = data.get("kernels") if isinstance(data, dict) else None
    return None if found is None else found if isinstance(found, dict) else {}


def _q(text: str) -> str:
    """A TOML basic string. Not ASCII-escaped: JSON would write a character outside the
    BMP as a surrogate pair, which TOML refuses (`\\ud83d` is no Unicode scalar value)."""
    return json.dumps(text, ensure_ascii=False)


def _launch_value(item: dict) -> dict:
    """A launch as {"grid": [x, y, z], "block": [x, y, z], "shared": n}, to compare."""
    def dims(value):
        value = list(value) if isinstance(value, (list, tuple)) else [value]
        return value + [1] * (3 - len(value))
    return {"grid": dims(item["grid"]), "block": dims(item["block"]),
            "shared": int(item.get("shared", 0))}


def _launch_item(item: dict):
    """A launch as the inline table `_launch_text` spells (tomlkit keeps its spelling)."""
    return tomlkit.parse("launch = " + _launch_text(item))["launch"]


def _launch_text(item: dict) -> str:
    def dims(value):
        while len(value) > 1 and value[-1] == 1:
            value = value[:-1]
        return str(value[0]) if len(value) == 1 else "[" + ", ".join(map(str, value)) + "]"
    shared = f", shared = {item['shared']}" if item["shared"] else ""
    return f"{{grid = {dims(item['grid'])}, block = {dims(item['block'])}{shared}}}"


def _table(prefix: str, kernel: str, signatures, launch) -> str:
    lines = [f"[{prefix}kernels.{_q(kernel)}]", "signatures = ["]
    lines += [f"    {_q(s)}," for s in signatures] + ["]"]
    if launch:
        lines.append("launch = [" + ", ".join(_launch_text(x) for x in launch) + "]")
    return "\n".join(lines)


def _header(prefix: str, kernel: str, commented: bool = False) -> re.Pattern:
    quoted = "(?:" + re.escape(_q(kernel)) + "|" + re.escape(f"'{kernel}'") + ")"
    lead = r"[ \t]*#[ \t]*" if commented else r"[ \t]*"
    return re.compile(rf"^{lead}\[[ \t]*{re.escape(prefix)}kernels[ \t]*\.[ \t]*{quoted}"
                      rf"[ \t]*\][ \t]*(?:#[^\r\n]*)?\r?$", re.M)


def _drop_placeholder(text: str, prefix: str, kernel: str) -> str:
    """Remove `kbuild init`'s commented-out table for a lazy kernel (its note line, the
    header and the example signatures), which the recorded table replaces."""
    match = _header(prefix, kernel, commented=True).search(text)
    if match is None:
        return text
    start, end = match.start(), match.end()
    before = text.rfind("\n", 0, max(start - 1, 0)) + 1
    if start > 0 and "a lazy kernel" in text[before:start]:
        start = before
    following = re.compile(r"\r?\n[ \t]*#[ \t]*signatures[ \t]*=[^\r\n]*").match(text, end)
    if following:
        end = following.end()
    return text[:start] + text[end:].lstrip("\r\n")


def _check(path: Path, text: str, prefix: str, kernels: dict) -> None:
    try:
        found = _kernels_table(parse_toml(text, path), prefix) or {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: recording into it would break it ({exc}); nothing was "
                          "written") from None
    for kernel, want in kernels.items():
        have = found.get(kernel, {})
        missing = set(want["signatures"]) - set(have.get("signatures", []))
        if missing:
            raise ConfigError(f"{path}: could not record {kernel} {sorted(missing)[0]} into "
                              "it; nothing was written")
