"""Recorded kernels written into a project file, editing its text rather than rewriting it.

A kbuild.toml is the user's: its comments, order and spelling stay. New kernels become new
`[kernels."module:attr"]` tables at the end (in name order); a declared kernel's new
signatures are appended to its `signatures` array (new launch configurations to its
`launch` array, or a new `launch` line); a commented-out placeholder `kbuild init` left for
a lazy kernel is replaced by the real table. Nothing else changes. The result is read back
(tomllib) and must declare everything recorded, else nothing is written. In a
pyproject.toml the tables are `[tool.kbuild.kernels."..."]`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

from ..errors import ConfigError

HEADER = "# Written by `kbuild run --record`: the kernels and signatures a run launched.\n"


def merge(path: Path, kernels: dict, *, name: str, paths=(".",), archs=("sm_80",)) -> dict:
    """Write `kernels` (name -> {"signatures": [...], "launch": [{grid, block, shared}]})
    into the project file `path` (created when missing). Returns what was added:
    {"file", "created", "added": [[kernel, signature], ...], "launches": [[kernel, launch]]}."""
    created = not path.exists()
    text = _new_file(name, paths, archs) if created else path.read_text(encoding="utf-8")
    prefix = "tool.kbuild." if path.name == "pyproject.toml" else ""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML, nothing recorded into it: {exc}") from None
    declared = _kernels_table(data, prefix)
    added, launches, new_tables = [], [], []
    for kernel in sorted(kernels):
        want = kernels[kernel]
        signatures = sorted(set(want["signatures"]))
        wanted_launch = [_launch_value(x) for x in want.get("launch") or ()]
        have = declared.get(kernel)
        if have is None:
            new_tables.append(_table(prefix, kernel, signatures, wanted_launch))
            text = _drop_placeholder(text, prefix, kernel)
            added += [[kernel, s] for s in signatures]
            launches += [[kernel, x] for x in wanted_launch]
            continue
        if not isinstance(have, dict):
            raise ConfigError(f"{path}: kernel '{kernel}' is not a table; add "
                              f"{', '.join(signatures)} to it by hand")
        new = [s for s in signatures if s not in have.get("signatures", [])]
        known = [_launch_value(x) for x in have.get("launch", []) if isinstance(x, dict)]
        new_launch = [x for x in wanted_launch if x not in known]
        if new or new_launch:
            text = _extend_table(path, text, prefix, kernel, new, new_launch)
        added += [[kernel, s] for s in new]
        launches += [[kernel, x] for x in new_launch]
    if new_tables:
        text = text.rstrip("\n") + "\n\n" + "\n\n".join(new_tables) + "\n"
    _check(path, text, prefix, kernels)
    if added or launches or created:
        path.write_text(text, encoding="utf-8")
    return {"file": str(path), "created": created, "added": added, "launches": launches}


def _new_file(name: str, paths, archs) -> str:
    return (HEADER + "\n[project]\n" f"name = {_q(name)}\n"
            f"paths = [{', '.join(_q(p) for p in paths)}]\n"
            f"arch = [{', '.join(_q(a) for a in archs)}]\n")


def _kernels_table(data: dict, prefix: str) -> dict:
    for part in prefix.split(".")[:-1]:
        data = data.get(part, {}) if isinstance(data, dict) else {}
    found = data.get("kernels", {}) if isinstance(data, dict) else {}
    return found if isinstance(found, dict) else {}


def _q(text: str) -> str:
    return json.dumps(text)


def _launch_value(item: dict) -> dict:
    """A launch as {"grid": [x, y, z], "block": [x, y, z], "shared": n}, to compare."""
    def dims(value):
        value = list(value) if isinstance(value, (list, tuple)) else [value]
        return value + [1] * (3 - len(value))
    return {"grid": dims(item["grid"]), "block": dims(item["block"]),
            "shared": int(item.get("shared", 0))}


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
                      rf"[ \t]*\][ \t]*(?:#.*)?$", re.M)


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
    following = re.compile(r"\n[ \t]*#[ \t]*signatures[ \t]*=.*").match(text, end)
    if following:
        end = following.end()
    return text[:start] + text[end:].lstrip("\n")


def _extend_table(path, text: str, prefix: str, kernel: str, signatures, launch) -> str:
    match = _header(prefix, kernel).search(text)
    if match is None:
        raise ConfigError(f"{path}: kernel '{kernel}' is declared in a form kbuild cannot "
                          f"edit; add {', '.join(signatures) or 'its launch'} to it by hand")
    body_end = _table_end(text, match.end())
    if signatures:
        text = _append_to_array(path, text, match.end(), body_end, "signatures",
                                [_q(s) for s in signatures])
        body_end = _table_end(text, match.end())
    if launch:
        items = [_launch_text(x) for x in launch]
        if _key_line(text, match.end(), body_end, "launch") is None:
            # A new line after the signatures array (or at the table's end).
            sig = _key_line(text, match.end(), body_end, "signatures")
            at = text.find("\n", _closing_bracket(text, sig.end() - 1)) + 1 if sig else 0
            if at <= 0:
                at = body_end
            head = text[:at] if text[:at].endswith("\n") or not at else text[:at] + "\n"
            text = head + "launch = [" + ", ".join(items) + "]\n" + text[at:]
        else:
            text = _append_to_array(path, text, match.end(), body_end, "launch", items)
    return text


def _table_end(text: str, start: int) -> int:
    """Where the table whose header ends at `start` ends: the next header line, or EOF."""
    found = re.compile(r"^[ \t]*\[", re.M).search(text, start)
    while found is not None and _inside_array(text, start, found.start()):
        found = re.compile(r"^[ \t]*\[", re.M).search(text, found.end())
    return found.start() if found else len(text)


def _inside_array(text: str, start: int, position: int) -> bool:
    """Whether `position` lies inside an array opened after `start` (a `[` line within a
    multi-line array is not a header)."""
    depth, i = 0, start
    while i < position:
        i, char = _next_char(text, i)
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
    return depth > 0


def _key_line(text: str, start: int, end: int, key: str):
    return re.compile(rf"^[ \t]*{re.escape(key)}[ \t]*=[ \t]*\[", re.M).search(text, start, end)


def _append_to_array(path, text: str, start: int, end: int, key: str, items) -> str:
    found = _key_line(text, start, end, key)
    if found is None:
        raise ConfigError(f"{path}: a kernel table has no '{key} = [' line kbuild can extend; "
                          f"add {', '.join(items)} by hand")
    close = _closing_bracket(text, found.end() - 1)
    inner = text[found.end():close]
    if "\n" not in inner:  # one line: ["a", "b"]
        body = inner.rstrip().rstrip(",").rstrip()
        joined = (body + ", " if body.strip() else "") + ", ".join(items)
        return text[:found.end()] + joined + text[close:]
    line_start = text.rfind("\n", 0, close) + 1
    last_item = inner.rstrip().rsplit("\n", 1)[-1]
    indent = re.match(r"[ \t]*", last_item).group(0) or "    "
    value_end, last = _last_value(text, found.end(), close)
    if last not in (",", "["):  # the last item has no comma after it (a comment may follow)
        text = text[:value_end] + "," + text[value_end:]
        line_start += 1
    added = "".join(f"{indent}{item},\n" for item in items)
    return text[:line_start] + added + text[line_start:]


def _last_value(text: str, start: int, end: int):
    """(where the last item before `end` ends, the last structural character: ',' when it
    is followed by a comma, '[' when the array is empty)."""
    i, value_end, last = start, start, "["
    while i < end:
        j, char = _next_char(text, i)
        if char == "" and text[i] in "\"'":
            value_end, last = j, "value"
        elif char == ",":
            last = ","
        elif char and not char.isspace():
            value_end, last = j, "value"
        i = j
    return value_end, last


def _closing_bracket(text: str, open_at: int) -> int:
    depth, i = 0, open_at
    while i < len(text):
        i, char = _next_char(text, i)
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth == 0:
                return i - 1
    raise ValueError("unclosed array")


def _next_char(text: str, i: int):
    """(index after the next structural character, it) from `i`: strings and comments are
    skipped whole (their brackets are not structure), other characters returned as is."""
    char = text[i]
    if char == "#":
        newline = text.find("\n", i)
        return (len(text) if newline < 0 else newline), ""
    if char in "\"'":
        triple = text.startswith(char * 3, i)
        quote = char * 3 if triple else char
        j = i + len(quote)
        while j < len(text):
            if char == '"' and text[j] == "\\":
                j += 2
                continue
            if text.startswith(quote, j):
                return j + len(quote), ""
            j += 1
        return len(text), ""
    return i + 1, char


def _check(path: Path, text: str, prefix: str, kernels: dict) -> None:
    try:
        found = _kernels_table(tomllib.loads(text), prefix)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: recording into it would break it ({exc}); nothing was "
                          "written") from None
    for kernel, want in kernels.items():
        have = found.get(kernel, {})
        missing = set(want["signatures"]) - set(have.get("signatures", []))
        if missing:
            raise ConfigError(f"{path}: could not record {kernel} {sorted(missing)[0]} into "
                              "it; nothing was written")
