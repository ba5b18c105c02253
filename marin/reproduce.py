"""`marin reproduce`: rebuild a recorded step and its upstream into a fresh prefix.

From each output's `.executor_info` (never anything pickled):

1. check that the step function and every config type are importable (`module:qualname`)
   and that the code is the recorded git commit -- refuse, saying which, otherwise;
2. declare the steps again from `config_template` (inputs wired to the rebuilt
   upstream steps, `versioned()` and `this_output_path()` where they were);
3. resolve them under the new prefix and check that every version hash equals the
   recorded one (a changed default or dataclass shows up here, with the fields);
4. run them with the executor, then compare every file of every rebuilt output with
   the original by SHA-256 and report equal, differing, missing and extra files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from executor import Executor, ExecutorStep
from executor.diffing import diff_versions
from executor.graph import is_absolute_path, resolve
from executor.provenance import git_state, package_versions
from executor.store import Store, normalize_prefix, open_store
from executor.template import TemplateError, decode_template, import_qualified
from marin.outputs import OutputTree, StepOutput

CHUNK = 1 << 20
MAX_REWRITE_BYTES = 64 << 20
"""Files up to this size are also compared with the old prefix replaced by the new one."""


class ReproduceError(RuntimeError):
    """The recorded step cannot be rebuilt faithfully here (the message says why and what to do)."""


@dataclass(frozen=True)
class FileComparison:
    """Per-output result of comparing the original with the reproduction."""

    name: str
    original: str
    reproduced: str
    same: tuple[str, ...] = ()
    different: tuple[str, ...] = ()
    only_original: tuple[str, ...] = ()
    only_reproduced: tuple[str, ...] = ()
    internal_different: tuple[str, ...] = ()
    """Hidden resume-state files that differ (they may record input paths); not counted."""

    @property
    def equal(self) -> bool:
        return not (self.different or self.only_original or self.only_reproduced)


@dataclass
class ReproduceReport:
    """What `reproduce` did and found."""

    target: str
    new_prefix: str
    steps: list[str] = field(default_factory=list)
    """Names of the rebuilt steps, upstream first."""

    warnings: list[str] = field(default_factory=list)
    comparisons: list[FileComparison] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return all(comparison.equal for comparison in self.comparisons)


def _closure(tree: OutputTree, target: StepOutput) -> list[StepOutput]:
    """`target` and everything upstream, dependencies first."""
    order: list[StepOutput] = []
    seen: set[str] = set()

    def visit(step: StepOutput, chain: tuple[str, ...]) -> None:
        if step.path in seen:
            return
        for dependency in step.dependencies:
            path = dependency.get("output_path")
            if path in chain:
                raise ReproduceError(f"recorded dependencies form a cycle through {path}")
            upstream = tree.load_step(path) if path else None
            if upstream is None or upstream.info is None:
                raise ReproduceError(
                    f"step {step.name} needs {dependency.get('name')} at {path}, whose .executor_info is "
                    "missing: the upstream output was deleted, so its recipe is gone"
                )
            visit(upstream, (*chain, step.path))
        seen.add(step.path)
        order.append(step)

    visit(target, ())
    return order


def _run_record(step: StepOutput) -> dict[str, Any]:
    return (step.info or {}).get("run") or {}


_SCRIPTS: dict[str, ModuleType] = {}


def load_script(path: str) -> ModuleType:
    """The experiment script at `path` as a module (its `if __name__ == "__main__":` part does not run)."""
    if path not in _SCRIPTS:
        if not os.path.isfile(path):
            raise TemplateError(f"the experiment script {path} that defined it no longer exists")
        name = "_marin_script_" + hashlib.sha256(path.encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise TemplateError(f"cannot load the experiment script {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            del sys.modules[name]
            raise TemplateError(
                f"loading the experiment script {path} failed: {type(error).__name__}: {error}"
            ) from error
        _SCRIPTS[path] = module
    return _SCRIPTS[path]


def modules_for(step: StepOutput) -> dict[str, ModuleType]:
    """Module aliases for decoding `step`'s recorded names: `__main__` is its experiment script."""
    info = step.info or {}
    if "__main__:" not in json.dumps([info.get("fn_name"), info.get("config_template")]):
        return {}
    script = _run_record(step).get("script")
    if not script:
        raise TemplateError(
            f"{step.name} was defined in an experiment script (__main__) whose path was not recorded"
        )
    return {"__main__": load_script(script)}


def add_import_roots(steps: list[StepOutput]) -> None:
    """Let recorded module names import the way they did: the run's working directory and repository."""
    roots = [os.getcwd()]
    for step in steps:
        run = _run_record(step)
        roots += [run.get("cwd"), (run.get("git") or {}).get("root")]
    # In front, as for the original run (`python -m`, pytest): a project's own top-level
    # packages must win over same-named ones that some installed distribution ships.
    for root in reversed(roots):
        if root and os.path.isdir(root) and root not in sys.path:
            sys.path.insert(0, root)


def check_code(steps: list[StepOutput], allow_code_changes: bool) -> list[str]:
    """Refuse (ReproduceError) when recorded code is not importable or not at the recorded commit."""
    warnings: list[str] = []
    problems: list[str] = []
    add_import_roots(steps)
    for step in steps:
        info = step.info or {}
        if "config_template" not in info:
            problems.append(
                f"{step.name} ({step.relpath}): no config_template in .executor_info (written by an older "
                "version of the executor); re-run the step once to record it"
            )
            continue
        try:
            import_qualified(info.get("fn_name", ""), "fn", modules_for(step))
        except TemplateError as error:
            problems.append(f"{step.name}: step function {info.get('fn_name')} is not importable: {error}")
    commits = {}
    for step in steps:
        git = _run_record(step).get("git") or {}
        if git.get("commit"):
            commits[(git.get("root"), git["commit"])] = (step.name, bool(git.get("dirty")))
    for (root, commit), (name, dirty) in sorted(commits.items(), key=lambda item: item[1][0]):
        current = git_state(root if root and os.path.isdir(root) else os.getcwd())
        if current.get("commit") != commit:
            message = (
                f"{name} was made by git commit {commit[:12]} of {root}; the code here is at "
                f"{(current.get('commit') or 'no git checkout')[:12]}"
            )
            if allow_code_changes:
                warnings.append(message + " (--allow-code-changes given: going on)")
            else:
                problems.append(message + f": run `git checkout {commit[:12]}` or pass --allow-code-changes")
        if dirty:
            warnings.append(
                f"{name} was made from a checkout of {commit[:12]} with uncommitted changes; they were not "
                "recorded, so outputs may differ for that reason"
            )
    if not commits:
        warnings.append("no git commit was recorded for these steps: the code version cannot be checked")
    if problems:
        raise ReproduceError("cannot reproduce:\n" + "\n".join(f"  - {p}" for p in problems))
    return warnings


def package_drift(store: Store, steps: list[StepOutput]) -> list[str]:
    """Packages whose installed version differs from the recorded run's (a warning, not a refusal)."""
    manifests = {_run_record(step).get("experiment") for step in steps} - {None}
    now = package_versions()
    drift: dict[str, tuple[str, str]] = {}
    for manifest in sorted(manifests):
        text = store.read_text(manifest)
        if not text:
            continue
        recorded = (json.loads(text).get("packages")) or {}
        for name, version in recorded.items():
            if now.get(name) != version:
                drift[name] = (version, now.get(name) or "not installed")
    if not drift:
        return []
    listed = ", ".join(f"{name} {old} -> {new}" for name, (old, new) in sorted(drift.items())[:12])
    more = f" and {len(drift) - 12} more" if len(drift) > 12 else ""
    return [f"{len(drift)} installed packages differ from the recorded run: {listed}{more}"]


def rebuild_steps(steps: list[StepOutput], old_prefix: str) -> dict[str, ExecutorStep]:
    """Declarations equivalent to the recorded ones, keyed by the original output path."""
    built: dict[str, ExecutorStep] = {}

    def input_step(path: str) -> ExecutorStep:
        if path not in built:
            raise TemplateError(f"input {path} is not among the rebuilt upstream steps")
        return built[path]

    for step in steps:
        info = step.info or {}
        try:
            modules = modules_for(step)
            config = decode_template(info["config_template"], input_step, modules=modules)
            fn: Callable[..., Any] = import_qualified(info["fn_name"], "fn", modules)
        except TemplateError as error:
            raise ReproduceError(f"cannot rebuild {step.name} ({step.relpath}): {error}") from error
        override = info.get("override_output_path")
        if override and is_absolute_path(override):
            if not override.startswith(old_prefix + "/"):
                raise ReproduceError(
                    f"{step.name} writes to the absolute path {override} (override_output_path), outside "
                    "the prefix: reproducing it would overwrite the original"
                )
            override = override[len(old_prefix) + 1 :]
        built[step.path] = ExecutorStep(
            name=info["name"],
            fn=fn,
            config=config,
            description=info.get("description"),
            override_output_path=override,
            pip_dependency_groups=info.get("pip_dependency_groups"),
            resources=info.get("resources"),
        )
    return built


def is_internal(relpath: str) -> bool:
    """Hidden files (`.plan.json`, `.dedup_work/...`): an operation's resume state, not its output."""
    return any(part.startswith(".") for part in relpath.split("/"))


def file_digests(
    tree: OutputTree,
    step: StepOutput,
    replace: tuple[str, str] | None = None,
    only: set[str] | None = None,
) -> dict[str, str]:
    """SHA-256 of every file of an output (bookkeeping files excluded), streamed.

    With `replace=(old, new)`, the digest is of the content with `old` replaced by `new`
    (for files small enough to hold: they record their own location). `only` limits the
    files read.
    """
    digests = {}
    for rel, size in tree.files(step):
        if only is not None and rel not in only:
            continue
        digest = hashlib.sha256()
        with tree.store.fs.open(tree.store.fs_path(f"{step.path}/{rel}"), "rb") as handle:
            if replace is not None and size <= MAX_REWRITE_BYTES:
                digest.update(handle.read().replace(replace[0].encode(), replace[1].encode()))
            else:
                while chunk := handle.read(CHUNK):
                    digest.update(chunk)
        digests[rel] = digest.hexdigest()
    return digests


def compare_outputs(
    original: OutputTree, old: StepOutput, copy: OutputTree, new: StepOutput
) -> FileComparison:
    """File-by-file comparison; files equal once the prefix is swapped count as equal."""
    before, after = file_digests(original, old), file_digests(copy, new)
    different = {k for k in before.keys() & after.keys() if before[k] != after[k]}
    if different:
        swapped = file_digests(original, old, replace=(original.prefix, copy.prefix), only=different)
        different = {k for k in different if swapped[k] != after[k]}
    same = sorted(k for k in before.keys() & after.keys() if k not in different)
    return FileComparison(
        name=old.name,
        original=old.path,
        reproduced=new.path,
        same=tuple(same),
        different=tuple(sorted(k for k in different if not is_internal(k))),
        internal_different=tuple(sorted(k for k in different if is_internal(k))),
        only_original=tuple(sorted(k for k in before.keys() - after.keys() if not is_internal(k))),
        only_reproduced=tuple(sorted(k for k in after.keys() - before.keys() if not is_internal(k))),
    )


def source_prefix(output_path: str, name: str) -> str | None:
    """The prefix `<prefix>/<name>-<hash>` was written under, or None for another layout."""
    path = output_path.rstrip("/")
    stem, _, digest = path.rpartition("-")
    if digest and stem.endswith("/" + name):
        return stem[: -len(name) - 1]
    return None


def reproduce(
    tree: OutputTree,
    ref: str,
    new_prefix: str,
    allow_code_changes: bool = False,
    progress: Callable[[str], None] = print,
) -> ReproduceReport:
    """Rebuild `ref` (and its upstream) from `tree` into `new_prefix` and compare outputs."""
    target = tree.find(ref)
    new_prefix = normalize_prefix(new_prefix)
    if new_prefix == tree.prefix:
        raise ReproduceError(f"--prefix {new_prefix} is the prefix the output lives in; give a fresh one")
    steps = _closure(tree, target)
    report = ReproduceReport(target=target.path, new_prefix=new_prefix, steps=[s.name for s in steps])
    report.warnings += check_code(steps, allow_code_changes)
    report.warnings += package_drift(tree.store, steps)
    for warning in report.warnings:
        progress(f"warning: {warning}")
    built = rebuild_steps(steps, tree.prefix)
    graph = resolve([built[target.path]], new_prefix)
    mismatches = []
    for step in steps:
        resolved = graph.resolved(built[step.path])
        recorded = step.version_hash
        if recorded != resolved.version_hash:
            reasons = diff_versions((step.info or {}).get("version", {}), resolved.version) or [
                "(versions differ)"
            ]
            mismatches.append(
                f"{step.name}: recorded {str(recorded)[:8]}, rebuilt {resolved.version_hash[:8]}: "
                + "; ".join(reasons)
            )
    if mismatches:
        raise ReproduceError(
            "the rebuilt steps do not hash the same as the recorded ones (the code or its defaults changed):\n"
            + "\n".join(f"  - {m}" for m in mismatches)
        )
    progress(f"rebuilt {len(steps)} step(s) with identical version hashes; running into {new_prefix}")
    Executor(new_prefix, description=f"marin reproduce {target.relpath}").run([built[target.path]])
    copy = OutputTree(new_prefix, open_store(new_prefix))
    for step in steps:
        new_path = graph.resolved(built[step.path]).output_path
        reproduced = copy.load_step(new_path)
        if reproduced is None:
            raise ReproduceError(f"{step.name}: the reproduction wrote nothing at {new_path}")
        report.comparisons.append(compare_outputs(tree, step, copy, reproduced))
    return report
