"""Field-level differences between recorded configs and versions.

Answers "why did my hash change?" (the plan, `marin why`) and "what differs in this
reused output?" (the unversioned-field warning). Works on the JSON primitives the
fingerprint encoder produces, so it compares what was recorded, not live objects.
"""

from __future__ import annotations

from typing import Any

from executor.records import dataclass

_MISSING = object()


@dataclass(frozen=True)
class FieldChange:
    """One field whose value differs between two configs or versions."""

    field: str
    old: Any
    new: Any

    def describe(self) -> str:
        if self.old is _MISSING:
            return f"{self.field}: added ({_short(self.new)})"
        if self.new is _MISSING:
            return f"{self.field}: removed (was {_short(self.old)})"
        return f"{self.field}: {_short(self.old)} -> {_short(self.new)}"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def flatten(value: Any, path: str = "", out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Nested dicts/lists of primitives -> {dotted path: leaf}."""
    if out is None:
        out = {}
        if value == {} or value == []:
            return out  # nothing recorded is no field, not a field named "" (which would print as removed)
    if isinstance(value, dict) and value:
        for key, item in value.items():
            flatten(item, f"{path}.{key}" if path else str(key), out)
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            flatten(item, f"{path}[{index}]", out)
    else:
        out[path] = value
    return out


UNSET_VALUES = (None, [], {})
"""Leaf values that mean "not set": a field added or removed with one of these is no change
for `diff_flat(..., skip_unset=True)` (a config class that gained an optional field)."""


def diff_flat(old: dict[str, Any], new: dict[str, Any], skip_unset: bool = False) -> list[FieldChange]:
    """Changed, added and removed leaves, sorted by field path.

    `skip_unset`: leave out fields added or removed with an unset value (None, [], {}), so
    that outputs made before a config class gained an optional field reuse without a warning.
    """
    changes = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key, _MISSING), new.get(key, _MISSING)
        if before != after or type(before) is not type(after):
            if skip_unset and (
                (before is _MISSING and _unset(after)) or (after is _MISSING and _unset(before))
            ):
                continue
            changes.append(FieldChange(key, before, after))
    return changes


def _unset(value: Any) -> bool:
    return any(value == unset and type(value) is type(unset) for unset in UNSET_VALUES)


def diff_versions(old: dict, new: dict, new_dependency_names: list[str] | None = None) -> list[str]:
    """Human-readable reasons why version `new` differs from version `old`."""
    reasons = [
        change.describe()
        for change in diff_flat(flatten(old.get("config", {})), flatten(new.get("config", {})))
    ]
    old_deps, new_deps = old.get("dependencies", []), new.get("dependencies", [])
    names = new_dependency_names or []
    for index in range(max(len(old_deps), len(new_deps))):
        before = old_deps[index] if index < len(old_deps) else None
        after = new_deps[index] if index < len(new_deps) else None
        if before == after:
            continue
        label = f"DEP[{index}]" + (f" ({names[index]})" if index < len(names) else "")
        if before is None:
            reasons.append(f"{label}: new dependency")
        elif after is None:
            reasons.append(f"{label}: dependency removed")
        else:
            reasons.append(f"{label}: upstream version {before[:8]} -> {after[:8]}")
    if old.get("name") != new.get("name"):
        reasons.append(f"name: {old.get('name')!r} -> {new.get('name')!r}")
    return reasons
