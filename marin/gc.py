"""`marin gc`: outputs that nothing needs any more.

Garbage is an output that no experiment manifest references, or one that failed
(FAILED, DEP_FAILED), or one abandoned mid-run (RUNNING or no status, and no live
lease). An output whose lease is live is being written right now and is never garbage.
Successful outputs referenced by a manifest are never garbage.

The tree is untrusted input: only directories strictly inside the prefix are listed or
deleted (an output directory that is a symbolic link out of the prefix, or a manifest
entry naming a path elsewhere, is left alone), an output reached through a link inside the
prefix is never deleted by that name (its real directory is listed under its own), an
output whose status file exists but was not read (too large, not a regular file, not a
status history, a status word this version does not know) is kept and reported, not
taken for abandoned, and bookkeeping files are read through `OutputTree`'s capped,
JSON-only reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from executor.lease import LeaseConfig, lease_is_stale
from marin.outputs import OutputTree, StepOutput


@dataclass(frozen=True)
class Garbage:
    step: StepOutput
    reason: str
    size: int


def find_garbage(
    tree: OutputTree, lease_timeout: float | None = None, now: float | None = None
) -> list[Garbage]:
    """Collectable outputs with the reason and size of each, sorted by path."""
    timeout = LeaseConfig().timeout if lease_timeout is None else lease_timeout
    referenced = tree.referenced_paths()
    found: list[tuple[StepOutput, str]] = []
    for step in tree.steps:
        if not _deletable(tree, step) or step.status_unread:
            continue
        if not lease_is_stale(tree.lease(step), timeout, now):
            continue  # running now
        if step.status in ("FAILED", "DEP_FAILED"):
            message = step.last_event.message if step.last_event else None
            found.append((step, f"{step.status.lower()}" + (f": {message}" if message else "")))
        elif step.status in ("RUNNING", "UNKNOWN"):
            found.append((step, "abandoned: no live lease and never finished"))
        elif step.path not in referenced:
            found.append((step, "not referenced by any experiment manifest"))
    sizes = tree.sizes([step for step, _ in found])
    return [Garbage(step, reason, sizes[step.path]) for step, reason in found]


def unread_outputs(tree: OutputTree) -> list[StepOutput]:
    """Outputs gc keeps because their status file could not be read (see the module docstring)."""
    return [step for step in tree.steps if step.status_unread and _deletable(tree, step)]


def _deletable(tree: OutputTree, step: StepOutput) -> bool:
    """Inside the prefix by name and, on local disk, by its real name: no link on the way."""
    return tree.contains(step.path) and not tree.reached_through_link(step.path)


def delete_garbage(
    tree: OutputTree, garbage: list[Garbage], lease_timeout: float | None = None
) -> list[Garbage]:
    """Delete each output unless a driver took its lease since it was listed; returns what was deleted."""
    timeout = LeaseConfig().timeout if lease_timeout is None else lease_timeout
    deleted = []
    for item in garbage:
        if not _deletable(tree, item.step):
            continue
        if not lease_is_stale(tree.lease(item.step), timeout):
            continue
        tree.store.delete_tree(item.step.path)
        deleted.append(item)
    return deleted
