"""`marin reproduce`: rebuild a recorded step and its upstream into a fresh prefix.

From each output's `.executor_info` (never anything pickled):

1. check that the code here is the recorded git commit (of the checkout this runs from,
   never a directory the tree names) -- refuse, naming both commits, otherwise;
2. declare the steps again from `config_template` (inputs wired to the rebuilt
   upstream steps, `versioned()` and `this_output_path()` where they were), under the
   `TrustedCode` policy below; any refusal, for any step, stops everything before a step
   runs;
3. print every function it will call (`module:qualname` and source file);
4. resolve them under the new prefix and check that every version hash equals the
   recorded one (a changed default or dataclass shows up here, with the fields);
5. run them with the executor, then compare every file of every rebuilt output with
   the original by SHA-256 and report equal, differing, missing and extra files; what a
   step function declares as records of its run (`executor.run_records`: logs, tracker
   files, timing fields) is listed, not compared.

The tree is untrusted input, so what a recorded name may reach is fixed here, not by
the tree:

- step functions and functions stored in configs (`__callable__`) are called only if
  they are plain Python functions defined (module file and source file) in this
  project's packages (`PROJECT_PACKAGES`) or in the git checkout `marin reproduce`
  runs from (the current directory's repository; the directory itself outside git),
  leaving out installed packages, the virtual environment and both output trees;
- config types must be dataclasses, Enum members or pathlib path types (checked after
  the lookup, before anything is called), from modules already imported, of the
  project or the checkout, or installed (standard library, site-packages);
- a step defined in an experiment script (`__main__:fn`) is loaded from that script only
  if it lies inside the checkout (a script recorded elsewhere is looked up at the same
  path relative to the checkout); no directory the tree records is put on `sys.path`
  or has git run in it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import site
import stat
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from executor import Executor, ExecutorStep
from executor.diffing import diff_versions
from executor.graph import is_absolute_path, resolve, validate_declaration
from executor.provenance import git_state, package_versions
from executor.run_records import NO_RUN_RECORDS, RunRecords, records_of, without_fields
from executor.store import is_within, normalize_prefix, open_store
from executor.template import TemplateError, TrustedCode, decode_template
from executor.tree import info_path
from marin.outputs import EXPERIMENTS_DIR, OutputTree, StepOutput, TreeFileError

CHUNK = 1 << 20
MAX_REWRITE_BYTES = 64 << 20
"""Files up to this size are also compared with the old prefix replaced by the new one."""

PROJECT_PACKAGES = ("executor", "operations", "marin", "experiments")
"""The packages whose functions `marin reproduce` may call wherever they are installed."""


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
    run_records: tuple[str, ...] = ()
    """Files the step function declares as records of its run (logs, tracker files, timings),
    in either output; not compared (see `executor.run_records`)."""
    fields_left_out: tuple[str, ...] = ()
    """"file: field" for each declared run-record field of a compared JSON file."""

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
    """`target` and everything upstream, dependencies first.

    Iterative: a recursive walk of a chain some 500 steps deep ran out of stack inside a
    JSON parse, which then read as "not valid JSON"."""
    order: list[StepOutput] = []
    seen: set[str] = set()
    stack: list[tuple[StepOutput, int]] = []
    on_stack: set[str] = set()

    def enter(step: StepOutput) -> None:
        if step.info is None:
            raise ReproduceError(
                _about(info_path(step.path), step.problem or "missing: the recipe of this output is gone")
            )
        stack.append((step, 0))
        on_stack.add(step.path)

    enter(target)
    while stack:
        step, index = stack[-1]
        if index == len(step.dependencies):
            stack.pop()
            on_stack.discard(step.path)
            seen.add(step.path)
            order.append(step)
            continue
        stack[-1] = (step, index + 1)
        dependency = step.dependencies[index]
        path = dependency.get("output_path")
        if not tree.contains(path):
            raise ReproduceError(
                f"{info_path(step.path)}: field '{step.dependency_field(index)}' is {path!r}, not a "
                f"path inside the prefix {tree.prefix}: refused"
            )
        if path in seen:
            continue
        if path in on_stack:
            raise ReproduceError(f"recorded dependencies form a cycle through {path}")
        upstream = tree.load_step(path)
        if upstream is None or upstream.info is None:
            why = (upstream.problem if upstream else None) or (
                "missing: the upstream output was deleted, so its recipe is gone"
            )
            raise ReproduceError(
                f"step {step.name} needs {dependency.get('name')} at {path}: {_about(info_path(path), why)}"
            )
        enter(upstream)
    return order


def _about(path: str, why: str) -> str:
    """`path: why`, unless `why` already names the file (a tree reader's problems do)."""
    return why if why.startswith(path) else f"{path}: {why}"


def _run_record(step: StepOutput) -> dict[str, Any]:
    run = (step.info or {}).get("run")
    return run if isinstance(run, dict) else {}


def _git_record(step: StepOutput) -> dict[str, Any]:
    git = _run_record(step).get("git")
    return git if isinstance(git, dict) else {}


def _refuse_working_directory_in(tree: OutputTree) -> None:
    """Refuse to run from inside the tree read: the working directory goes first on the import
    path (the experiment script's imports, and `python -c` helper processes), and git runs
    there. A file the tree holds (`random.py`, a `.git` whose config runs a command) would
    then run as code."""
    local = tree.store.local_path(tree.prefix)
    if local is None:
        return
    if is_within(os.path.realpath(os.getcwd()), os.path.realpath(local)):
        raise ReproduceError(
            f"the working directory {os.getcwd()} is inside the tree being read ({tree.prefix}); "
            "its files could be imported or run as code. Run marin reproduce from your own checkout"
        )


def checkout_root() -> str:
    """The git checkout `marin reproduce` runs from (the current directory outside git)."""
    return git_state(os.getcwd()).get("root") or os.getcwd()


def commit_checkout(checkout: str) -> tuple[str, str | None]:
    """The checkout whose commit is compared with the recorded one, and that commit:
    `checkout` when it is a git repository; else the repository holding this project's
    packages, when they are one (an editable install run from another directory, as `cd
    /tmp/run && python ~/marin/experiments/quickstart.py` does: the run recorded that
    checkout's commit, and its code is what will run); else `checkout`, with no commit.
    Never a directory the tree names."""
    state = git_state(checkout)
    if state.get("root"):
        return checkout, state.get("commit")
    for directory in _package_dirs():
        state = git_state(directory)
        if state.get("root"):
            return state["root"], state.get("commit")
    return checkout, None


def _package_dirs() -> list[str]:
    dirs = []
    for name in PROJECT_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            dirs += list(spec.submodule_search_locations or [])
    return dirs


def _installed_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    dirs = [paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    dirs += [*site.getsitepackages(), site.getusersitepackages(), sys.prefix, sys.exec_prefix]
    return [d for d in dirs if d]


def trusted_code(tree: OutputTree, new_prefix: str, checkout: str) -> TrustedCode:
    """What recorded names may reach: this project, the checkout, installed code for types."""
    trees = [tree.store.local_path(tree.prefix), open_store(new_prefix).local_path(new_prefix)]
    return TrustedCode(
        packages=_package_dirs(),
        checkout=checkout,
        installed=_installed_dirs(),
        excluded=[path for path in trees if path],
    )


_SCRIPTS: dict[str, ModuleType] = {}


def load_script(path: str) -> ModuleType:
    """The experiment script at `path` as a module (its `if __name__ == "__main__":` part does not run).

    Callers check first that `path` lies where code may run (`script_for`).
    """
    if path not in _SCRIPTS:
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
        # A heavy step's process has no module of this name: its functions and classes travel
        # by value, as `__main__`'s do when the script runs itself.
        import cloudpickle

        cloudpickle.register_pickle_by_value(module)
        _SCRIPTS[path] = module
    return _SCRIPTS[path]


def script_for(step: StepOutput, policy: TrustedCode) -> str | None:
    """The experiment script that defined `step`'s `__main__:` names, inside the checkout; None if unused.

    The recorded path is tried as it is and, when it was inside the recorded checkout, at
    the same place relative to this one; either must be a file where code may run.
    """
    info = step.info or {}
    if "__main__:" not in json.dumps([info.get("fn_name"), info.get("config_template")]):
        return None
    script = _run_record(step).get("script")
    if not isinstance(script, str) or not script:
        raise TemplateError("it was defined in an experiment script (__main__) whose path was not recorded")
    candidates = [script]
    root = _git_record(step).get("root")
    if isinstance(root, str) and os.path.isabs(root) and os.path.isabs(script) and policy.checkout:
        relative = os.path.relpath(script, root)
        if not relative.startswith(".."):
            candidates.append(os.path.join(policy.checkout, relative))
    for candidate in candidates:
        if os.path.isfile(candidate) and policy.may_run(candidate):
            return os.path.realpath(candidate)
    raise TemplateError(
        f"field 'run.script': the experiment script {script} is not a file inside this checkout "
        f"({policy.checkout}): refused (run marin reproduce from the checkout that holds it)"
    )


def add_import_roots(checkout: str) -> None:
    """Let this checkout's modules import by name (never a directory the tree records)."""
    for root in {os.getcwd(), checkout}:
        if root not in sys.path:
            sys.path.insert(0, root)


def check_commit(steps: list[StepOutput], checkout: str, allow_code_changes: bool) -> list[str]:
    """Refuse (ReproduceError) when this checkout is not at the recorded git commit."""
    warnings: list[str] = []
    problems: list[str] = []
    commits: dict[str, tuple[str, bool]] = {}
    for step in steps:
        git = _git_record(step)
        commit = git.get("commit")
        if isinstance(commit, str) and commit:
            commits.setdefault(commit, (step.name, bool(git.get("dirty"))))
    # (One `git` call per place looked at: the state is read once, not again for the commit.)
    checkout, current = commit_checkout(checkout) if commits else (checkout, None)
    for commit, (name, dirty) in sorted(commits.items(), key=lambda item: item[1][0]):
        if current != commit:
            message = (
                f"{name} was made by git commit {commit[:12]}; this checkout ({checkout}) is at "
                f"{current[:12] if current else 'no git commit'}"
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


def package_drift(tree: OutputTree, steps: list[StepOutput]) -> list[str]:
    """Packages whose installed version differs from the recorded run's (a warning, not a refusal)."""
    manifests = {_run_record(step).get("experiment") for step in steps}
    experiments_dir = f"{tree.prefix}/{EXPERIMENTS_DIR}/"
    now = package_versions()
    drift: dict[str, tuple[str, str]] = {}
    notes: list[str] = []
    for manifest in sorted(m for m in manifests if isinstance(m, str)):
        if not (tree.contains(manifest) and manifest.startswith(experiments_dir)):
            notes.append(f"experiment manifest {manifest!r} is not under {experiments_dir}: not read")
            continue
        try:
            data = tree.read_record(manifest)
            recorded = (json.loads(data) if data else {}).get("packages") or {}
        except TreeFileError as error:
            notes.append(str(error))
            continue
        except (ValueError, AttributeError, RecursionError):
            notes.append(f"{manifest} is not a JSON object: package versions not compared")
            continue
        if not isinstance(recorded, dict):
            continue
        for name, version in recorded.items():
            if now.get(name) != version:
                drift[name] = (str(version), now.get(name) or "not installed")
    if not drift:
        return notes
    listed = ", ".join(f"{name} {old} -> {new}" for name, (old, new) in sorted(drift.items())[:12])
    more = f" and {len(drift) - 12} more" if len(drift) > 12 else ""
    return [*notes, f"{len(drift)} installed packages differ from the recorded run: {listed}{more}"]


def rebuild_steps(steps: list[StepOutput], old_prefix: str, policy: TrustedCode) -> dict[str, ExecutorStep]:
    """Declarations equivalent to the recorded ones, keyed by the original output path.

    Checks every step before returning; one ReproduceError lists every refusal (the
    `.executor_info` file, the field and the name). Nothing recorded is called here
    except the constructors of checked dataclass, enum and path types.
    """
    built: dict[str, ExecutorStep] = {}
    problems: list[str] = []
    calls: list[str] = []

    def input_step(path: str) -> ExecutorStep:
        if path not in built:
            raise TemplateError(f"input {path} is not among the rebuilt upstream steps")
        return built[path]

    for step in steps:
        info = step.info or {}
        where = f"{info_path(step.path)} ({step.name})"
        if "config_template" not in info:
            problems.append(
                f"{where}: no config_template (written by an older version of the executor); re-run the "
                "step once to record it"
            )
            continue
        approved = len(policy.approved)
        try:
            script = script_for(step, policy)
            policy.aliases = {"__main__": load_script(script)} if script else {}
            fn = policy.function(info.get("fn_name"), "fn_name")
            # (A tree copied or moved since the run: its records name the prefix it had then.)
            config = decode_template(
                info["config_template"],
                lambda path, step=step: input_step(step.relocated(path)),
                policy=policy,
            )
            override = info.get("override_output_path")
            if override is not None and not isinstance(override, str):
                raise TemplateError(f"field 'override_output_path' is {override!r}, not a path")
        except TemplateError as error:
            problems.append(f"{where}: {error}")
            continue
        if override and is_absolute_path(override):
            override = step.relocated(override)
            if not override.startswith(old_prefix + "/"):
                problems.append(
                    f"{where}: writes to the absolute path {override} (override_output_path), outside "
                    "the prefix: reproducing it would overwrite the original"
                )
                continue
            override = override[len(old_prefix) + 1 :]
        for field_name, name, source in policy.approved[approved:]:
            role = "its function" if field_name == "fn_name" else f"in config field {field_name!r}"
            calls.append(f"{step.name}: {name} ({role}), defined in {source}")
        description = info.get("description")
        groups = info.get("pip_dependency_groups")
        try:
            rebuilt = ExecutorStep(
                name=str(info.get("name") or step.name),
                fn=fn,
                config=config,
                description=description if isinstance(description, str) else None,
                override_output_path=override,
                pip_dependency_groups=groups if isinstance(groups, list) else None,
                resources=info.get("resources"),
            )
            # Here, not at resolve: a refusal names this .executor_info, before the list of calls.
            validate_declaration(rebuilt)
            built[step.path] = rebuilt
        except (ValueError, TypeError) as error:
            problems.append(f"{where}: {error}")
    if problems:
        raise ReproduceError(
            "cannot reproduce (nothing was run):\n" + "\n".join(f"  - {p}" for p in problems)
        )
    return built, calls


def is_internal(relpath: str) -> bool:
    """Hidden files (`.plan.json`, `.dedup_work/...`): an operation's resume state, not its output."""
    return any(part.startswith(".") for part in relpath.split("/"))


def _regular_inside(tree: OutputTree, path: str, local: str) -> bool:
    try:
        return not tree.leads_outside(path) and stat.S_ISREG(os.stat(local).st_mode)
    except OSError:
        return False


def file_digests(
    tree: OutputTree,
    step: StepOutput,
    replace: tuple[str, str] | None = None,
    only: set[str] | None = None,
    records: RunRecords = NO_RUN_RECORDS,
    listing: list[tuple[str, int]] | None = None,
) -> dict[str, str]:
    """SHA-256 of every file of an output (bookkeeping files and declared run records excluded), streamed.

    With `replace=(old, new)`, the digest is of the content with `old` replaced by `new`
    (for files small enough to hold: they record their own location). `only` limits the
    files read. A JSON file with declared run-record fields is digested as canonical JSON
    without those fields. `listing` is `tree.files(step)` when the caller has it already.
    """
    digests = {}
    for rel, size in tree.files(step) if listing is None else listing:
        if (only is not None and rel not in only) or records.is_record_file(rel):
            continue
        path = f"{step.path}/{rel}"
        local = tree.store.local_path(path)
        if local is not None and not _regular_inside(tree, path, local):
            # A link out of the tree, a broken link or a device/FIFO: compare what it is, never read it.
            target = os.readlink(local) if os.path.islink(local) else "special file"
            digests[rel] = "not read: " + target
            continue
        fields = records.fields_of(rel)
        digest = hashlib.sha256()
        with tree.store.fs.open(tree.store.fs_path(path), "rb") as handle:
            if (replace is not None or fields) and size <= MAX_REWRITE_BYTES:
                data = handle.read()
                if replace is not None:
                    data = data.replace(replace[0].encode(), replace[1].encode())
                if fields:
                    data = without_fields(data, fields) or data
                digest.update(data)
            else:
                while chunk := handle.read(CHUNK):
                    digest.update(chunk)
        digests[rel] = digest.hexdigest()
    return digests


def compare_outputs(
    original: OutputTree,
    old: StepOutput,
    copy: OutputTree,
    new: StepOutput,
    records: RunRecords = NO_RUN_RECORDS,
) -> FileComparison:
    """File-by-file comparison; files equal once the prefix is swapped count as equal.

    `records` (what the step function declares about its run) leaves files and JSON fields
    that describe the run rather than its result out of the comparison.
    """
    # Each output is listed once (a listing is a request per directory on a bucket).
    old_files, new_files = list(original.files(old)), list(copy.files(new))
    before = file_digests(original, old, records=records, listing=old_files)
    after = file_digests(copy, new, records=records, listing=new_files)
    different = {k for k in before.keys() & after.keys() if before[k] != after[k]}
    if different:
        swapped = file_digests(
            original,
            old,
            replace=(original.prefix, copy.prefix),
            only=different,
            records=records,
            listing=old_files,
        )
        different = {k for k in different if swapped[k] != after[k]}
    same = sorted(k for k in before.keys() & after.keys() if k not in different)
    record_files = {rel for rel, _ in old_files + new_files if records.is_record_file(rel)}
    fields_left_out = [
        f"{rel}: {field}" for rel in same + sorted(different) for field in records.fields_of(rel)
    ]
    return FileComparison(
        name=old.name,
        original=old.path,
        reproduced=new.path,
        same=tuple(same),
        different=tuple(sorted(k for k in different if not is_internal(k))),
        internal_different=tuple(sorted(k for k in different if is_internal(k))),
        only_original=tuple(sorted(k for k in before.keys() - after.keys() if not is_internal(k))),
        only_reproduced=tuple(sorted(k for k in after.keys() - before.keys() if not is_internal(k))),
        run_records=tuple(sorted(record_files)),
        fields_left_out=tuple(fields_left_out),
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
    """Rebuild `ref` (and its upstream) from `tree` into `new_prefix` and compare outputs.

    Raises ReproduceError, before any step runs, when the code is not at the recorded
    commit or a recorded name is refused (see the module docstring).
    """
    target = tree.find(ref)
    new_prefix = normalize_prefix(new_prefix)
    for a, b in ((new_prefix, tree.prefix), (tree.prefix, new_prefix)):
        if a == b or a.startswith(b + "/"):
            raise ReproduceError(
                f"--into {new_prefix} overlaps the tree the output lives in ({tree.prefix}); give a fresh prefix"
            )
    _refuse_working_directory_in(tree)
    steps = _closure(tree, target)
    report = ReproduceReport(target=target.path, new_prefix=new_prefix, steps=[s.name for s in steps])
    checkout = checkout_root()
    report.warnings += check_commit(steps, checkout, allow_code_changes)
    report.warnings += package_drift(tree, steps)
    for warning in report.warnings:
        progress(f"warning: {warning}")
    policy = trusted_code(tree, new_prefix, checkout)
    add_import_roots(checkout)
    built, calls = rebuild_steps(steps, tree.prefix, policy)
    progress("functions it will call (checked: defined in this project or this checkout):")
    for call in calls:
        progress(f"  {call}")
    try:
        graph = resolve([built[target.path]], new_prefix)
    except (ValueError, TypeError) as error:
        raise ReproduceError(f"the rebuilt steps cannot be resolved: {error}") from error
    mismatches = []
    for step in steps:
        resolved = graph.resolved(built[step.path])
        recorded = step.version_hash
        if recorded != resolved.version_hash:
            recorded_version = (step.info or {}).get("version")
            try:
                reasons = diff_versions(
                    recorded_version if isinstance(recorded_version, dict) else {}, resolved.version
                ) or ["(versions differ)"]
            except (AttributeError, TypeError, KeyError):
                reasons = ["(the recorded version is malformed)"]
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
        records = records_of(built[step.path].fn)
        report.comparisons.append(compare_outputs(tree, step, copy, reproduced, records))
    return report
