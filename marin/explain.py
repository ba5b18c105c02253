"""`marin why` / `marin diff`: why two versions of a step have different hashes.

A version is `{name, config: {versioned field: value, input: DEP[i]/sub, ...},
dependencies: [upstream version hashes]}` (see `executor.graph`). Two versions differ
in versioned fields, in input sub-paths or hard-coded paths, or in an upstream version;
for the last, the explanation follows the changed input upstream and says why *it*
changed, down to the field someone actually edited.

Only the recorded JSON is compared: nothing named in the tree is imported or run, and a
malformed record reads as empty rather than failing the command.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from executor.diffing import diff_flat, diff_versions, flatten
from executor.tree import recorded_config
from marin.outputs import OutputTree, StepOutput


@dataclass
class Explanation:
    """Why `new` and `old` (two outputs of one step, or any two outputs) differ."""

    old: StepOutput
    new: StepOutput
    reasons: list[str] = field(default_factory=list)
    """Versioned differences: what changed the hash."""

    upstream: list[tuple[str, Explanation]] = field(default_factory=list)
    """(dependency label, why that upstream changed) for each changed upstream version."""

    unversioned: list[str] = field(default_factory=list)
    """Config differences that are not part of the hash (paths excluded)."""

    def lines(self, indent: str = "") -> list[str]:
        out = [f"{indent}{self.old.relpath} -> {self.new.relpath}"]
        if self.old.version_hash and self.old.version_hash == self.new.version_hash:
            out.append(f"{indent}  same version ({self.new.version_hash[:8]}): nothing in the hash differs")
        for reason in self.reasons:
            out.append(f"{indent}  {reason}")
        for label, explanation in self.upstream:
            out.append(f"{indent}  because {label} changed:")
            out.extend(explanation.lines(indent + "    "))
        if self.unversioned:
            out.append(f"{indent}  also different, not in the hash:")
            out.extend(f"{indent}    {change}" for change in self.unversioned)
        return out


def _is_tree_path(value: object, tree: OutputTree) -> bool:
    return isinstance(value, str) and value.startswith(tree.prefix + "/")


def explain(tree: OutputTree, old: StepOutput, new: StepOutput, depth: int = 5) -> Explanation:
    """Compare the recorded versions and configs of two outputs."""
    old_info, new_info = old.info or {}, new.info or {}
    old_version, new_version = _dict(old_info.get("version")), _dict(new_info.get("version"))
    dep_names = [str(d.get("name") or d.get("output_path", "?")) for d in new.dependencies]
    result = Explanation(old=old, new=new)
    if not old_version or not new_version:
        result.reasons.append("(a .executor_info is missing, so the versions cannot be compared)")
        return result
    result.reasons = [
        reason
        for reason in diff_versions(old_version, new_version, dep_names)
        if "upstream version" not in reason
    ]
    old_deps, new_deps = _strings(old_version.get("dependencies")), _strings(new_version.get("dependencies"))
    for index in range(min(len(old_deps), len(new_deps))):
        if old_deps[index] == new_deps[index]:
            continue
        label = f"DEP[{index}] ({dep_names[index] if index < len(dep_names) else '?'})"
        before = (
            tree.load_step(old.dependencies[index].get("output_path") or "")
            if index < len(old.dependencies)
            else None
        )
        after = (
            tree.load_step(new.dependencies[index].get("output_path") or "")
            if index < len(new.dependencies)
            else None
        )
        summary = f"{label}: upstream version {old_deps[index][:8]} -> {new_deps[index][:8]}"
        if before is None or after is None or depth <= 0:
            result.reasons.append(summary + " (upstream output not found; cannot say why)")
            continue
        result.reasons.append(summary)
        result.upstream.append((label, explain(tree, before, after, depth - 1)))
    result.unversioned = [
        change.describe()
        for change in diff_flat(
            flatten(_dict(recorded_config(old_info))),
            flatten(_dict(recorded_config(new_info))),
            skip_unset=True,
        )
        if not (_is_tree_path(change.old, tree) and _is_tree_path(change.new, tree))
        and not _versioned_field(change.field, new_version)
    ]
    return result


def _dict(value: object) -> dict:
    """A recorded object, or {} when the tree holds something else there (trees are untrusted)."""
    return value if isinstance(value, dict) else {}


def _strings(value: object) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []


def _versioned_field(field_path: str, version: dict) -> bool:
    """Whether `field_path` of the concrete config is (inside) a versioned field."""
    config = _dict(version.get("config"))
    return any(
        field_path == key or field_path.startswith(key + ".") or field_path.startswith(key + "[")
        for key in config
    )


def previous_version(tree: OutputTree, step: StepOutput) -> StepOutput | None:
    """The most recent other output of the same step name."""
    for other in tree.versions_of(step.name):
        if other.path != step.path:
            return other
    return None
