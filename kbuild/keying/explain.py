"""Why a target is stale: the difference between two key trees, in words.

Works on the flattened trees that manifests record (`KeyNode.flatten`), so it
needs no live objects: the old tree comes from the store, the new from keying.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .tree import LabelKind, function_name, label_kind

# The labels of the functions a reason can belong to.
_FUNCTIONS = (LabelKind.CALLEE, LabelKind.KERNEL, LabelKind.OVERLOAD)


@dataclass(frozen=True)
class Reason:
    """One changed key input."""

    path: tuple
    change: str  # changed | added | removed
    old: str | None
    new: str | None
    # The input's digests before and after (a body's name its source for `source_diff`).
    old_digest: str | None = field(default=None, compare=False)
    new_digest: str | None = field(default=None, compare=False)

    @property
    def is_body(self) -> bool:
        """Whether a function's body changed (and a diff of its source can be shown)."""
        return self.change == "changed" and self.path[-1] == "body"

    @property
    def function(self) -> str:
        """The function whose input this is: the kernel or the innermost callee."""
        for label in reversed(self.path):
            if label_kind(label) in _FUNCTIONS:
                return function_name(label)
        return self.path[0]

    @property
    def message(self) -> str:
        context = _context(self.path)
        label = self.path[-1]
        if self.change == "changed" and label == "body":
            if self.old and self.new and self.old != self.new:
                # The same code keyed another way (line numbers now kept for lineinfo).
                return f"{context or 'kernel'} changed (body: {self.old} -> {self.new})"
            return f"{context or 'kernel'} changed (body)"
        prefix = f"{context}: " if context else ""
        if self.change == "added":
            return f"{prefix}{label} added{_value(label, self.new)}"
        if self.change == "removed":
            return f"{prefix}{label} removed{_value(label, self.old)}"
        return f"{prefix}{label} {self.old} -> {self.new}"

    def as_json(self) -> dict:
        return {"path": list(self.path), "change": self.change, "old": self.old,
                "new": self.new, "message": self.message}


def _value(label: str, text: str | None) -> str:
    # "option max_registers added (32)"; a callee's summary only repeats its label.
    if not text or label.endswith(text):
        return ""
    return f" ({text})"


def _context(path) -> str:
    # Drop the root ("target") and the kernel's own label: explain is per target.
    inner = [p for i, p in enumerate(path[:-1])
             if i > 0 and not (i == 1 and label_kind(p) is LabelKind.KERNEL)]
    return " > ".join(inner)


def diff(old_flat, new_flat) -> list[Reason]:
    """The top-most differing inputs between two flattened trees (lists of [path, summary, digest])."""
    old = {tuple(p): (s, d) for p, s, d in old_flat}
    new = {tuple(p): (s, d) for p, s, d in new_flat}
    children = _children(old, new)
    reasons: list[Reason] = []
    roots = [p for p in new if len(p) == 1] or [p for p in old if len(p) == 1]
    for root in roots:
        _walk(root, old, new, children, reasons)
    return reasons


def _children(old, new):
    kids: dict[tuple, list] = {}
    for path in sorted(set(old) | set(new)):
        if len(path) > 1:
            kids.setdefault(path[:-1], []).append(path)
    return kids


def _walk(path, old, new, children, reasons):
    if path not in old:
        reasons.append(Reason(path, "added", None, new[path][0]))
        return
    if path not in new:
        reasons.append(Reason(path, "removed", old[path][0], None))
        return
    if old[path][1] == new[path][1]:
        return
    kids = children.get(path, [])
    if not kids or not any(k in old for k in kids) or not any(k in new for k in kids):
        reasons.append(Reason(path, "changed", old[path][0], new[path][0],
                              old[path][1], new[path][1]))
        return
    before = len(reasons)
    for kid in kids:
        _walk(kid, old, new, children, reasons)
    if len(reasons) == before:
        # Same inputs, different digest: only the node's own label or schema moved.
        reasons.append(Reason(path, "changed", old[path][0], new[path][0]))


def source_diff(old_text: str, new_text: str, name: str, when: str) -> str:
    """A unified diff of a function's source as built (`when`) and as it is now; "" when
    the two read the same."""
    import difflib  # only explain shows diffs; a build never imports it

    lines = difflib.unified_diff(old_text.splitlines(), new_text.splitlines(),
                                 f"{name} (built {when})", f"{name} (now)", lineterm="")
    return "\n".join(lines)
