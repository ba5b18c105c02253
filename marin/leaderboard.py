"""Training runs ranked fairly: on equal tokens, by final eval loss or bits per byte.

    marin leaderboard                    every finished training run under the prefix
    marin leaderboard lr_sweep           the runs of one experiment (its id or script name)
    marin leaderboard 'checkpoints/lr-'  runs whose step name matches (re.search)
    marin leaderboard --by bpb --json

A training run is a step output made by one of `TRAINING_FUNCTIONS` that finished
(SUCCESS) and wrote `stats.json`. Runs are grouped by the tokens they trained on (the
last `throughput/total_tokens` Levanter logged, else batch x steps x sequence length
from the recorded config) and ranked within each group: comparing a run of 10M tokens
with one of 100M says nothing about their recipes. Each row names what differs from the
other runs of its group, read from the recorded versions (what was hashed): the
hyperparameters, the model shape, the data.

Everything is read from the tree, which is untrusted: JSON only, bounded reads (the
metrics are read from their last `METRICS_TAIL_BYTES`), numbers type-checked.
"""

from __future__ import annotations

import heapq
import json
import re
from dataclasses import dataclass, field
from typing import Any

from executor.diffing import flatten
from executor.plan import compile_regex
from marin.outputs import OutputTree, RefError, StepOutput, TreeFileError, finite_number

TRAINING_FUNCTIONS = frozenset(
    {
        "operations.train:train",
        "operations.hub:train_with_hub_tokenizer",
        "operations.scaling_laws:train_preregistered",
    }
)
"""`fn_name`s of the step functions whose outputs are training runs."""

METRICS = ("loss", "bpb")
"""What runs can be ranked by: the final `eval/loss`, or the final `eval/bpb`."""

METRICS_TAIL_BYTES = 256 << 10
"""How much of the end of `metrics.jsonl` is read for the last eval and throughput lines."""

STATS_FILE = "stats.json"
METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class Run:
    """One finished training run, as its output records it."""

    step: StepOutput
    tokens: int | None
    """Tokens trained on (None: not recorded)."""

    eval_loss: float | None
    eval_bpb: float | None
    parameters: int | None
    tokens_per_second: float | None
    """Median training throughput (stats.json)."""

    mfu: float | None
    """Model FLOPs utilisation Levanter logged, when it knows the device's peak (not on CPU)."""

    version_config: dict[str, Any] = field(default_factory=dict)
    """The recorded version's config, flattened, with `DEP[i]` replaced by the input's path."""

    def score(self, by: str) -> float | None:
        return self.eval_loss if by == "loss" else self.eval_bpb


@dataclass(frozen=True)
class Group:
    """Runs that trained on the same number of tokens, best first."""

    tokens: int | None
    ranked: list[Run]
    differences: dict[str, dict[str, Any]]
    """{run output path: {field: value}} for the fields whose values differ within the group."""


def training_runs(tree: OutputTree, pattern: str | None = None) -> list[Run]:
    """The finished training runs under the prefix: of the experiment `pattern` names (id or
    script name), else those whose step name matches `pattern` (re.search), else all."""
    steps = _select(tree, pattern)
    return [run for run in (_load_run(tree, step) for step in steps) if run is not None]


def rank(runs: list[Run], by: str = "loss") -> list[Group]:
    """Groups of equal tokens (most tokens first), each ranked by `by` (lower is better; runs
    without that metric last)."""
    if by not in METRICS:
        raise ValueError(f"rank by one of {', '.join(METRICS)}, got {by!r}")
    groups: dict[int | None, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.tokens, []).append(run)
    out = []
    for tokens in sorted(groups, key=lambda t: (t is None, -(t or 0))):
        members = sorted(
            groups[tokens], key=lambda r: (r.score(by) is None, r.score(by) or 0.0, r.step.relpath)
        )
        out.append(Group(tokens, members, _differences(members)))
    return out


def as_json(groups: list[Group], by: str) -> dict[str, Any]:
    return {
        "ranked_by": f"eval/{by}",
        "groups": [
            {
                "tokens": group.tokens,
                "runs": [
                    {
                        "rank": index if run.score(by) is not None else None,
                        "name": run.step.name,
                        "path": run.step.path,
                        "eval_loss": run.eval_loss,
                        "eval_bpb": run.eval_bpb,
                        "parameters": run.parameters,
                        "tokens_per_second": run.tokens_per_second,
                        "mfu": run.mfu,
                        "differs": group.differences.get(run.step.path, {}),
                    }
                    for index, run in enumerate(group.ranked, start=1)
                ],
            }
            for group in groups
        ],
    }


def describe_differences(differs: dict[str, Any], limit: int = 80) -> str:
    text = ", ".join(f"{key}={_short(value)}" for key, value in sorted(differs.items()))
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- reading ---------------------------------------------------------------------------------------


def _select(tree: OutputTree, pattern: str | None) -> list[StepOutput]:
    """An experiment's steps (id, id prefix or script name: `OutputTree.find_experiment`), else
    the steps whose name `pattern` finds (re.search)."""
    if not pattern:
        return tree.steps
    try:
        experiment = tree.find_experiment(pattern)
    except RefError:
        experiment = None
    if experiment is not None:
        return [step for _entry, step in tree.experiment_steps(experiment) if step is not None]
    regex = name_regex(pattern, "neither an experiment nor a valid name pattern")
    return [step for step in tree.steps if regex.search(step.name)]


def name_regex(pattern: str, refusal: str) -> re.Pattern:
    """`pattern` compiled; ValueError `'<pattern>' is <refusal>: <why>` if it is not a regex
    (or nests groups thousands deep; see `executor.plan.compile_regex`)."""
    try:
        return compile_regex(pattern)
    except ValueError as why:
        raise ValueError(f"{pattern[:200]!r} is {refusal}: {why}") from None


def _load_run(tree: OutputTree, step: StepOutput) -> Run | None:
    info = step.info or {}
    fn_name = info.get("fn_name")  # untrusted: a dict or a list there is unhashable
    if not isinstance(fn_name, str) or fn_name not in TRAINING_FUNCTIONS or step.status != "SUCCESS":
        return None
    try:
        stats = _json_object(tree.read_record(f"{step.path}/{STATS_FILE}", limit=1 << 20))
    except TreeFileError:
        return None
    if stats is None:
        return None
    last = _last_metrics(tree.file_tail(f"{step.path}/{METRICS_FILE}", METRICS_TAIL_BYTES) or "")
    version = info.get("version") if isinstance(info.get("version"), dict) else {}
    config = flatten(version.get("config")) if isinstance(version.get("config"), dict) else {}
    return Run(
        step=step,
        tokens=_int(last.get("throughput/total_tokens")) or _tokens_from_config(info.get("config")),
        eval_loss=finite_number(stats.get("final_eval_loss")),
        eval_bpb=finite_number(last.get("eval/bpb")),
        parameters=_int(stats.get("parameter_count")),
        tokens_per_second=finite_number(stats.get("median_tokens_per_second")),
        mfu=finite_number(last.get("throughput/mfu")),
        version_config=_name_inputs(config, step, tree),
    )


def _last_metrics(tail: str) -> dict[str, Any]:
    """The last value of each key over the metrics lines in `tail` (malformed lines skipped)."""
    last: dict[str, Any] = {}
    for line in tail.splitlines():
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict):
            last.update(record)
    return last


def _tokens_from_config(config: Any) -> int | None:
    if not isinstance(config, dict):
        return None
    train = config.get("train") if isinstance(config.get("train"), dict) else {}
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    batch, steps = _int(train.get("train_batch_size")), _int(train.get("num_train_steps"))
    seq_len = _int(train.get("seq_len")) or _int(model.get("seq_len"))
    return batch * steps * seq_len if batch and steps and seq_len else None


def _name_inputs(config: dict[str, Any], step: StepOutput, tree: OutputTree) -> dict[str, Any]:
    """`DEP[i]` values as the inputs' paths relative to the prefix (what differs is then readable)."""
    names = [tree.relpath(str(dep.get("output_path") or "")) for dep in step.dependencies]

    def named(value: Any) -> Any:
        if isinstance(value, str):
            # At most 9 ASCII digits: int() refuses thousands of digits (ValueError).
            match = re.fullmatch(r"DEP\[([0-9]{1,9})\](/.*)?", value)
            if match and int(match.group(1)) < len(names):
                return names[int(match.group(1))] + (match.group(2) or "")
        return value

    return {key: named(value) for key, value in config.items()}


MAX_COMPARED_FIELDS = 1000
"""Recorded config fields per run compared to say what differs (the first by name): ten runs of
100,000 differing fields took `marin leaderboard` 8 s of CPU (a crafted tree; real configs
hold tens). `compared_fields_cut` says which runs had more."""


def compared_fields(run: Run) -> dict[str, Any]:
    """The run's recorded config fields that `rank` compares: at most `MAX_COMPARED_FIELDS`."""
    if len(run.version_config) <= MAX_COMPARED_FIELDS:
        return run.version_config
    return dict(heapq.nsmallest(MAX_COMPARED_FIELDS, run.version_config.items(), key=lambda item: item[0]))


def compared_fields_cut(runs: list[Run]) -> list[Run]:
    """The runs with more recorded config fields than are compared."""
    return [run for run in runs if len(run.version_config) > MAX_COMPARED_FIELDS]


def _differences(runs: list[Run]) -> dict[str, dict[str, Any]]:
    if len(runs) < 2:
        return {}
    configs = {run.step.path: compared_fields(run) for run in runs}
    keys = set().union(*configs.values())
    missing = object()
    differing = {
        key
        for key in keys
        if len(
            {json.dumps(config.get(key, missing), sort_keys=True, default=str) for config in configs.values()}
        )
        > 1
    }
    return {path: {key: config.get(key) for key in sorted(differing)} for path, config in configs.items()}


def _json_object(data: bytes | None) -> dict[str, Any] | None:
    if data is None:
        return None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _int(value: Any) -> int | None:
    number = finite_number(value)
    return int(number) if number is not None and number == int(number) and number >= 0 else None


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 40 else text[:37] + "..."
