"""Scaling-law studies as steps: an isoflop grid, its fit, a pre-registered prediction, the report.

    grid = isoflop_grid("stdlib", tokenized, budgets=[1e11, 3e11, 1e12], models=shapes, vocab_size=4096)
    fit = default_scaling_fit("stdlib", grid)
    target = grid.target("stdlib-1e13", shapes["d96l3"], budget=1e13)
    prediction = default_prediction("stdlib-1e13", fit, target)
    trained = default_preregistered_train("stdlib-1e13", grid, target, prediction)
    report = default_prediction_report("stdlib-1e13", prediction, trained)
    executor_main(steps=[*grid.steps, fit, prediction, trained, report])

- `checkpoints/isoflop/<name>/<budget>-<model>`: one training step per grid cell (`default_train`,
  so they share the tokenized data and are cached like any step).
- `analysis/scaling/<name>`: the fit (fit.json, bootstrap.json, isoflops.png, frontier.png).
- `predictions/<name>`: prediction.json, written once, before the target starts.
- `checkpoints/<name>`: the target run; it takes the prediction as an input, so it waits for it,
  its hash covers the prediction step's, and it records the prediction's digest when it starts.
- `analysis/prediction/<name>`: predicted vs actual, inside the interval or not.

The arithmetic (FLOPs, the grid, the fits) and the step functions are in
`operations.scaling_laws`; its docstring states the formulas and the rules. docs/scaling.md
is the guide.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from executor import ExecutorStep, InputName, this_output_path, versioned
from marin.defaults import default_train
from marin.models import SimpleTrainConfig
from operations.scaling_laws import (
    GridCell,
    IsoflopPlan,
    LearningRateRule,
    PredictionConfig,
    PredictionReportConfig,
    PreregisteredTrainConfig,
    ScalingFitConfig,
    ScalingRun,
    fit_scaling_law,
    plan_cell,
    plan_isoflop_grid,
    report_prediction,
    train_preregistered,
    write_prediction,
)
from operations.train import LlamaSpec, TrainConfig, train

__all__ = [
    "IsoflopGrid",
    "LearningRateRule",
    "default_prediction",
    "default_prediction_report",
    "default_preregistered_train",
    "default_scaling_fit",
    "isoflop_grid",
]


DEFAULT_LEARNING_RATE = LearningRateRule()
"""3e-3 at width 64, falling as 1/width."""


@dataclass(frozen=True)
class TrainingRules:
    """How every run of a grid (and its target) trains, besides its model and steps."""

    vocab_size: int
    batch_size: int
    seq_len: int | None
    learning_rate: LearningRateRule | Callable[[Any], float]
    warmup: float
    min_lr_ratio: float
    weight_decay: float
    max_eval_batches: int
    seed: int
    tracker: str
    resources: Any


@dataclass(frozen=True)
class IsoflopGrid:
    """The training steps of an isoflop grid, the cells they train, and how to add a target."""

    name: str
    tokenized: ExecutorStep | InputName
    plan: IsoflopPlan
    steps: tuple[ExecutorStep, ...]
    """One training step per cell of `plan.cells`, in the same order."""

    rules: TrainingRules

    @property
    def cells(self) -> tuple[GridCell, ...]:
        return self.plan.cells

    def target(self, label: str, model: LlamaSpec, budget: float, model_name: str | None = None) -> GridCell:
        """The run of `model` for `budget` FLOPs under this grid's rules (batch, sequence length,
        learning-rate rule, schedule): what a prediction is made for."""
        return plan_cell(
            label,
            model_name or label,
            model,
            budget,
            vocab_size=self.rules.vocab_size,
            batch_size=self.rules.batch_size,
            seq_len=self.rules.seq_len,
            learning_rate=self.rules.learning_rate,
        )

    def train_step(self, name: str, cell: GridCell, tags: Sequence[str] = ()) -> ExecutorStep:
        """`checkpoints/<name>`: train `cell` with this grid's rules (`default_train`)."""
        rules = self.rules
        settings = SimpleTrainConfig(
            train_batch_size=cell.batch_size,
            num_train_steps=cell.steps,
            learning_rate=cell.learning_rate,
            warmup=rules.warmup,
            min_lr_ratio=rules.min_lr_ratio,
            weight_decay=rules.weight_decay,
            train_seq_len=rules.seq_len,
            steps_per_eval=cell.steps,  # the loss the fit reads is the final evaluation
            max_eval_batches=rules.max_eval_batches,
            steps_per_checkpoint=cell.steps,
            seed=rules.seed,
            resources=rules.resources,
        )
        return default_train(name, self.tokenized, cell.model, settings, tags=tags, tracker=rules.tracker)


def isoflop_grid(
    name: str,
    tokenized: ExecutorStep | InputName,
    budgets: Sequence[float],
    models: Mapping[str, LlamaSpec],
    *,
    vocab_size: int,
    batch_size: int = 8,
    seq_len: int | None = None,
    learning_rate: LearningRateRule | Callable[[Any], float] = DEFAULT_LEARNING_RATE,
    warmup: float = 0.1,
    min_lr_ratio: float = 0.1,
    weight_decay: float = 0.1,
    min_steps: int = 20,
    max_tokens: int | None = None,
    sizes_per_budget: int | None = None,
    tokens_per_parameter: float = 20.0,
    max_eval_batches: int = 16,
    seed: int = 0,
    tracker: str = "none",
    resources: Any = None,
) -> IsoflopGrid:
    """Training steps for every (budget, model) of an isoflop grid on one tokenized dataset.

    `models` maps short names (step-name parts such as `d64l2`) to shapes. `vocab_size` must be
    the tokenizer's (the FLOPs of the output head depend on it; the fit checks it against what
    the runs record). Tokens per run: budget / FLOPs per token, in whole steps of `batch_size`
    sequences of `seq_len` (None: each model's) tokens; cells under `min_steps` steps or over
    `max_tokens` are left out (`grid.plan.skipped` says which and why); `sizes_per_budget` keeps
    that many sizes per budget around `tokens_per_parameter` (see
    `operations.scaling_laws.plan_isoflop_grid`). Every run: the peak learning rate from
    `learning_rate` (a `LearningRateRule`: base x (base_width / width)^exponent), `warmup` as a
    fraction of the run, cosine decay to `min_lr_ratio` at its end, one evaluation at the end on
    `max_eval_batches` validation batches (the loss the fit reads; the same batches for all), W&B
    off (`tracker`), `resources` as in `SimpleTrainConfig`.
    """
    plan = plan_isoflop_grid(
        budgets,
        models,
        vocab_size=vocab_size,
        batch_size=batch_size,
        seq_len=seq_len,
        learning_rate=learning_rate,
        min_steps=min_steps,
        max_tokens=max_tokens,
        sizes_per_budget=sizes_per_budget,
        tokens_per_parameter=tokens_per_parameter,
    )
    rules = TrainingRules(
        vocab_size=vocab_size,
        batch_size=batch_size,
        seq_len=seq_len,
        learning_rate=learning_rate,
        warmup=warmup,
        min_lr_ratio=min_lr_ratio,
        weight_decay=weight_decay,
        max_eval_batches=max_eval_batches,
        seed=seed,
        tracker=tracker,
        resources=resources,
    )
    grid = IsoflopGrid(name, tokenized, plan, (), rules)
    steps = tuple(
        grid.train_step(f"isoflop/{name}/{cell.label}", cell, tags=("isoflop", name)) for cell in plan.cells
    )
    return dataclasses.replace(grid, steps=steps)


def default_scaling_fit(
    name: str,
    grid: IsoflopGrid,
    *,
    parameters: str = "compute",
    bootstrap_samples: int = 1000,
    seed: int = 0,
    confidence: float = 0.9,
) -> ExecutorStep:
    """`analysis/scaling/<name>`: parabolas per budget, power laws through their minima, a
    bootstrap over runs (see `operations.scaling_laws.fit_scaling_law`)."""
    runs = tuple(
        ScalingRun(cell=versioned(cell), path=step) for cell, step in zip(grid.cells, grid.steps, strict=True)
    )
    return ExecutorStep(
        name=f"analysis/scaling/{name}",
        fn=fit_scaling_law,
        config=ScalingFitConfig(
            runs=runs,
            output_path=this_output_path(),
            parameters=versioned(parameters),
            loss_key=versioned("final_eval_loss"),
            bootstrap_samples=versioned(bootstrap_samples),
            seed=versioned(seed),
            confidence=versioned(confidence),
        ),
        description=f"Scaling-law fit of {len(runs)} isoflop runs ({name})",
    )


def default_prediction(
    name: str, fit: ExecutorStep, target: GridCell, *, confidence: float = 0.9
) -> ExecutorStep:
    """`predictions/<name>`: the predicted final loss of `target` (from `IsoflopGrid.target`) with
    its bootstrap interval, written once, with the hashes of the fit and its runs."""
    return ExecutorStep(
        name=f"predictions/{name}",
        fn=write_prediction,
        config=PredictionConfig(
            fit_path=fit,
            target=versioned(target),
            output_path=this_output_path(),
            confidence=versioned(confidence),
        ),
        description=f"Pre-registered loss of {target.label} ({target.flops:.3g} FLOPs)",
    )


def default_preregistered_train(
    name: str, grid: IsoflopGrid, target: GridCell, prediction: ExecutorStep
) -> ExecutorStep:
    """`checkpoints/<name>`: train `target` with the grid's rules, after `prediction` and bound to
    it: the prediction is a blocking input (the step waits for it; its version is part of this
    one's), and the run refuses to start unless prediction.json is intact and names this run."""
    step = grid.train_step(name, target, tags=("preregistered",))
    if step.fn is not train:
        raise ValueError(
            f"default_preregistered_train({name!r}): the target trains with {step.fn.__qualname__}; "
            "pre-registered targets need a tokenizer directory or step (not a Hub id)"
        )
    fields = {field.name: getattr(step.config, field.name) for field in dataclasses.fields(TrainConfig)}
    return dataclasses.replace(
        step,
        fn=train_preregistered,
        config=PreregisteredTrainConfig(**fields, prediction_path=prediction),
        description=f"{step.description} (the target of {prediction.name})",
    )


def default_prediction_report(name: str, prediction: ExecutorStep, trained: ExecutorStep) -> ExecutorStep:
    """`analysis/prediction/<name>`: the target's final loss against its prediction (report.json,
    prediction.png, summary.md), with the pre-registration checked."""
    return ExecutorStep(
        name=f"analysis/prediction/{name}",
        fn=report_prediction,
        config=PredictionReportConfig(
            prediction_path=prediction,
            target_path=trained,
            fit_path=prediction.config.fit_path,
            output_path=this_output_path(),
        ),
        description=f"Prediction vs outcome of {trained.name}",
    )
