"""The `marin` command: look at, explain, reproduce and clean an output tree.

    marin ls                         experiments and steps: status, age, duration, size
    marin show <name|hash|path>      one step: info, config, version, history, lease, log, files
    marin tree <experiment>          the experiment's DAG with each step's status
    marin why <step>                 why this version's hash differs from the previous one
    marin diff <a> <b>               the same, for any two outputs
    marin reproduce <step> --into NEW     rebuild it into NEW and compare the outputs
    marin gc [--yes]                 unreferenced, failed and abandoned outputs (delete with --yes)
    marin leaderboard [PATTERN]      training runs ranked on equal tokens by eval loss (or --by bpb)
    marin predictions [PATTERN]      pre-registered loss predictions and their outcomes
    marin browse [--port N]          the web browser

The tree is read through the executor's store, so every command works on local disk
and on fsspec storage (`s3://`, `gs://`). `--prefix` always names the tree read (default
`$MARIN_PREFIX`, else `./marin-output`, as for experiments); `marin reproduce` writes
where `--into` says. Reading a tree parses JSON only and runs none of its names; what
`marin reproduce` may call is described in `marin.reproduce`.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence

from executor.main import resolve_prefix
from executor.outcomes import ExecutorRunError
from executor.store import StoreError, normalize_prefix, open_store
from executor.template import TemplateError
from executor.tree import Status, info_path, utc_now_iso
from marin.explain import explain, previous_version
from marin.gc import delete_garbage, find_garbage
from marin.leaderboard import (
    MAX_COMPARED_FIELDS,
    METRICS,
    as_json,
    compared_fields_cut,
    describe_differences,
    rank,
    training_runs,
)
from marin.outputs import (
    OutputTree,
    RefError,
    StepOutput,
    TreeFileError,
    human_duration,
    human_size,
    iso_age,
)
from marin.predictions import describe as describe_prediction
from marin.predictions import prediction_of, predictions
from marin.reproduce import ReproduceError, reproduce, source_prefix
from marin.terminal import SafeStream, one_line


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


def _table(rows: list[list[str]], header: list[str]) -> str:
    rows = [[one_line(str(cell)) for cell in row] for row in rows]
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(header, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(lines)


def _outcome(entry: dict) -> str:
    """A manifest step's recorded outcome, "?" when the manifest holds no word there."""
    outcome = entry.get("outcome")
    return outcome if isinstance(outcome, str) and outcome else "?"


def _tree(args: argparse.Namespace) -> OutputTree:
    try:
        # (refuses an empty --prefix or MARIN_PREFIX: an unset shell variable would point
        # `gc --yes` at $MARIN_PREFIX or ./marin-output, as experiment scripts refuse it)
        prefix = resolve_prefix(args.prefix)
    except ValueError as error:  # executor.main.UsageError
        raise CliError(str(error)) from None
    try:
        tree = OutputTree(prefix)
        tree.store.check_readable(tree.prefix)
    except StoreError as error:
        raise CliError(str(error)) from error
    if tree.store.local_path(tree.prefix) is not None and not os.path.isdir(
        tree.store.local_path(tree.prefix)
    ):
        raise CliError(
            f"no output tree at {tree.prefix}: run an experiment first, or pass --prefix / set MARIN_PREFIX"
        )
    return tree


# -- ls ------------------------------------------------------------------------
def cmd_ls(args: argparse.Namespace) -> int:
    tree = _tree(args)
    steps = tree.steps
    if args.status:
        steps = [s for s in steps if s.status == args.status]
    if args.name:
        steps = [s for s in steps if args.name in s.relpath]
    sizes = tree.sizes(steps) if not args.no_size else {}
    for problem in tree.problems + [s.problem for s in steps if s.problem]:
        print(f"warning: {problem}", file=sys.stderr)
    if args.json:
        print(
            json.dumps(
                {
                    "prefix": tree.prefix,
                    "experiments": [
                        {
                            "id": e.id,
                            "path": e.path,
                            "created": e.created,
                            "steps": len(e.steps),
                            "git": e.git,
                        }
                        for e in tree.experiments
                    ],
                    "steps": [
                        {
                            "name": s.name,
                            "path": s.path,
                            "hash": s.short_hash,
                            "status": s.status,
                            "finished": s.finished,
                            "duration_s": s.duration_s,
                            "size": sizes.get(s.path),
                        }
                        for s in steps
                    ],
                },
                indent=2,
            )
        )
        return 0
    print(f"prefix: {tree.prefix}")
    if not args.steps_only:
        rows = []
        for experiment in tree.experiments:
            outcomes = Counter(_outcome(entry) for entry in experiment.steps)
            commit = str(experiment.git.get("commit") or "")[:8] + (
                "+dirty" if experiment.git.get("dirty") else ""
            )
            rows.append(
                [
                    experiment.id,
                    iso_age(experiment.created),
                    str(len(experiment.steps)),
                    " ".join(f"{k}:{v}" for k, v in sorted(outcomes.items())),
                    commit,
                ]
            )
        print(f"\nexperiments ({len(rows)})")
        print(_table(rows, ["EXPERIMENT", "RAN", "STEPS", "OUTCOMES", "GIT"]) if rows else "  (none)")
    rows = [
        [
            s.status,
            iso_age(s.last_event.date if s.last_event else None),
            human_duration(s.duration_s),
            human_size(sizes.get(s.path)) if sizes else "",
            s.relpath,
        ]
        for s in steps
    ]
    print(f"\nsteps ({len(rows)})")
    print(_table(rows, ["STATUS", "AGE", "DURATION", "SIZE", "OUTPUT"]) if rows else "  (none)")
    return 0


# -- show ----------------------------------------------------------------------
def cmd_show(args: argparse.Namespace) -> int:
    tree = _tree(args)
    step = _find(tree, args.ref)
    info = step.info or {}
    prediction = prediction_of(tree, step)
    if args.json:
        shown = {"path": step.path, "info": info, "status": [e.__dict__ for e in step.history]}
        if prediction is not None:
            shown["prediction"] = prediction.as_json()
        print(json.dumps(shown, default=str, indent=2))
        return 0
    others = [s.relpath for s in tree.versions_of(step.name) if s.path != step.path]
    print(f"{step.name}  [{step.status}]")
    print(f"  output:      {step.path}")
    print(f"  version:     {step.version_hash or '?'}")
    print(f"  function:    {info.get('fn_name', '?')}")
    if step.problem:
        print(f"  NOT READ:    {step.problem}")
    if info.get("description"):
        print(f"  description: {info['description']}")
    if others:
        print(f"  other versions: {', '.join(others)}")
    run = _dict(info.get("run"))
    if run.get("git"):
        git = _dict(run["git"])
        print(
            f"  git:         {git.get('commit')} {'(dirty)' if git.get('dirty') else ''} {git.get('root') or ''}".rstrip()
        )
    if run.get("experiment"):
        print(f"  experiment:  {run['experiment']}")
    if prediction is not None:
        print()
        print("\n".join(describe_prediction(prediction)))
    print("\ninputs:")
    for dep in step.dependencies:
        upstream = tree.by_path.get(str(dep.get("output_path")))
        status = upstream.status if upstream else "missing"
        blocking = "" if dep.get("blocking", True) else " (nonblocking)"
        name = dep.get("name") or (upstream.name if upstream else "?")
        print(f"  {name}: {dep.get('output_path')} [{status}]{blocking}")
    if not step.dependencies:
        print("  (none)")
    print("\nversion (what the hash covers):")
    print(_indent(json.dumps(_dict(_dict(info.get("version")).get("config")), indent=2, sort_keys=True)))
    print("\nconfig:")
    print(_indent(json.dumps(info.get("config", {}), indent=2, sort_keys=True)))
    print("\nstatus history:")
    for event in step.history:
        extra = ", ".join(f"{k}={v}" for k, v in sorted(event.extra.items()) if k in ("duration_s",))
        print(
            one_line(
                f"  {event.date}  {event.status.value:<10} {event.worker or ''} {event.message or ''} {extra}".rstrip()
            )
        )
    lease = tree.lease(step)
    if lease is not None:
        print(
            f"\nlease: held by {lease.worker} on {lease.host} (pid {lease.pid}), last heartbeat {iso_age(utc_now_iso(lease.heartbeat))}"
        )
    files = tree.files(step)
    total = sum(size for _, size in files)
    print(f"\nfiles ({len(files)}, {human_size(total)}):")
    for rel, size in files[: args.files]:
        print(f"  {human_size(size):>9}  {one_line(rel)}")
    if len(files) > args.files:
        print(f"  ... {len(files) - args.files} more")
    tail = tree.log_tail(step, max_bytes=args.log_bytes)
    print("\nlog (tail):" if tail else "\nlog: (empty)")
    if tail:
        print(_indent(tail.rstrip()))
    return 0


def _dict(value: object) -> dict:
    """A recorded object, or {} when the (untrusted) tree holds something else there."""
    return value if isinstance(value, dict) else {}


def _strings(value: object) -> list[str]:
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def _find(tree: OutputTree, ref: str) -> StepOutput:
    try:
        return tree.find(ref)
    except RefError as error:
        raise CliError(str(error)) from error


# -- tree ----------------------------------------------------------------------
def cmd_tree(args: argparse.Namespace) -> int:
    tree = _tree(args)
    try:
        experiment = (
            tree.find_experiment(args.experiment) if args.experiment else (tree.experiments or [None])[0]
        )
    except RefError as error:
        raise CliError(str(error)) from error
    if experiment is None:
        raise CliError(f"no experiments under {tree.prefix}")
    pairs = tree.experiment_steps(experiment)
    git = experiment.git
    print(
        f"{experiment.id}  ran {experiment.created} ({iso_age(experiment.created)})  git {str(git.get('commit') or '?')[:8]}"
    )
    # Paths where the tree is now (a tree copied or moved keeps its manifests' old prefix).
    by_path = {
        experiment.output_path(entry, tree.prefix): (entry, output)
        for entry, output in pairs
        if isinstance(entry.get("output_path"), str)
    }
    depends = {
        path: [experiment.relocated(dep, tree.prefix) for dep in _strings(entry.get("dependencies"))]
        for path, (entry, _) in by_path.items()
    }
    children: dict[str, list[str]] = {path: [] for path in by_path}
    for path, deps in depends.items():
        for dep in deps:
            if dep in children:
                children[dep].append(path)
    roots = [path for path, deps in depends.items() if not [d for d in deps if d in by_path]]
    shown: set[str] = set()
    # Depth first with a stack, not recursion: a manifest (untrusted) may chain thousands of
    # steps, past Python's recursion limit. Children are pushed last first, so they are drawn
    # in order, each one's subtree before the next.
    # Below MAX_TREE_INDENT levels the indentation stops growing (a chain 1,000 steps deep
    # printed 1.5 MB, almost all of it spaces) and each line says its depth instead.
    stack: list[tuple[str, str, str, int]] = [(root, "", "", 0) for root in reversed(roots)]
    while stack:
        path, lead, branch, depth = stack.pop()
        _entry, output = by_path[path]
        status = output.status if output else "MISSING"
        duration = human_duration(output.duration_s) if output else ""
        rel = tree.relpath(path)
        deep = f"  (depth {depth})" if depth > MAX_TREE_INDENT else ""
        if path in shown:
            print(f"{lead}{branch}{rel}  (see above){deep}")
            continue
        shown.add(path)
        print(f"{lead}{branch}{rel}  [{status}] {duration}".rstrip() + deep)
        kids = children[path]
        extension = "   " if branch in ("", "└─ ") else "│  "
        kids_lead = lead + (extension if branch and depth < MAX_TREE_INDENT else "")
        for index in reversed(range(len(kids))):
            last = index == len(kids) - 1
            stack.append((kids[index], kids_lead, "└─ " if last else "├─ ", depth + 1))
    return 0


MAX_TREE_INDENT = 20
"""Levels of `marin tree` indentation; deeper steps are drawn at this one, with their depth."""


# -- why / diff -------------------------------------------------------------------
def cmd_why(args: argparse.Namespace) -> int:
    tree = _tree(args)
    step = _find(tree, args.ref)
    other = _find(tree, args.against) if args.against else previous_version(tree, step)
    if other is None:
        print(f"{step.relpath} is the only output of {step.name}: no other version to compare with")
        return 0
    print(f"why {step.name} is {step.short_hash} and not {other.short_hash}:")
    print("\n".join(explain(tree, other, step).lines("  ")))
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    tree = _tree(args)
    old, new = _find(tree, args.a), _find(tree, args.b)
    print("\n".join(explain(tree, old, new).lines()))
    return 0


# -- reproduce -------------------------------------------------------------------
def _prefix_of_output(path: str) -> str | None:
    """The prefix an output directory was written under, from its recorded step name."""
    path = path.rstrip("/")
    try:
        data = OutputTree(path).read_record(info_path(path))
        info = json.loads(data) if data else None
    except (TreeFileError, ValueError, RecursionError) as error:
        raise CliError(f"cannot read {info_path(path)}: {error}") from error
    if not isinstance(info, dict):
        return None
    name = info.get("name")
    return source_prefix(path, name if isinstance(name, str) else "") or path.rsplit("/", 1)[0]


MOVED_FLAGS = (
    "--prefix now names the tree to read, as in every marin command, and --into names the fresh "
    "prefix to rebuild into: `marin reproduce REF --into NEW [--prefix TREE]`"
)


REBUILD_FAILED = 3
"""`marin reproduce`'s exit status when a rebuilt step fails (0 equal, 1 different, 2 refused)."""


def cmd_reproduce(args: argparse.Namespace) -> int:
    if args.source is not None:
        raise CliError(f"--from was removed: {MOVED_FLAGS}")
    if args.into is None:
        raise CliError(f"say where to rebuild with --into NEW. {MOVED_FLAGS}")
    if not args.into.strip():  # (an empty path is the working directory: not a fresh prefix)
        raise CliError("--into is empty: give a fresh prefix to rebuild into")
    try:
        open_store(normalize_prefix(args.into))
    except StoreError as error:  # an unknown scheme, `s3://` with no bucket
        raise CliError(f"--into: {error}") from None
    source = args.prefix
    if source is None and ("://" in args.ref or args.ref.startswith("/") or os.path.isdir(args.ref)):
        source = _prefix_of_output(args.ref if "://" in args.ref else os.path.abspath(args.ref))
    tree = _tree(argparse.Namespace(prefix=source))
    try:
        report = reproduce(tree, args.ref, args.into, allow_code_changes=args.allow_code_changes)
    except (ReproduceError, TemplateError, RefError) as error:
        raise CliError(str(error)) from error
    except ExecutorRunError as error:  # the rebuild ran and a step failed: nothing to compare
        print(
            f"marin reproduce: the rebuild into {args.into} failed, so nothing was compared:", file=sys.stderr
        )
        for failure in error.failures:  # the traceback is in the step's log
            last = ([line for line in str(failure.error).splitlines() if line.strip()] or ["?"])[-1].strip()
            print(f"  - {failure.name}: {last} (log: {failure.log_path})", file=sys.stderr)
        return REBUILD_FAILED
    print(f"\nreproduced {len(report.steps)} step(s) into {report.new_prefix}:")
    for comparison in report.comparisons:
        verdict = "equal" if comparison.equal else "DIFFERENT"
        print(f"  {comparison.name}: {verdict} ({len(comparison.same)} identical file(s))")
        for label, files in (
            ("differs", comparison.different),
            ("only in the original", comparison.only_original),
            ("only in the reproduction", comparison.only_reproduced),
            ("differs (internal resume state, not counted)", comparison.internal_different),
        ):
            for name in files:
                print(f"      {label}: {name}")
        if comparison.run_records or comparison.fields_left_out:
            # Declared by the step function (executor.run_records), never by the tree.
            print(
                f"      not compared (records of the run, as {comparison.name}'s function declares): "
                f"{len(comparison.run_records)} file(s)"
                + (f"; fields {', '.join(comparison.fields_left_out)}" if comparison.fields_left_out else "")
            )
    print("result: outputs are identical" if report.equal else "result: outputs differ (files listed above)")
    return 0 if report.equal else 1


# -- gc --------------------------------------------------------------------------
def cmd_gc(args: argparse.Namespace) -> int:
    tree = _tree(args)
    kept: list = []
    garbage = find_garbage(tree, lease_timeout=args.lease_timeout, kept=kept)
    for step, why in kept:
        print(f"kept {step.relpath}: {why}, so it is not collected")
    if not garbage:
        print(f"nothing to collect under {tree.prefix}")
        return 0
    rows = [[human_size(item.size), item.step.relpath, item.reason] for item in garbage]
    print(_table(rows, ["SIZE", "OUTPUT", "WHY"]))
    total = sum(item.size for item in garbage)
    if not args.yes:
        print(f"\n{len(garbage)} output(s), {human_size(total)}; run again with --yes to delete them")
        return 0
    deleted = delete_garbage(tree, garbage, lease_timeout=args.lease_timeout)
    skipped = len(garbage) - len(deleted)
    print(
        f"\ndeleted {len(deleted)} output(s), {human_size(sum(i.size for i in deleted))}"
        + (f"; {skipped} started running and were kept" if skipped else "")
    )
    return 0


# -- browse ------------------------------------------------------------------------
def cmd_browse(args: argparse.Namespace) -> int:
    from marin.web import start_server

    tree = _tree(args)
    try:
        server = start_server(tree.prefix, host=args.host, port=args.port)
    except OSError as error:  # the port taken, a host that does not resolve or is not this machine's
        where = f"[{args.host}]:{args.port}" if ":" in args.host else f"{args.host}:{args.port}"
        reason = error.strerror or str(error) or type(error).__name__
        raise CliError(
            f"cannot listen on {where}: {reason} (another program on that port? pick another --port, "
            "or --port 0 for any free one)"
            if isinstance(error.errno, int) and error.errno == errno.EADDRINUSE
            else f"cannot listen on {where}: {reason}"
        ) from None
    print(f"browsing {tree.prefix} at {server.url} (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0


# -- leaderboard -----------------------------------------------------------------
def cmd_leaderboard(args: argparse.Namespace) -> int:
    tree = _tree(args)
    try:
        runs = training_runs(tree, args.pattern)
        groups = rank(runs, args.by)
    except ValueError as error:
        raise CliError(str(error)) from error
    wide = compared_fields_cut(runs)
    if wide:
        print(
            f"note: {len(wide)} run(s) record more than {MAX_COMPARED_FIELDS:,} config fields "
            f"({', '.join(run.step.relpath for run in wide[:3])}{', ...' if len(wide) > 3 else ''}): "
            f"DIFFERS compares the first {MAX_COMPARED_FIELDS:,} of each, by name",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(as_json(groups, args.by), indent=2))
        return 0
    if not groups:
        where = f" matching {args.pattern!r}" if args.pattern else ""
        print(f"no finished training runs{where} under {tree.prefix}")
        return 0
    print(f"ranked by final eval/{args.by} (lower is better), among runs trained on the same tokens")
    # (The quickstart's summary and an eval step print the exact bpb: a user comparing saw two.)
    print(
        "LOSS, BPB: the trainer's last eval/loss and eval/bpb (Levanter's per-batch bpb); an eval "
        "step's results.json has bpb as total bits over total bytes, which can differ"
    )
    for group in groups:
        tokens = f"{group.tokens:,} tokens" if group.tokens is not None else "tokens not recorded"
        print(f"\n{tokens} ({len(group.ranked)} run{'s' if len(group.ranked) != 1 else ''})")
        rows = [
            [
                str(index) if run.score(args.by) is not None else "-",
                _fixed(run.eval_loss),
                _fixed(run.eval_bpb),
                f"{run.parameters:,}" if run.parameters is not None else "-",
                f"{run.tokens_per_second:,.0f}" if run.tokens_per_second is not None else "-",
                f"{run.mfu:.1%}" if run.mfu is not None else "-",
                run.step.relpath,
                describe_differences(group.differences.get(run.step.path, {})),
            ]
            for index, run in enumerate(group.ranked, start=1)
        ]
        print(_table(rows, ["RANK", "LOSS", "BPB", "PARAMS", "TOKENS/S", "MFU", "RUN", "DIFFERS"]))
    return 0


# -- predictions ---------------------------------------------------------------
def cmd_predictions(args: argparse.Namespace) -> int:
    tree = _tree(args)
    try:
        found = predictions(tree, args.pattern)
    except ValueError as error:
        raise CliError(str(error)) from error
    if args.json:
        print(json.dumps([prediction.as_json() for prediction in found], indent=2))
        return 0
    if not found:
        where = f" matching {args.pattern!r}" if args.pattern else ""
        print(f"no predictions{where} under {tree.prefix}")
        return 0
    rows = [
        [
            p.step.relpath,
            p.label,
            _fixed(p.predicted_loss),
            f"[{p.interval[0]:.4f}, {p.interval[1]:.4f}]" if p.interval else "-",
            _fixed(p.actual_loss),
            f"{p.relative_error:+.2%}" if p.relative_error is not None else "-",
            p.verdict,
            {True: "yes", False: "NO", None: "-"}[p.preregistered],
        ]
        for p in found
    ]
    header = ["PREDICTION", "TARGET", "PREDICTED", "INTERVAL", "ACTUAL", "ERROR", "VERDICT", "PRE-REGISTERED"]
    print(_table(rows, header))
    return 0


def _fixed(value: float | None) -> str:
    return f"{value:.4f}" if value is not None else "-"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="marin", description=__doc__.split("\n\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--prefix", help="the output tree (default: $MARIN_PREFIX, else ./marin-output; never empty)"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ls = commands.add_parser(
        "ls", parents=[common], help="experiments and steps with status, age, duration, size"
    )
    ls.add_argument(
        "--status",
        type=str.upper,
        choices=[*(status.value for status in Status), "UNKNOWN"],
        help="only steps with this status (any case)",
    )
    ls.add_argument("--name", help="only steps whose path contains this text")
    ls.add_argument("--steps-only", action="store_true", help="leave out the experiments")
    ls.add_argument("--no-size", action="store_true", help="skip computing sizes (faster on object stores)")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(fn=cmd_ls)

    show = commands.add_parser("show", parents=[common], help="one step: info, config, history, log, files")
    show.add_argument("ref", help="step name (its most recent output), hash prefix, or path")
    show.add_argument("--files", type=int, default=30, help="how many files to list (default 30)")
    show.add_argument("--log-bytes", type=int, default=4000, help="how much of the log's end to show")
    show.add_argument("--json", action="store_true")
    show.set_defaults(fn=cmd_show)

    tree = commands.add_parser("tree", parents=[common], help="an experiment's DAG with statuses")
    tree.add_argument("experiment", nargs="?", help="experiment id or script name (default: the most recent)")
    tree.set_defaults(fn=cmd_tree)

    why = commands.add_parser(
        "why", parents=[common], help="why a step's hash differs from its previous version"
    )
    why.add_argument("ref", help="the step (name, hash or path)")
    why.add_argument("--against", help="compare with this output instead of the most recent other version")
    why.set_defaults(fn=cmd_why)

    diff = commands.add_parser("diff", parents=[common], help="what differs between two outputs' versions")
    diff.add_argument("a")
    diff.add_argument("b")
    diff.set_defaults(fn=cmd_diff)

    repro = commands.add_parser(
        "reproduce",
        parents=[common],
        help="rebuild a step and its upstream into a fresh prefix and compare the outputs",
    )
    repro.add_argument("ref", help="the step (name, hash, or its output path)")
    repro.add_argument(
        "--into", metavar="NEW", help="the fresh prefix to rebuild into (required; must not overlap the tree)"
    )
    repro.add_argument("--from", dest="source", help=argparse.SUPPRESS)
    repro.add_argument(
        "--allow-code-changes",
        action="store_true",
        help="go on when the code is not at the recorded git commit",
    )
    repro.set_defaults(fn=cmd_reproduce)

    gc = commands.add_parser("gc", parents=[common], help="unreferenced, failed and abandoned outputs")
    gc.add_argument("--yes", action="store_true", help="delete them (default: only list)")
    gc.add_argument(
        "--lease-timeout",
        type=float,
        default=None,
        help="seconds after which a lease counts as dead (default 60)",
    )
    gc.set_defaults(fn=cmd_gc)

    board = commands.add_parser(
        "leaderboard", parents=[common], help="training runs ranked on equal tokens by final eval loss"
    )
    board.add_argument(
        "pattern", nargs="?", help="an experiment (id or script name), else a regex over step names"
    )
    board.add_argument("--by", choices=METRICS, default="loss", help="final eval/loss (default) or eval/bpb")
    board.add_argument("--json", action="store_true", help="machine-readable output")
    board.set_defaults(fn=cmd_leaderboard)

    predicted = commands.add_parser(
        "predictions", parents=[common], help="pre-registered loss predictions and their outcomes"
    )
    predicted.add_argument("pattern", nargs="?", help="a regex over the prediction steps' names")
    predicted.add_argument("--json", action="store_true", help="machine-readable output")
    predicted.set_defaults(fn=cmd_predictions)

    browse = commands.add_parser("browse", parents=[common], help="start the web browser and print its URL")
    browse.add_argument("--port", type=_port, default=8765, help="port (0: any free one)")
    browse.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    browse.set_defaults(fn=cmd_browse)
    return parser


def _port(text: str) -> int:
    """A TCP port, 0-65535 (argparse names the flag when this raises)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535 (0: any free one), got {port}")
    return port


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Everything printed from here on may quote the (untrusted) tree: no control character
    # reaches the terminal as such (see marin.terminal).
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(sys.stdout), SafeStream(sys.stderr)
    try:
        return args.fn(args)
    except CliError as error:
        print(f"marin {args.command}: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    finally:
        sys.stdout, sys.stderr = saved


if __name__ == "__main__":
    sys.exit(main())
