"""`marin gc`: outputs that nothing needs any more.

Garbage is an output that no experiment manifest references, or one that failed
(FAILED, DEP_FAILED), or one abandoned mid-run (RUNNING or no status, and no live
lease). An output whose lease is live is being written right now and is never garbage.
Successful outputs referenced by a manifest are never garbage. While any manifest under
`experiments/` cannot be read (truncated, not JSON, a directory, no list of steps), no
output is garbage for being unreferenced: it may be that manifest's. A tree copied or
moved to another prefix keeps its manifests' absolute paths; they are read relative to the
prefix each manifest records (`Experiment.output_path`).

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
    tree: OutputTree,
    lease_timeout: float | None = None,
    now: float | None = None,
    kept: list[tuple[StepOutput, str]] | None = None,
) -> list[Garbage]:
    """Collectable outputs with the reason and size of each, sorted by path.

    `kept`, when given, receives (output, why) for each output that looks collectable but is
    kept: its status file could not be read, or it holds another output that is not garbage.
    """
    timeout = LeaseConfig().timeout if lease_timeout is None else lease_timeout
    kept = [] if kept is None else kept
    referenced = tree.referenced_paths()
    found: list[tuple[StepOutput, str]] = []
    for step in tree.steps:
        if not _deletable(tree, step):
            continue
        if step.status_unread:
            kept.append((step, f"{step.problem}; its state is unknown"))
            continue
        if not lease_is_stale(tree.lease(step), timeout, now):
            continue  # running now
        if step.status in ("FAILED", "DEP_FAILED"):
            message = step.last_event.message if step.last_event else None
            found.append((step, f"{step.status.lower()}" + (f": {message}" if message else "")))
        elif step.status in ("RUNNING", "UNKNOWN"):
            found.append((step, "abandoned: no live lease and never finished"))
        elif step.path not in referenced:
            if tree.manifest_problems:  # it may be one of theirs: deleting it could lose a result
                kept.append((step, f"not referenced by any manifest read, but {_unread(tree)}"))
            else:
                found.append((step, "not referenced by any experiment manifest"))
    found = _without_live_insides(tree, found, kept)
    sizes = tree.sizes([step for step, _ in found])
    return [Garbage(step, reason, sizes[step.path]) for step, reason in found]


def _unread(tree: OutputTree) -> str:
    problems = tree.manifest_problems
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{len(problems)} experiment manifest(s) could not be read: {problems[0]}{more}"


def _without_live_insides(
    tree: OutputTree, found: list[tuple[StepOutput, str]], kept: list[tuple[StepOutput, str]]
) -> list[tuple[StepOutput, str]]:
    """`found` less every output with another output inside it that is not garbage itself.

    One experiment cannot nest a step's output in another's, but two can (an
    `override_output_path` under a path where another experiment's step failed): deleting
    the outer directory would take the inner, live output with it.
    """
    garbage = {step.path for step, _ in found}
    live = [step for step in tree.steps if step.path not in garbage]
    out = []
    for step, why in found:
        inside = next((other for other in live if other.path.startswith(step.path + "/")), None)
        if inside is None:
            out.append((step, why))
        else:
            kept.append((step, f"{why}, but it holds {inside.relpath}, which is not garbage"))
    return out


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
