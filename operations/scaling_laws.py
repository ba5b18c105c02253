"""Scaling laws: isoflop grids, the fit, a pre-registered prediction and its report.

The recipe (Chinchilla's "approach 2", isoflop profiles): train a family of model sizes at a few FLOP budgets, find the loss-minimising size at each
budget, fit power laws through those minima, and extrapolate to a bigger budget -- writing the
prediction down *before* the big run starts. This module holds the arithmetic (pure numpy, fast
to test) and the step functions; `marin.scaling` builds the steps.

FLOPs. Training FLOPs per token are Levanter's count (`LlamaConfig.flops_per_token` x 3 for the
forward and backward passes), written out here so it can be read and tested:

    C / D = 6 N + 3 L (4 s d + 3 s h)

- N, the *compute parameters*: every weight that multiplies an activation -- the q/k/v/o
  projections and the three SwiGLU matrices of each block, and the output head (d x V). The
  input embedding (a lookup) and the RMSNorm gains (element-wise) cost no matrix FLOPs and are
  left out. With this N, C = 6 N D holds exactly apart from attention.
- attention: per layer and token, 2 s d for the query-key logits and 2 s d for the weighted sum
  of values over the full s x s map (Megatron's convention, as Levanter counts it: no halving for
  the causal mask), plus 3 s h for the softmax and mask; times 3 for forward + backward. s is the
  training sequence length, d the width, h the heads, L the layers.

Which N the law is stated in. The fit uses the compute parameters by default
(`parameters="compute"`), so that N and D multiply to the budget; "non_embedding" (Kaplan's
choice: blocks and norms, no head) and "total" (every parameter, the input embedding included)
are there for comparison. At these tiny widths the choice matters: the output head is 76% of
llama_nano's compute parameters at a 4,096-token vocabulary.

The grid (`plan_isoflop_grid`). For each budget C and each model shape, tokens D = C / (C/D),
rounded to whole optimizer steps of `batch_size x seq_len` tokens (so a run's actual FLOPs differ
from its budget by at most half a step's; both are recorded). Cells with fewer than `min_steps`
steps (the warm-up and decay would be most of the run) or more tokens than the data holds are
left out, and said so. Learning rate and batch are stated rules, the same for every run:
the batch is fixed (sequences per step); the peak learning rate falls with width,
`lr = base x (base_width / width) ** width_exponent` (1: the 1/width rule of muP for Adam);
warm-up is a fixed fraction of each run and the cosine schedule decays to its end, so every
run is fully annealed at its own length (a run cut from a longer schedule would look worse).

The fit (`fit_isoflops`). Per budget: a parabola of loss against ln N by least squares; its
vertex is the compute-optimal size N*(C) and loss L*(C), D*(C) follows from the runs' ln D
against ln N (a line: D = C / (C/D) is smooth in N). A budget whose parabola opens downwards
or whose vertex lies outside the sizes it ran is reported and left out (the minimum is not
bracketed: add sizes). Through the budgets' minima, three power laws by least squares in
log-log space: N*(C) = k_N C^a, D*(C) = k_D C^b, L*(C) = k_L C^-g (no irreducible term: with
three budgets it cannot be identified; at real scale add one). The loss of a run of size N at
budget C is then predicted as L*(C) + k (ln N - ln N*(C))^2, k the mean curvature of the
budgets' parabolas: the target need not be the compute-optimal size.

Uncertainty (`bootstrap_isoflops`). Runs are resampled with replacement within each budget and
everything is refitted; a resampled budget with fewer than three distinct sizes (or no
bracketed minimum) drops out of that replicate, a replicate with fewer than two budgets is
rejected, and the number used is recorded. Intervals are percentiles of the replicates. They
cover the fit's sensitivity to its runs -- not the target run's own seed noise, nor a wrong
functional form (the extrapolation's real risk). With three sizes per budget a resample has
three distinct sizes only 2 times in 9, so use four or more.

Files. The fit step writes `fit.json` (runs, per-budget parabolas and minima, power laws,
bootstrap intervals, the version hash of every run), `bootstrap.json` (each replicate's laws),
`isoflops.png`, `frontier.png` and `summary.md`. The prediction step writes `prediction.json`
once (see `write_prediction`) and `summary.md`; the target's training step writes
`preregistration.json` before it trains; the report step writes `report.json`,
`prediction.png` and `summary.md`.

Trees are untrusted input: every file read here is JSON, bounded in size, and type-checked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import io
import json
import logging
import math
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np

from operations import run_records
from operations.shards import atomic_output, is_local, join
from operations.train import LlamaSpec, TrainConfig, train

logger = logging.getLogger(__name__)

PARAMETER_KINDS = ("compute", "non_embedding", "total")
"""What N may count: see the module docstring."""

FIT_FILE = "fit.json"
BOOTSTRAP_FILE = "bootstrap.json"
PREDICTION_FILE = "prediction.json"
PREREGISTRATION_FILE = "preregistration.json"
REPORT_FILE = "report.json"
SUMMARY_FILE = "summary.md"
INFO_FILE = ".executor_info"
STATUS_FILE = ".executor_status"

PREDICTION_KIND = "marin.scaling.prediction"
REPORT_KIND = "marin.scaling.report"
FIT_KIND = "marin.scaling.fit"

MAX_JSON_BYTES = 16 << 20
"""The largest JSON file read from a tree (bootstrap.json of 10,000 replicates is ~2 MB)."""


# ---------------------------------------------------------------------------- counting


def head_dim(model: Any) -> int:
    """Width of one attention head (`hidden_dim // num_heads`, as LlamaSpec and Levanter take it)."""
    return model.hidden_dim // model.num_heads


def block_matmul_parameters(model: Any) -> int:
    """Weights of one transformer block that multiply activations: q, k, v, o and SwiGLU's three."""
    d, kv = model.hidden_dim, model.num_kv_heads * head_dim(model)
    attention = d * model.num_heads * head_dim(model) + 2 * d * kv + d * d
    return attention + 3 * d * model.intermediate_dim


def parameter_counts(model: Any, vocab_size: int) -> dict[str, int]:
    """N three ways (see the module docstring): compute, non_embedding and total parameters."""
    d, layers = model.hidden_dim, model.num_layers
    blocks = layers * block_matmul_parameters(model)
    norms = layers * 2 * d + d  # two RMSNorm gains per block, one at the end
    tied = getattr(model, "tie_word_embeddings", False)
    return {
        "compute": blocks + d * vocab_size,
        "non_embedding": blocks + norms,
        "total": blocks + norms + vocab_size * d * (1 if tied else 2),
    }


def attention_flops_per_token(model: Any, seq_len: int | None = None) -> float:
    """Training FLOPs per token of the attention scores and mixing: 3 L (4 s d + 3 s h)."""
    s = seq_len or model.seq_len
    per_layer = 4 * s * model.num_heads * head_dim(model) + 3 * s * model.num_heads
    return 3.0 * model.num_layers * per_layer


def flops_per_token(model: Any, vocab_size: int, seq_len: int | None = None) -> float:
    """Training FLOPs per token: 6 N (compute parameters) + attention. Levanter's count x 3."""
    return 6.0 * parameter_counts(model, vocab_size)["compute"] + attention_flops_per_token(model, seq_len)


# ---------------------------------------------------------------------------- the grid


@dataclass(frozen=True)
class LearningRateRule:
    """The peak learning rate of a run from its width: `base * (base_width / width) ** width_exponent`."""

    base: float = 3e-3
    """The learning rate at `base_width` (llama_nano trains well at 3e-3)."""

    base_width: int = 64
    """The width `base` is for."""

    width_exponent: float = 1.0
    """1: the rate falls as 1/width (muP's rule for Adam's hidden weights); 0: one rate for all."""

    def __call__(self, model: Any) -> float:
        return float(self.base * (self.base_width / model.hidden_dim) ** self.width_exponent)

    def describe(self) -> str:
        if self.width_exponent == 0:
            return f"learning rate {self.base:g} for every width"
        power = "" if self.width_exponent == 1 else f"^{self.width_exponent:g}"
        return f"learning rate {self.base:g} x ({self.base_width} / width){power}"


@dataclass(frozen=True)
class GridCell:
    """One training run of a grid (or the target): a model shape trained for a FLOP budget."""

    label: str
    """`<budget>-<model name>`, e.g. `3e11-d64l2`; also the last part of its step name."""

    model_name: str
    model: LlamaSpec
    budget: float
    """The FLOPs asked for."""

    vocab_size: int
    batch_size: int
    """Sequences per optimizer step."""

    seq_len: int
    steps: int
    learning_rate: float

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_size * self.seq_len

    @property
    def flops_per_token(self) -> float:
        return flops_per_token(self.model, self.vocab_size, self.seq_len)

    @property
    def flops(self) -> float:
        """The FLOPs the run actually trains for (whole steps)."""
        return self.tokens * self.flops_per_token

    @property
    def parameters(self) -> dict[str, int]:
        return parameter_counts(self.model, self.vocab_size)

    def describe(self) -> dict[str, Any]:
        """The cell as plain JSON values (what prediction.json records of its target)."""
        return {
            "label": self.label,
            "model_name": self.model_name,
            "model": dataclasses.asdict(self.model),
            "budget": self.budget,
            "flops": self.flops,
            "tokens": self.tokens,
            "steps": self.steps,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "vocab_size": self.vocab_size,
            "learning_rate": self.learning_rate,
            "flops_per_token": self.flops_per_token,
            "parameters": self.parameters,
        }


def budget_label(budget: float) -> str:
    """A FLOP budget as a step-name part: 3e11, 1.5e12 (no '+', which names may not hold)."""
    if not (isinstance(budget, int | float) and math.isfinite(budget) and budget > 0):
        raise ValueError(f"a FLOP budget must be a positive number, got {budget!r}")
    text = f"{budget:.3g}"
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    return f"{mantissa}e{int(exponent)}"


def plan_cell(
    label: str,
    model_name: str,
    model: LlamaSpec,
    budget: float,
    *,
    vocab_size: int,
    batch_size: int,
    seq_len: int | None = None,
    learning_rate: LearningRateRule | Callable[[Any], float] = LearningRateRule(),
) -> GridCell:
    """The run of `model` for `budget` FLOPs: steps = budget / (FLOPs per token x tokens per step),
    rounded to the nearest whole step (at least one)."""
    seq = seq_len or model.seq_len
    per_step = flops_per_token(model, vocab_size, seq) * batch_size * seq
    steps = max(1, round(budget / per_step))
    return GridCell(
        label=label,
        model_name=model_name,
        model=model,
        budget=float(budget),
        vocab_size=vocab_size,
        batch_size=batch_size,
        seq_len=seq,
        steps=steps,
        learning_rate=float(learning_rate(model)),
    )


@dataclass(frozen=True)
class IsoflopPlan:
    cells: tuple[GridCell, ...]
    """The runs, by budget then by size."""

    skipped: tuple[tuple[str, str], ...]
    """(label, why) of every budget x model left out."""


def plan_isoflop_grid(
    budgets: Sequence[float],
    models: Mapping[str, LlamaSpec],
    *,
    vocab_size: int,
    batch_size: int,
    seq_len: int | None = None,
    learning_rate: LearningRateRule | Callable[[Any], float] = LearningRateRule(),
    min_steps: int = 20,
    max_tokens: int | None = None,
    sizes_per_budget: int | None = None,
    tokens_per_parameter: float = 20.0,
) -> IsoflopPlan:
    """The isoflop grid: every model at every budget (see the module docstring for the rules).

    `sizes_per_budget`: keep, at each budget, only that many models -- those whose tokens per
    compute parameter are nearest (in log) to `tokens_per_parameter`, i.e. a window of sizes
    centred on where the optimum is expected, which moves up with the budget as in real isoflop
    sweeps. Every budget must keep at least three models (a parabola has three coefficients).
    """
    if not budgets:
        raise ValueError("isoflop grid: no budgets; give at least three FLOP budgets")
    if len(set(budgets)) != len(budgets):
        raise ValueError(f"isoflop grid: budgets repeat: {sorted(budgets)}")
    if len(models) < 3:
        raise ValueError(f"isoflop grid: {len(models)} model shapes; a parabola per budget needs at least 3")
    if sizes_per_budget is not None and sizes_per_budget < 3:
        raise ValueError(f"isoflop grid: sizes_per_budget={sizes_per_budget}; at least 3 per budget")
    cells: list[GridCell] = []
    skipped: list[tuple[str, str]] = []
    for budget in sorted(budgets):
        candidates = []
        for name, model in models.items():
            cell = plan_cell(
                f"{budget_label(budget)}-{name}",
                name,
                model,
                budget,
                vocab_size=vocab_size,
                batch_size=batch_size,
                seq_len=seq_len,
                learning_rate=learning_rate,
            )
            if cell.steps < min_steps:
                skipped.append((cell.label, f"{cell.steps} steps < min_steps={min_steps}"))
            elif max_tokens is not None and cell.tokens > max_tokens:
                skipped.append((cell.label, f"{cell.tokens:,} tokens > max_tokens={max_tokens:,}"))
            else:
                candidates.append(cell)
        if sizes_per_budget is not None and len(candidates) > sizes_per_budget:
            target = math.log(tokens_per_parameter)
            ranked = sorted(
                candidates, key=lambda c: abs(math.log(c.tokens / c.parameters["compute"]) - target)
            )
            kept = set(id(c) for c in ranked[:sizes_per_budget])
            for cell in candidates:
                if id(cell) not in kept:
                    ratio = cell.tokens / cell.parameters["compute"]
                    skipped.append((cell.label, f"{ratio:.3g} tokens per parameter: outside the window"))
            candidates = [c for c in candidates if id(c) in kept]
        if len(candidates) < 3:
            raise ValueError(
                f"isoflop grid: budget {budget:.3g} keeps {len(candidates)} model(s) "
                f"({', '.join(c.model_name for c in candidates) or 'none'}); a parabola needs 3. "
                f"Left out: {'; '.join(f'{label}: {why}' for label, why in skipped if label.startswith(budget_label(budget) + '-'))}. "
                "Raise the budget, add smaller models, or lower min_steps"
            )
        candidates.sort(key=lambda c: c.parameters["compute"])
        cells.extend(candidates)
    return IsoflopPlan(tuple(cells), tuple(skipped))


# ---------------------------------------------------------------------------- the fit


@dataclass(frozen=True)
class RunResult:
    """What the fit needs of one finished run."""

    label: str
    budget: float
    """The budget it was planned for: runs are grouped by it."""

    flops: float
    """The FLOPs it trained for."""

    tokens: float
    parameters: float
    """N, in the fit's chosen count."""

    loss: float


@dataclass(frozen=True)
class PowerLaw:
    """y = coefficient * C ** exponent."""

    coefficient: float
    exponent: float

    def __call__(self, flops: Any) -> Any:
        return self.coefficient * np.asarray(flops, dtype=float) ** self.exponent

    def to_json(self) -> dict[str, float]:
        return {"coefficient": self.coefficient, "exponent": self.exponent}


@dataclass(frozen=True)
class BudgetFit:
    """The parabola of one budget, loss = a x^2 + b x + c with x = ln N, and its vertex."""

    budget: float
    flops: float
    """The mean FLOPs its runs trained for."""

    runs: int
    distinct_sizes: int
    coefficients: tuple[float, float, float] | None
    parameters: float | None
    """N*: the vertex's size (None when the fit has no minimum)."""

    tokens: float | None
    loss: float | None
    bracketed: bool
    why_not_used: str | None
    """None: the minimum enters the power laws; else why it does not."""

    @property
    def usable(self) -> bool:
        return self.why_not_used is None

    @property
    def curvature(self) -> float | None:
        return None if self.coefficients is None else self.coefficients[0]


class NotEnoughBudgets(ValueError):
    """Fewer than two budgets have a bracketed minimum: no power law can be fitted."""


@dataclass(frozen=True)
class IsoflopFit:
    budgets: tuple[BudgetFit, ...]
    parameters: PowerLaw
    """N*(C)."""

    tokens: PowerLaw
    """D*(C)."""

    loss: PowerLaw
    """L*(C)."""

    curvature: float
    """The mean of the used budgets' a (loss per (ln N)^2)."""

    def predict(self, parameters: float, flops: float) -> float:
        """The loss of a run of `parameters` N trained for `flops`: L*(C) + k (ln N - ln N*(C))^2."""
        offset = math.log(parameters) - math.log(float(self.parameters(flops)))
        return float(self.loss(flops)) + self.curvature * offset**2

    def laws_json(self) -> dict[str, Any]:
        return {
            "parameters": self.parameters.to_json(),
            "tokens": self.tokens.to_json(),
            "loss": self.loss.to_json(),
            "curvature": self.curvature,
        }

    @staticmethod
    def from_laws(laws: Mapping[str, Any]) -> IsoflopFit:
        """A fit from `laws_json()` (no budgets): what bootstrap.json keeps of each replicate."""

        def law(name: str) -> PowerLaw:
            value = laws.get(name)
            if not isinstance(value, Mapping):
                raise ValueError(f"laws: {name} is missing")
            return PowerLaw(_finite(value.get("coefficient"), name), _finite(value.get("exponent"), name))

        return IsoflopFit(
            (), law("parameters"), law("tokens"), law("loss"), _finite(laws.get("curvature"), "curvature")
        )


def fit_parabola(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares a, b, c of y = a x^2 + b x + c."""
    a, b, c = np.polyfit(np.asarray(x, dtype=float), np.asarray(y, dtype=float), 2)
    return float(a), float(b), float(c)


def fit_power_law(flops: Sequence[float], values: Sequence[float]) -> PowerLaw:
    """Least squares of ln y = ln k + e ln C."""
    exponent, intercept = np.polyfit(
        np.log(np.asarray(flops, dtype=float)), np.log(np.asarray(values, dtype=float)), 1
    )
    return PowerLaw(float(math.exp(intercept)), float(exponent))


def fit_budget(budget: float, runs: Sequence[RunResult]) -> BudgetFit:
    """The parabola and vertex of one budget's runs (see the module docstring)."""
    flops = float(np.mean([run.flops for run in runs]))
    x = np.log([run.parameters for run in runs])
    distinct = len(set(np.round(x, 12)))
    base = BudgetFit(budget, flops, len(runs), distinct, None, None, None, None, False, None)
    if distinct < 3:
        return dataclasses.replace(base, why_not_used=f"{distinct} distinct size(s); a parabola needs 3")
    losses = np.asarray([run.loss for run in runs], dtype=float)
    a, b, c = fit_parabola(x, losses)
    span = float(x.max() - x.min())
    # Curvature that moves the loss by less than a part in 1e9 across the sizes run is rounding.
    if not a * span * span > 1e-9 * float(np.max(np.abs(losses))):
        return dataclasses.replace(
            base,
            coefficients=(a, b, c),
            why_not_used="the loss does not curve up with size (no minimum): sizes too close, or too noisy",
        )
    vertex = -b / (2 * a)
    if not x.min() <= vertex <= x.max():
        smaller = vertex < x.min()
        # The vertex is kept (for the record and the plot) only where it is a representable size.
        near = abs(vertex) < 700
        return dataclasses.replace(
            base,
            coefficients=(a, b, c),
            parameters=math.exp(vertex) if near else None,
            loss=c - b * b / (4 * a) if near else None,
            why_not_used=f"the minimum (ln N = {vertex:.3g}) lies {'below the smallest' if smaller else 'above the largest'} "
            f"size run: add {'smaller' if smaller else 'larger'} models",
        )
    slope, intercept = np.polyfit(x, np.log([run.tokens for run in runs]), 1)
    return dataclasses.replace(
        base,
        coefficients=(a, b, c),
        parameters=math.exp(vertex),
        tokens=math.exp(intercept + slope * vertex),
        loss=c - b * b / (4 * a),
        bracketed=True,
    )


def group_by_budget(runs: Iterable[RunResult]) -> dict[float, list[RunResult]]:
    groups: dict[float, list[RunResult]] = {}
    for run in runs:
        groups.setdefault(run.budget, []).append(run)
    return dict(sorted(groups.items()))


def fit_isoflops(runs: Sequence[RunResult]) -> IsoflopFit:
    """Parabolas per budget, then power laws through their minima (NotEnoughBudgets when fewer
    than two budgets have a bracketed minimum)."""
    budgets = tuple(fit_budget(budget, group) for budget, group in group_by_budget(runs).items())
    used = [fit for fit in budgets if fit.usable]
    if len(used) < 2:
        reasons = "; ".join(f"{fit.budget:.3g}: {fit.why_not_used}" for fit in budgets if not fit.usable)
        raise NotEnoughBudgets(
            f"{len(used)} budget(s) with a bracketed minimum; the power laws need 2 (left out: {reasons or 'none'})"
        )
    flops = [fit.flops for fit in used]
    return IsoflopFit(
        budgets=budgets,
        parameters=fit_power_law(flops, [fit.parameters for fit in used]),
        tokens=fit_power_law(flops, [fit.tokens for fit in used]),
        loss=fit_power_law(flops, [fit.loss for fit in used]),
        curvature=float(np.mean([fit.curvature for fit in used])),
    )


@dataclass(frozen=True)
class Bootstrap:
    fits: tuple[IsoflopFit, ...]
    samples: int
    """Replicates drawn; `len(fits)` of them could be fitted."""

    seed: int


def bootstrap_isoflops(runs: Sequence[RunResult], samples: int, seed: int) -> Bootstrap:
    """Refit on `samples` resamples of the runs, drawn with replacement within each budget."""
    if samples < 0:
        raise ValueError(f"bootstrap samples must be >= 0, got {samples}")
    rng = np.random.default_rng(seed)
    groups = list(group_by_budget(runs).values())
    fits = []
    for _ in range(samples):
        resampled = [group[i] for group in groups for i in rng.integers(0, len(group), len(group))]
        with contextlib.suppress(NotEnoughBudgets):
            fits.append(fit_isoflops(resampled))
    return Bootstrap(tuple(fits), samples, seed)


def percentile_interval(values: Sequence[float], confidence: float) -> tuple[float, float] | None:
    """The central `confidence` interval of `values` (None when they hold fewer than 2 distinct
    values: with three sizes per budget every usable resample is the runs themselves, and a
    zero-width interval would claim a certainty the bootstrap does not have)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    array = np.asarray(values, dtype=float)
    # "Distinct" up to rounding: the same runs in another order fit to within a few ulps.
    if len(array) < 2 or np.ptp(array) <= 1e-9 * float(np.max(np.abs(array))):
        return None
    low, high = np.quantile(array, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


# ---------------------------------------------------------------------------- reading trees


def _finite(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def read_json_object(path: str, what: str) -> dict[str, Any] | None:
    """The JSON object at `path` (None when missing); ValueError naming `what` and the path when
    it is not a JSON object or larger than MAX_JSON_BYTES."""
    try:
        with fsspec.open(path, "rb") as handle:
            data = handle.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_JSON_BYTES:
        raise ValueError(f"{what} {path}: larger than {MAX_JSON_BYTES} bytes")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise ValueError(f"{what} {path}: not JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} {path}: not a JSON object")
    return value


def version_hash_of(output_path: str) -> str | None:
    """The executor's version hash of the step that wrote `output_path` (its `.executor_info`),
    or None where there is none (the function was called outside the executor) or it is unreadable."""
    try:
        info = read_json_object(join(output_path, INFO_FILE), "step info")
    except ValueError:
        return None
    value = (info or {}).get("version_hash")
    if isinstance(value, str) and len(value) == 64 and all(ch in "0123456789abcdef" for ch in value):
        return value
    return None


def first_running_date(output_path: str) -> str | None:
    """When the step at `output_path` first started (its first RUNNING status line), if recorded."""
    try:
        with fsspec.open(join(output_path, STATUS_FILE), "rb") as handle:
            data = handle.read(MAX_JSON_BYTES)
    except FileNotFoundError:
        return None
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(event, dict) and event.get("status") == "RUNNING" and parse_time(event.get("date")):
            return event["date"]
    return None


def parse_time(value: Any) -> datetime.datetime | None:
    """An ISO-8601 time (the executor's `2026-11-23T14:10:31.687Z`) as an aware datetime, else None."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def digest_of(record: Mapping[str, Any]) -> str:
    """SHA-256 of a record's canonical JSON (sorted keys, no spaces), its `digest` field left out."""
    body = {key: value for key, value in record.items() if key != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_digest(path: str) -> str | None:
    try:
        with fsspec.open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except FileNotFoundError:
        return None


def _write_json(path: str, value: Any) -> None:
    with atomic_output(path) as handle:
        handle.write((json.dumps(value, indent=2, sort_keys=True, allow_nan=False) + "\n").encode("utf-8"))


def _write_text(path: str, text: str) -> None:
    with atomic_output(path) as handle:
        handle.write(text.encode("utf-8"))


def write_once(path: str, data: bytes) -> None:
    """Create `path` holding `data`; FileExistsError if it exists. On local disk the file appears
    whole or not at all and never replaces another (a hard link of a finished temporary file);
    on object stores it is checked then written (the step's lease keeps other drivers out)."""
    if is_local(path):
        target = path.removeprefix("file://")
        directory = os.path.dirname(target) or "."
        os.makedirs(directory, exist_ok=True)
        temp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}-{os.path.basename(target)}")
        try:
            with open(temp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temp, 0o444)  # read-only: an editor or a script has to mean it
            os.link(temp, target)  # atomic, and fails if the target exists
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
        return
    fs, fs_path = fsspec.core.url_to_fs(path)
    if fs.exists(fs_path):
        raise FileExistsError(path)
    with fsspec.open(path, "wb") as handle:
        handle.write(data)


# ---------------------------------------------------------------------------- the fit step


@dataclass(frozen=True)
class ScalingRun:
    """One grid run as the fit step's config names it: what was planned, and where it went."""

    cell: GridCell
    path: str
    """The training step's output (stats.json inside)."""


@dataclass(frozen=True)
class ScalingFitConfig:
    runs: tuple[ScalingRun, ...]
    """The grid's runs (at least three sizes at each of at least two budgets)."""

    output_path: str
    parameters: str = "compute"
    """Which N the laws are stated in: compute, non_embedding or total (module docstring)."""

    loss_key: str = "final_eval_loss"
    """The stats.json field fitted: the held-out loss at the end of each run."""

    bootstrap_samples: int = 1000
    seed: int = 0
    confidence: float = 0.9
    """Of the intervals reported (percentiles of the bootstrap replicates)."""

    extrapolate_to: float = 30.0
    """frontier.png extends the laws to this many times the largest budget (a picture only)."""


def run_results(config: ScalingFitConfig) -> list[tuple[RunResult, ScalingRun, dict[str, Any]]]:
    """Each run's result with its config entry and what was read of its output."""
    if config.parameters not in PARAMETER_KINDS:
        raise ValueError(
            f"scaling fit: parameters={config.parameters!r}; one of {', '.join(PARAMETER_KINDS)}"
        )
    out = []
    for run in config.runs:
        cell = run.cell
        where = f"scaling fit: run {cell.label}"
        stats = read_json_object(join(run.path, "stats.json"), f"{where}: stats")
        if stats is None:
            raise FileNotFoundError(f"{where}: {run.path}/stats.json is missing (did it finish?)")
        loss = _finite(stats.get(config.loss_key), f"{where}: stats.json {config.loss_key}")
        recorded = stats.get("parameter_count")
        expected = cell.parameters["total"]
        if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded != expected:
            raise ValueError(
                f"{where}: stats.json says {recorded:,} parameters, but vocab_size={cell.vocab_size} "
                f"gives {expected:,}: the grid's vocab_size is not its tokenizer's"
            )
        steps = stats.get("num_train_steps")
        if isinstance(steps, int) and not isinstance(steps, bool) and steps != cell.steps:
            raise ValueError(f"{where}: trained {steps} steps, the grid planned {cell.steps}")
        result = RunResult(
            label=cell.label,
            budget=cell.budget,
            flops=cell.flops,
            tokens=float(cell.tokens),
            parameters=float(cell.parameters[config.parameters]),
            loss=loss,
        )
        record = {
            **cell.describe(),
            "path": run.path,
            "version_hash": version_hash_of(run.path),
            "loss": loss,
            "final_train_loss": stats.get("final_train_loss")
            if _is_number(stats.get("final_train_loss"))
            else None,
        }
        out.append((result, run, record))
    return out


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def fit_scaling_law(config: ScalingFitConfig) -> None:
    """Fit the grid: fit.json, bootstrap.json, isoflops.png, frontier.png, summary.md."""
    results = run_results(config)
    runs = [result for result, _, _ in results]
    try:
        fit = fit_isoflops(runs)
    except NotEnoughBudgets as error:
        raise ValueError(f"scaling fit: {error}") from None
    boot = bootstrap_isoflops(runs, config.bootstrap_samples, config.seed)
    intervals = {
        name: percentile_interval([getattr(f, name).exponent for f in boot.fits], config.confidence)
        for name in ("parameters", "tokens", "loss")
    }
    record = {
        "kind": FIT_KIND,
        "method": (
            "per budget a least-squares parabola of loss against ln N, its vertex the optimum; "
            "power laws y = k C^e through the optima by least squares in log-log; "
            "L(N, C) = L*(C) + curvature (ln N - ln N*(C))^2"
        ),
        "parameters": config.parameters,
        "loss_key": config.loss_key,
        "runs": [record for _, _, record in results],
        "budgets": [_budget_json(b) for b in fit.budgets],
        "laws": fit.laws_json(),
        "bootstrap": {
            "samples": boot.samples,
            "used": len(boot.fits),
            "seed": boot.seed,
            "confidence": config.confidence,
            "resampling": "runs with replacement within each budget",
            "exponent_intervals": {k: list(v) if v else None for k, v in intervals.items()},
        },
    }
    _write_json(join(config.output_path, BOOTSTRAP_FILE), {"replicates": [f.laws_json() for f in boot.fits]})
    _write_json(join(config.output_path, FIT_FILE), record)
    _plot_isoflops(config, fit, results)
    _plot_frontier(config, fit, boot)
    summary = fit_summary(record)
    _write_text(join(config.output_path, SUMMARY_FILE), summary)
    print(summary)


fit_scaling_law.__run_records__ = {"files": [], "fields": {}}  # type: ignore[attr-defined]


def _budget_json(fit: BudgetFit) -> dict[str, Any]:
    return {
        "budget": fit.budget,
        "flops": fit.flops,
        "runs": fit.runs,
        "distinct_sizes": fit.distinct_sizes,
        "parabola": None if fit.coefficients is None else dict(zip("abc", fit.coefficients, strict=True)),
        "optimum": None
        if fit.parameters is None
        else {"parameters": fit.parameters, "tokens": fit.tokens, "loss": fit.loss},
        "bracketed": fit.bracketed,
        "used": fit.usable,
        "why_not_used": fit.why_not_used,
    }


def fit_summary(record: Mapping[str, Any]) -> str:
    laws = record["laws"]
    boot = record["bootstrap"]
    ci = boot["exponent_intervals"]
    pct = round(100 * boot["confidence"])

    def law(name: str, symbol: str) -> str:
        value = laws[name]
        interval = ci.get(name)
        band = (
            f" ({pct}% interval of the exponent {interval[0]:.3f} .. {interval[1]:.3f})" if interval else ""
        )
        return f"- {symbol}(C) = {value['coefficient']:.4g} C^{value['exponent']:.4f}{band}"

    lines = [
        "# Scaling-law fit",
        "",
        f"N counts {record['parameters']} parameters; the loss is each run's {record['loss_key']}.",
        "",
        "| budget (FLOPs) | runs | optimum N | optimum D | optimum loss | used |",
        "|---|---|---|---|---|---|",
    ]
    for budget in record["budgets"]:
        optimum = budget["optimum"]
        cells = (
            [f"{optimum['parameters']:.3g}", f"{optimum['tokens']:.3g}", f"{optimum['loss']:.4f}"]
            if optimum
            else ["-", "-", "-"]
        )
        used = "yes" if budget["used"] else f"no: {budget['why_not_used']}"
        lines.append(f"| {budget['budget']:.3g} | {budget['runs']} | {' | '.join(cells)} | {used} |")
    lines += [
        "",
        law("parameters", "N*"),
        law("tokens", "D*"),
        law("loss", "L*"),
        f"- curvature of the loss in ln N: {laws['curvature']:.4f}",
        "",
        f"Bootstrap: {boot['used']} of {boot['samples']} replicates fitted ({boot['resampling']}, seed {boot['seed']}).",
    ]
    if boot["samples"] and boot["used"] < boot["samples"] / 2:
        lines.append(
            "Fewer than half the replicates could be fitted: with few sizes per budget a resample "
            "often has fewer than 3 distinct sizes. The intervals are rough; run more sizes per budget."
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- the prediction


@dataclass(frozen=True)
class PredictionConfig:
    fit_path: str
    """The fit step's output (fit.json, bootstrap.json)."""

    target: GridCell
    """The run predicted: model, tokens, budget, and the rules it trains with."""

    output_path: str
    confidence: float = 0.9


def predict_target(
    fit_record: Mapping[str, Any], replicates: Sequence[IsoflopFit], target: GridCell, confidence: float
) -> dict[str, Any]:
    """The predicted loss of `target` with its bootstrap interval, from a fit record."""
    kind = fit_record.get("parameters")
    if kind not in PARAMETER_KINDS:
        raise ValueError(f"prediction: fit.json parameters={kind!r} is not one of {PARAMETER_KINDS}")
    laws = fit_record.get("laws")
    if not isinstance(laws, Mapping):
        raise ValueError("prediction: fit.json has no laws")
    fit = IsoflopFit.from_laws(laws)
    n_target = float(target.parameters[kind])
    flops = target.flops
    predicted = fit.predict(n_target, flops)
    samples = [replicate.predict(n_target, flops) for replicate in replicates]
    interval = percentile_interval(samples, confidence)
    budgets = [
        b.get("budget") for b in fit_record.get("budgets", []) if isinstance(b, Mapping) and b.get("used")
    ]
    largest = max((b for b in budgets if _is_number(b)), default=None)
    return {
        "predicted_loss": predicted,
        "interval": list(interval) if interval else None,
        "confidence": confidence,
        "bootstrap_replicates": len(samples),
        "parameters_counted": kind,
        "target_parameters": n_target,
        "compute_optimal": {
            "parameters": float(fit.parameters(flops)),
            "tokens": float(fit.tokens(flops)),
            "loss": float(fit.loss(flops)),
        },
        "extrapolation": None if largest is None else flops / largest,
    }


def write_prediction(config: PredictionConfig) -> None:
    """Write prediction.json once: the predicted loss of the target, its interval, and the
    version hashes of the fit and every run it came from.

    Never overwritten. If prediction.json exists -- the step ran before and its status was lost,
    or someone forces it again -- it is left as it is: the step succeeds without writing when
    the file is intact (its digest matches) and was made from the same fit and runs for the same
    target, and fails otherwise (a prediction for other inputs is a new step, with a new hash).
    """
    path = join(config.output_path, PREDICTION_FILE)
    fit_file = join(config.fit_path, FIT_FILE)
    fit_record = read_json_object(fit_file, "prediction: fit")
    if fit_record is None or fit_record.get("kind") != FIT_KIND:
        raise FileNotFoundError(f"prediction: {fit_file} is missing or not a scaling fit")
    boot = read_json_object(join(config.fit_path, BOOTSTRAP_FILE), "prediction: bootstrap") or {}
    replicates = [IsoflopFit.from_laws(r) for r in boot.get("replicates", []) if isinstance(r, Mapping)]
    runs = []
    for run in fit_record.get("runs", []):
        if not isinstance(run, Mapping) or not isinstance(run.get("path"), str):
            raise ValueError(f"prediction: {fit_file}: a run without a path")
        _check_run_path(run["path"], config.fit_path, fit_file)
        now = version_hash_of(run["path"])
        if run.get("version_hash") != now:
            raise ValueError(
                f"prediction: run {run.get('label')!r} at {run['path']} has version {now}, but the fit was "
                f"made from {run.get('version_hash')}: re-run the fit"
            )
        runs.append({"label": run.get("label"), "path": run["path"], "version_hash": now})
    inputs = {
        "target": config.target.describe(),
        "fit": {
            "path": config.fit_path,
            "version_hash": version_hash_of(config.fit_path),
            "fit_json_sha256": file_digest(fit_file),
            "bootstrap_json_sha256": file_digest(join(config.fit_path, BOOTSTRAP_FILE)),
        },
        "runs": runs,
    }
    existing = read_json_object(path, "prediction")
    if existing is not None:
        _keep_existing_prediction(path, existing, inputs)
        return
    record = {
        "kind": PREDICTION_KIND,
        "format": 1,
        **inputs,
        **predict_target(fit_record, replicates, config.target, config.confidence),
        "version_hash": version_hash_of(config.output_path),
        "created_at": now_iso(),
    }
    record["digest"] = digest_of(record)
    data = (json.dumps(record, indent=2, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")
    try:
        write_once(path, data)
    except FileExistsError:
        raise RuntimeError(f"prediction: {path} appeared while this step ran; it is left as it is") from None
    summary = prediction_summary(record)
    _write_text(join(config.output_path, SUMMARY_FILE), summary)
    print(summary)


write_prediction.__run_records__ = {  # type: ignore[attr-defined]
    "files": [SUMMARY_FILE],
    "fields": {PREDICTION_FILE: ["created_at", "digest", "version_hash"]},
}


def _check_run_path(path: str, fit_path: str, fit_file: str) -> None:
    """A run path read from fit.json (a file of the tree, so untrusted) is only read if it lies
    on the fit's own storage (same scheme and bucket) and has no `..` parts."""

    def root(value: str) -> tuple[str, str]:
        scheme, _, rest = value.partition("://") if "://" in value else ("file", "", value)
        return scheme, rest.split("/", 1)[0] if scheme != "file" else ""

    parts = path.split("://", 1)[-1].split("/")
    if len(path) > 4096 or ".." in parts or root(path) != root(fit_path):
        raise ValueError(
            f"prediction: {fit_file}: run path {path[:200]!r} is not on the fit's storage "
            f"({fit_path}) or has '..' parts; re-run the fit"
        )


def _keep_existing_prediction(path: str, existing: Mapping[str, Any], inputs: Mapping[str, Any]) -> None:
    if existing.get("digest") != digest_of(existing):
        raise RuntimeError(
            f"prediction: {path} exists and does not match its digest (edited after it was written). "
            "A prediction is never rewritten: delete the whole output directory to predict again, "
            "and know that any target run made from it no longer has a pre-registered prediction"
        )
    same = all(existing.get(key) == inputs[key] for key in ("target", "runs")) and all(
        _dict(existing.get("fit")).get(key) == inputs["fit"][key]
        for key in ("path", "version_hash", "fit_json_sha256", "bootstrap_json_sha256")
    )
    if not same:
        raise RuntimeError(
            f"prediction: {path} exists and was made from other inputs (fit, runs or target). "
            "A prediction is never rewritten; a prediction for other inputs is another step"
        )
    logger.warning("prediction: %s was written at %s; kept as it is", path, existing.get("created_at"))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def prediction_summary(record: Mapping[str, Any]) -> str:
    target = record["target"]
    interval = record.get("interval")
    pct = round(100 * record["confidence"])
    band = (
        f", {pct}% interval {interval[0]:.4f} .. {interval[1]:.4f}"
        if interval
        else ", no interval (fewer than two distinct bootstrap replicates: run four or more sizes per budget)"
    )
    optimum = record["compute_optimal"]
    lines = [
        f"# Prediction: {target['label']}",
        "",
        f"**Predicted final loss {record['predicted_loss']:.4f}{band}**",
        "",
        f"- target: {target['model_name']}, {target['parameters']['compute']:,} compute parameters "
        f"({target['parameters']['total']:,} in all), {target['tokens']:,} tokens ({target['steps']} steps of "
        f"{target['batch_size']} x {target['seq_len']}), {target['flops']:.3g} FLOPs",
        f"- extrapolation: {record['extrapolation']:.3g}x the largest budget fitted"
        if record.get("extrapolation")
        else "- extrapolation: unknown",
        f"- compute-optimal at this budget: N = {optimum['parameters']:.3g}, D = {optimum['tokens']:.3g}, "
        f"loss {optimum['loss']:.4f}",
        f"- from the fit {record['fit']['path']} (version {record['fit']['version_hash'] or 'not recorded'}) "
        f"of {len(record['runs'])} runs",
        f"- written {record['created_at']}; digest {record['digest']}",
        "",
        "This file and prediction.json are written once, before the target run starts (the target's",
        "training step waits for this step and records the digest above when it starts).",
        "Publish the digest (commit it, post it) to make the pre-registration checkable by others.",
    ]
    return "\n".join(lines) + "\n"


def read_prediction(prediction_path: str) -> dict[str, Any]:
    """prediction.json, checked against its digest (ValueError when missing or edited)."""
    path = join(prediction_path, PREDICTION_FILE)
    record = read_json_object(path, "prediction")
    if record is None or record.get("kind") != PREDICTION_KIND:
        raise FileNotFoundError(f"{path} is missing or is not a prediction")
    if record.get("digest") != digest_of(record):
        raise ValueError(f"{path} does not match its digest: it was edited after it was written")
    return record


# ---------------------------------------------------------------------------- the target run


@dataclass(frozen=True)
class PreregisteredTrainConfig(TrainConfig):
    """A training step's config plus the prediction it must follow (an input: the step waits for it)."""

    prediction_path: str = ""
    """The prediction step's output (prediction.json inside)."""


def train_preregistered(config: PreregisteredTrainConfig) -> None:
    """Train the target of a prediction: check that prediction.json is intact and names this run,
    record its digest in preregistration.json before the first step, then train as
    `operations.train.train` does. A resumed run checks the digest it recorded is still the
    prediction's: a prediction edited after the target started fails the run."""
    if not config.prediction_path:
        raise ValueError("train_preregistered: prediction_path is empty; pass the prediction step")
    prediction = read_prediction(config.prediction_path)
    target = _dict(prediction.get("target"))
    seq_len = config.train.seq_len or config.model.seq_len
    mine = {
        "model": dataclasses.asdict(config.model),
        "steps": config.train.num_train_steps,
        "batch_size": config.train.train_batch_size,
        "seq_len": seq_len,
    }
    theirs = {key: target.get(key) for key in mine}
    if mine != theirs:
        raise ValueError(
            f"train_preregistered: the prediction at {config.prediction_path} is for {theirs}, this run is {mine}"
        )
    path = join(config.output_path, PREREGISTRATION_FILE)
    recorded = read_json_object(path, "preregistration")
    if recorded is None:
        _write_json(
            path,
            {
                "prediction_path": config.prediction_path,
                "prediction_digest": prediction["digest"],
                "prediction_created_at": prediction.get("created_at"),
                "predicted_loss": prediction.get("predicted_loss"),
                "interval": prediction.get("interval"),
                "training_started_at": now_iso(),
            },
        )
    elif recorded.get("prediction_digest") != prediction["digest"]:
        raise ValueError(
            f"train_preregistered: {config.prediction_path}/prediction.json changed after this run started "
            f"(digest {recorded.get('prediction_digest')} when it started, {prediction['digest']} now)"
        )
    train(
        TrainConfig(**{field.name: getattr(config, field.name) for field in dataclasses.fields(TrainConfig)})
    )


train_preregistered.__run_records__ = {  # type: ignore[attr-defined]
    "files": [*run_records.TRAIN["files"]],
    "fields": {**run_records.TRAIN["fields"], PREREGISTRATION_FILE: ["training_started_at"]},
}


# ---------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class PredictionReportConfig:
    prediction_path: str
    target_path: str
    """The target training step's output (stats.json, preregistration.json)."""

    fit_path: str
    output_path: str


def compare(prediction: Mapping[str, Any], actual: float) -> dict[str, Any]:
    """Prediction against outcome: error, relative error, inside the interval or not."""
    predicted = _finite(prediction.get("predicted_loss"), "prediction.json predicted_loss")
    interval = prediction.get("interval")
    inside = None
    if isinstance(interval, list) and len(interval) == 2 and all(_is_number(v) for v in interval):
        inside = interval[0] <= actual <= interval[1]
    return {
        "predicted_loss": predicted,
        "interval": interval,
        "confidence": prediction.get("confidence"),
        "actual_loss": actual,
        "error": actual - predicted,
        "relative_error": (actual - predicted) / predicted,
        "inside_interval": inside,
        "verdict": "no interval" if inside is None else ("inside" if inside else "outside"),
    }


def report_prediction(config: PredictionReportConfig) -> None:
    """Compare the pre-registered prediction with the target's final loss: report.json,
    prediction.png, summary.md. Also checks the pre-registration: the prediction is intact, the
    target recorded the same digest when it started, and the prediction was written first."""
    path = join(config.prediction_path, PREDICTION_FILE)
    record = read_json_object(path, "report: prediction")
    if record is None:
        raise FileNotFoundError(f"report: {path} is missing")
    intact = record.get("digest") == digest_of(record)
    loss_key = "final_eval_loss"
    stats = read_json_object(join(config.target_path, "stats.json"), "report: target stats")
    if stats is None:
        raise FileNotFoundError(
            f"report: {config.target_path}/stats.json is missing (did the target finish?)"
        )
    actual = _finite(stats.get(loss_key), f"report: {config.target_path}/stats.json {loss_key}")
    prereg = read_json_object(join(config.target_path, PREREGISTRATION_FILE), "report: preregistration") or {}
    started = [
        t
        for t in (prereg.get("training_started_at"), first_running_date(config.target_path))
        if parse_time(t)
    ]
    training_started = min(started, key=parse_time) if started else None
    created = record.get("created_at")
    preceded = (
        parse_time(created) < parse_time(training_started)
        if parse_time(created) is not None and training_started is not None
        else None
    )
    checks = {
        "prediction_intact": intact,
        "digest_recorded_by_target": prereg.get("prediction_digest"),
        "digest_matches_target_record": prereg.get("prediction_digest") == record.get("digest"),
        "prediction_created_at": created,
        "training_started_at": training_started,
        "prediction_preceded_training": preceded,
    }
    checks["preregistered"] = bool(intact and checks["digest_matches_target_record"] and preceded)
    report = {
        "kind": REPORT_KIND,
        "target": _dict(record.get("target")).get("label"),
        "prediction_path": config.prediction_path,
        "target_path": config.target_path,
        "loss_key": loss_key,
        **compare(record, actual),
        "extrapolation": record.get("extrapolation"),
        "checks": checks,
    }
    _write_json(join(config.output_path, REPORT_FILE), report)
    fit_record = read_json_object(join(config.fit_path, FIT_FILE), "report: fit")
    boot = read_json_object(join(config.fit_path, BOOTSTRAP_FILE), "report: bootstrap") or {}
    if fit_record is not None:
        replicates = [IsoflopFit.from_laws(r) for r in boot.get("replicates", []) if isinstance(r, Mapping)]
        _plot_prediction(config, fit_record, replicates, record, report)
    summary = report_summary(report)
    _write_text(join(config.output_path, SUMMARY_FILE), summary)
    print(summary)


report_prediction.__run_records__ = {  # type: ignore[attr-defined]
    "files": [SUMMARY_FILE],
    "fields": {
        REPORT_FILE: [
            "checks.prediction_created_at",
            "checks.training_started_at",
            "checks.digest_recorded_by_target",
        ]
    },
}


def report_summary(report: Mapping[str, Any]) -> str:
    checks = report["checks"]
    interval = report.get("interval")
    pct = round(100 * report["confidence"]) if _is_number(report.get("confidence")) else "?"
    band = f" ({pct}% interval {interval[0]:.4f} .. {interval[1]:.4f})" if interval else ""
    verdict = {
        "inside": "inside the interval",
        "outside": "OUTSIDE the interval",
        "no interval": "no interval to compare with",
    }[report["verdict"]]
    lines = [
        f"# Prediction vs outcome: {report['target']}",
        "",
        f"**Predicted {report['predicted_loss']:.4f}{band}; actual {report['actual_loss']:.4f}: "
        f"{verdict}; error {report['error']:+.4f} ({100 * report['relative_error']:+.2f}%).**",
        "",
        f"- extrapolated {report['extrapolation']:.3g}x beyond the largest budget fitted"
        if _is_number(report.get("extrapolation"))
        else "- extrapolation: unknown",
        f"- prediction written {checks['prediction_created_at']}, target started {checks['training_started_at']}",
        f"- pre-registration {'holds' if checks['preregistered'] else 'DOES NOT hold'}: prediction intact: "
        f"{checks['prediction_intact']}; same digest recorded by the target: {checks['digest_matches_target_record']}; "
        f"written before training: {checks['prediction_preceded_training']}",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure: Any, path: str) -> None:
    plt = _pyplot()
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=110, metadata={"Software": None})
    plt.close(figure)
    with atomic_output(path) as handle:
        handle.write(buffer.getvalue())


def _plot_isoflops(
    config: ScalingFitConfig, fit: IsoflopFit, results: Sequence[tuple[RunResult, Any, Any]]
) -> None:
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    groups = group_by_budget(result for result, _, _ in results)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, budget_fit in enumerate(fit.budgets):
        color = colors[index % len(colors)]
        group = groups[budget_fit.budget]
        n = np.array([run.parameters for run in group])
        axis.plot(n, [run.loss for run in group], "o", color=color, label=f"C = {budget_fit.budget:.2g}")
        if budget_fit.coefficients is not None:
            x = np.linspace(np.log(n.min()) - 0.2, np.log(n.max()) + 0.2, 100)
            a, b, c = budget_fit.coefficients
            axis.plot(np.exp(x), a * x * x + b * x + c, "-", color=color, linewidth=1)
        near = budget_fit.parameters is not None and n.min() / 3 <= budget_fit.parameters <= n.max() * 3
        if near:  # (a far-off unbracketed vertex would only stretch the axes)
            axis.plot(
                budget_fit.parameters,
                budget_fit.loss,
                "*" if budget_fit.usable else "x",
                color=color,
                markersize=13,
                markeredgecolor="black",
            )
    axis.set_xscale("log")
    axis.set_xlabel(f"N ({config.parameters} parameters)")
    axis.set_ylabel(f"loss ({config.loss_key})")
    axis.set_title("Isoflop curves (stars: minima used; x: minima not used)")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    _save(figure, join(config.output_path, "isoflops.png"))


def _band(replicates: Sequence[IsoflopFit], flops: np.ndarray, law: str, confidence: float):
    if len(replicates) < 2:
        return None
    values = np.array([getattr(r, law)(flops) for r in replicates])
    return np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2], axis=0)


def _plot_frontier(config: ScalingFitConfig, fit: IsoflopFit, boot: Bootstrap) -> None:
    plt = _pyplot()
    used = [b for b in fit.budgets if b.usable]
    low = min(b.flops for b in fit.budgets) / 1.5
    high = max(b.flops for b in fit.budgets) * config.extrapolate_to
    flops = np.geomspace(low, high, 100)
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    for law, label, marker in (("parameters", "N*", "o"), ("tokens", "D*", "s")):
        line = left.plot(
            flops, getattr(fit, law)(flops), "-", label=f"{label}(C) ~ C^{getattr(fit, law).exponent:.2f}"
        )[0]
        band = _band(boot.fits, flops, law, config.confidence)
        if band is not None:
            left.fill_between(flops, band[0], band[1], color=line.get_color(), alpha=0.2)
        left.plot([b.flops for b in used], [getattr(b, law) for b in used], marker, color=line.get_color())
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("C (FLOPs)")
    left.set_title("compute-optimal size and tokens")
    left.legend(fontsize=8)
    left.grid(alpha=0.3, which="both")
    right.plot(flops, fit.loss(flops), "-", label=f"L*(C) ~ C^{fit.loss.exponent:.3f}")
    band = _band(boot.fits, flops, "loss", config.confidence)
    if band is not None:
        right.fill_between(
            flops, band[0], band[1], alpha=0.2, label=f"{round(100 * config.confidence)}% bootstrap band"
        )
    right.plot([b.flops for b in used], [b.loss for b in used], "o", color="black", label="isoflop minima")
    right.axvline(max(b.flops for b in fit.budgets), color="gray", linestyle=":", linewidth=1)
    right.set_xscale("log")
    right.set_xlabel("C (FLOPs)")
    right.set_ylabel(config.loss_key)
    right.set_title("loss frontier (dotted: largest budget fitted)")
    right.legend(fontsize=8)
    right.grid(alpha=0.3, which="both")
    _save(figure, join(config.output_path, "frontier.png"))


def _plot_prediction(
    config: PredictionReportConfig,
    fit_record: Mapping[str, Any],
    replicates: Sequence[IsoflopFit],
    prediction: Mapping[str, Any],
    report: Mapping[str, Any],
) -> None:
    plt = _pyplot()
    laws = fit_record.get("laws")
    if not isinstance(laws, Mapping):
        return
    fit = IsoflopFit.from_laws(laws)
    target = _dict(prediction.get("target"))
    target_flops = _finite(target.get("flops"), "prediction.json target.flops")
    optima = [
        (b["flops"], b["optimum"]["loss"])
        for b in fit_record.get("budgets", [])
        if isinstance(b, Mapping) and b.get("used") and isinstance(b.get("optimum"), Mapping)
    ]
    runs = [(r.get("flops"), r.get("loss")) for r in fit_record.get("runs", []) if isinstance(r, Mapping)]
    runs = [(f, loss) for f, loss in runs if _is_number(f) and _is_number(loss)]
    low = min([f for f, _ in runs] + [target_flops]) / 1.5
    flops = np.geomspace(low, target_flops * 1.5, 100)
    confidence = prediction.get("confidence") if _is_number(prediction.get("confidence")) else 0.9
    figure, axis = plt.subplots(figsize=(7, 4.5))
    axis.plot(
        [f for f, _ in runs], [loss for _, loss in runs], ".", color="gray", alpha=0.6, label="grid runs"
    )
    axis.plot(
        [f for f, _ in optima], [loss for _, loss in optima], "o", color="black", label="isoflop minima"
    )
    axis.plot(flops, fit.loss(flops), "-", label="L*(C) fitted")
    band = _band(replicates, flops, "loss", confidence)
    if band is not None:
        axis.fill_between(flops, band[0], band[1], alpha=0.2, label="bootstrap band of L*(C)")
    interval = report.get("interval")
    predicted = report["predicted_loss"]
    if isinstance(interval, list) and len(interval) == 2 and all(_is_number(v) for v in interval):
        # The interval as its own bar: a percentile interval need not contain the point estimate.
        axis.plot(
            [target_flops, target_flops],
            interval,
            "_-",
            color="tab:orange",
            markersize=14,
            linewidth=2,
            label=f"{round(100 * confidence)}% interval",
        )
    axis.plot([target_flops], [predicted], "s", color="tab:orange", label="predicted")
    axis.plot([target_flops], [report["actual_loss"]], "*", color="tab:red", markersize=14, label="actual")
    axis.set_xscale("log")
    axis.set_xlabel("C (FLOPs)")
    axis.set_ylabel(report["loss_key"])
    axis.set_title(f"{report['target']}: predicted vs actual ({report['verdict']})")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    _save(figure, join(config.output_path, "prediction.png"))
