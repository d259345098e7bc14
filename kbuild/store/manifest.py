"""What an entry must say to be accepted: one check for the store, archives and remotes.

An entry is bound to its target. Its manifest names its own key and (for a
target's entry) the target, signature and arch it was built for; whoever
looks a key up says which target it wants (`expect`), and a manifest naming
another is corrupt. The artifacts must agree with the manifest too (see
`artifact_problem`): a PTX whose `.target` or `.entry` differs, a cubin built
for another arch or not defining the entry symbol, is another kernel's binary
under this key, never launched.

JSON is parsed only when it is small and shallow: a manifest is bounded in
size and nesting, so a hostile file costs a warning, not a RecursionError.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate

from ..artifacts import (OBJECT_KIND, OUTPUT_KIND, RECORD_KIND, TARGET_KINDS, BinaryError, Facts,
                         arch_number, artifact_facts, names_kernel)

MANIFEST_SCHEMA = 1
MAX_JSON_BYTES = 4 << 20
MAX_JSON_DEPTH = 32
HEX32 = re.compile(r"\A[0-9a-f]{32}\Z")
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_PAIR = re.compile(r"\[\]|\{\}")


class EntryProblem(ValueError):
    """Why an entry is not accepted (its text names what is wrong)."""


def is_object(manifest: dict) -> bool:
    return manifest.get("kind") == OBJECT_KIND


def is_output(manifest: dict) -> bool:
    """An early-cutoff record: a step's output under the key of its input bytes."""
    return manifest.get("kind") == OUTPUT_KIND


def is_target(manifest: dict) -> bool:
    """A target's entry (not an object, not an early-cutoff record)."""
    return "kind" not in manifest


def manifest_text(manifest: dict) -> str:
    """`json.dumps(manifest, sort_keys=True, indent=1)`, character for character, made
    faster: json's own encoder takes its slow, pure-Python path whenever it indents, and a
    target's manifest is a tree of some 400 small lists (its key's inputs) written once per
    entry a build commits. Values are told apart as json tells them (a `str` enum, such as
    a relinked entry's link mode, is its string); what json itself would spell otherwise
    (NaN, infinities, keys that are not strings) goes to json."""
    parts: list[str] = []
    try:
        _encode(manifest, parts, "\n")
    except _NotPlain:
        return json.dumps(manifest, sort_keys=True, indent=1)
    return "".join(parts)


class _NotPlain(Exception):
    pass


_ENCODE_STRING = json.encoder.encode_basestring_ascii
_CONSTANTS = {True: "true", False: "false", None: "null"}


def _encode(value, parts: list, newline: str) -> None:
    # The order of json's own `_iterencode`: strings, the three constants, int, float.
    if isinstance(value, str):
        parts.append(_ENCODE_STRING(value))
    elif value is None or value is True or value is False:
        parts.append(_CONSTANTS[value])
    elif isinstance(value, int):
        parts.append(int.__repr__(value))
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise _NotPlain  # NaN and infinities: json's own spelling
        parts.append(float.__repr__(value))
    elif isinstance(value, dict):
        if not value:
            parts.append("{}")
            return
        if not all(isinstance(k, str) for k in value):
            raise _NotPlain
        inner = newline + " "
        parts.append("{")
        first = True
        for key in sorted(value):
            parts.append(inner if first else "," + inner)
            first = False
            parts.append(_ENCODE_STRING(key))
            parts.append(": ")
            _encode(value[key], parts, inner)
        parts.append(newline + "}")
    elif isinstance(value, (list, tuple)):
        if not value:
            parts.append("[]")
            return
        inner = newline + " "
        if all(isinstance(item, str) for item in value):  # most lists: one join
            parts.append("[" + inner + ("," + inner).join(map(_ENCODE_STRING, value))
                         + newline + "]")
            return
        parts.append("[")
        first = True
        for item in value:
            parts.append(inner if first else "," + inner)
            first = False
            _encode(item, parts, inner)
        parts.append(newline + "]")
    else:
        raise _NotPlain


def load_json(text: str, what: str = "JSON", limit: int = MAX_JSON_BYTES):
    """`text` parsed, when it is at most `limit` characters and MAX_JSON_DEPTH deep.

    The depth is counted over brackets in one C-speed pass that ignores strings (their
    brackets only ever make it err high, and then the exact count below decides); JSON
    that slips past it (closing brackets in strings) is still refused when the parser
    itself runs out of depth.
    """
    if len(text) > limit:
        raise EntryProblem(f"{what} is larger than {limit} bytes")
    if _too_deep(_NOT_BRACKET.sub("", text)) and \
            _too_deep(_NOT_BRACKET.sub("", _STRING.sub("", text))):
        raise EntryProblem(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text)
    except RecursionError:
        raise EntryProblem(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError:
        raise EntryProblem(f"{what} is not valid JSON") from None


def _too_deep(brackets: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `brackets` nest deeper than `limit` (`_depth`: the highest running count
    of openings over closings). Counted in C where it can be: a pass removes the
    innermost pairs, so well-nested brackets are gone in as many passes as they are
    deep; what is left otherwise (brackets of strings that do not pair up, or more than
    `limit` levels) is counted one bracket at a time."""
    rest = brackets
    for _ in range(limit):
        if not rest:
            return False
        inner = _PAIR.sub("", rest)
        if inner == rest:
            break
        rest = inner
    return bool(rest) and _depth(brackets) > limit


def _depth(brackets: str) -> int:
    return max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0)


def parse_manifest(key: str, text: str, expect: dict | None = None) -> dict:
    """The manifest in `text` for `key`, checked (shape, binding to `expect`); EntryProblem."""
    manifest = load_json(text, "manifest")
    problem = _shape_problem(key, manifest) or _binding_problem(manifest, expect or {})
    if problem:
        raise EntryProblem(problem)
    return manifest


def _shape_problem(key: str, manifest) -> str | None:
    if not isinstance(manifest, dict):
        return "not a JSON object"
    if manifest.get("schema") != MANIFEST_SCHEMA:
        return f"unknown schema {str(manifest.get('schema'))[:40]!r}"
    if manifest.get("key") != key:
        return "key does not match its file name"
    artifacts = manifest.get("artifacts")
    if not isinstance(artifacts, dict) or not artifacts or not all(
            isinstance(v, str) and HEX32.match(v) for v in artifacts.values()):
        return "artifacts are not blob hashes"
    sizes = manifest.get("sizes", {})
    if not isinstance(sizes, dict) or not all(
            isinstance(sizes.get(k, 0), int) and not isinstance(sizes.get(k), bool)
            for k in artifacts):
        return "sizes are malformed"
    if not isinstance(manifest.get("arch"), str):
        return "no arch"
    for field, kind in _OPTIONAL:
        if field in manifest and not isinstance(manifest[field], kind):
            return f"{field} is not a {kind.__name__}"
    if is_object(manifest):
        return _object_problem(manifest)
    if is_output(manifest):
        return _output_problem(manifest)
    if "kind" in manifest:
        return f"unknown kind {str(manifest['kind'])[:40]!r}"
    if sorted(set(artifacts) - {RECORD_KIND}) != sorted(TARGET_KINDS):
        return f"artifacts are {sorted(artifacts)}, not a PTX and a cubin"
    for field in ("target", "signature", "entry"):
        if not isinstance(manifest.get(field), str):
            return f"no {field}"
    if not isinstance(manifest.get("cooperative"), bool):
        return "no cooperative flag"
    if not _inputs_ok(manifest.get("inputs")):
        return "inputs are malformed"
    return None


# Fields older or other kbuilds may leave out, but never of another type.
_OPTIONAL = (("built_at", str), ("project", str), ("link", dict), ("function", str),
             ("backend", str))


def _inputs_ok(inputs) -> bool:
    """The key tree a target was built from, as `explain` reads it: [[path], text, digest].
    (JSON gives exact lists and strings: `type(...) is` is the same test, and faster.)"""
    return type(inputs) is list and all(
        type(row) is list and len(row) == 3 and type(row[0]) is list
        and type(row[1]) is str and type(row[2]) is str for row in inputs) and all(
        type(p) is str for row in inputs for p in row[0])


# The only nvJitLink options a kernel object may ask its links for (`lto.link_flags`).
_LINK_FLAG = re.compile(r"-(fma|ftz|prec-div|prec-sqrt)=[01]")


def _object_problem(manifest: dict) -> str | None:
    """A separately compiled object (see `objects`): its LTO-IR and its interface."""
    def rows(name, width):
        value = manifest.get(name)
        return isinstance(value, list) and all(
            isinstance(r, list) and len(r) == width and all(isinstance(x, str) for x in r)
            for r in value)

    if [k for k in manifest["artifacts"] if k != RECORD_KIND] != ["ltoir"]:
        return "object without exactly one LTO-IR artifact"
    if not rows("exports", 2) or not rows("imports", 4):
        return "object interface is malformed"
    if "entry" in manifest or not manifest["exports"]:
        if not isinstance(manifest.get("entry"), str):
            return "no entry symbol"
        if not isinstance(manifest.get("cooperative"), bool):
            return "kernel object without a cooperative flag"
        flags = manifest.get("link_flags", [])
        if not isinstance(flags, list) or not all(
                isinstance(f, str) and _LINK_FLAG.fullmatch(f) for f in flags):
            return "kernel object with link flags kbuild does not give"
        # Its lto option decides its link (`lto.cubin_of`): never guessed when absent, and
        # an lto kernel's link takes nvJitLink's float defaults, so no flags of its own.
        if not isinstance(manifest.get("lto"), bool):
            return "kernel object without an lto option"
        if manifest["lto"] and flags:
            return "kernel object with lto on and link flags kbuild does not give"
    return None


def _output_problem(manifest: dict) -> str | None:
    """An early-cutoff record: exactly a PTX and a cubin, and the kernel they define (its
    artifacts are then checked to define it for the arch, as a target's are)."""
    if sorted(manifest["artifacts"]) != sorted(TARGET_KINDS):
        return "output without exactly a PTX and a cubin"
    if not isinstance(manifest.get("entry"), str):
        return "no entry symbol"
    return None


def binding_problem(manifest: dict, expect: dict) -> str | None:
    """Why `manifest` is not the entry `expect` asks for (see `_binding_problem`), or None."""
    return _binding_problem(manifest, expect)


def _binding_problem(manifest: dict, expect: dict) -> str | None:
    """`expect`: fields the manifest must hold, and `entry_prefix` (the kernel's mangled
    module and name, see `backend.binaries.entry_prefix`) its entry symbol must start with."""
    prefix = expect.get("entry_prefix")
    if prefix and not names_kernel(str(manifest.get("entry")), prefix):
        return f"its entry symbol {str(manifest.get('entry'))[:60]} is another kernel's"
    for field in sorted(set(expect) - {"entry_prefix"}):
        if manifest.get(field) != expect[field]:
            return (f"it names {field} {str(manifest.get(field))[:80]!r}, "
                    f"not {str(expect[field])[:80]!r}")
    return None


def artifact_problem(manifest: dict, kind: str, facts: Facts) -> str | None:
    """Why the artifact `kind` (with `facts`) is not this manifest's, else None."""
    arch, entry = manifest["arch"], manifest.get("entry")
    if kind == "ptx" and facts.arch != arch:
        return f"its PTX targets {facts.arch}, not {arch}"
    if kind == "cubin" and facts.arch != arch_number(arch):
        return f"its cubin is built for {facts.arch}, not {arch}"
    if kind in TARGET_KINDS and entry not in facts.kernels:
        return f"its {kind.upper()} does not define the kernel {entry[:60]}"
    return None


def built_problem(arch: str, entry: str, artifacts: dict) -> str | None:
    """Why freshly made artifacts (kind -> bytes) are not `entry`'s for `arch`, else None:
    a relink from stored objects is checked before it is committed."""
    manifest = {"arch": arch, "entry": entry}
    for kind, data in sorted(artifacts.items()):
        try:
            problem = artifact_problem(manifest, kind, artifact_facts(kind, data))
        except BinaryError as exc:
            problem = str(exc)
        if problem:
            return problem
    return None


__all__ = ["EntryProblem", "HEX32", "MANIFEST_SCHEMA", "artifact_problem", "built_problem",
           "is_object", "is_output", "is_target", "load_json", "parse_manifest"]
