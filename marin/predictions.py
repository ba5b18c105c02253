"""Pre-registered predictions and their outcomes, as the output tree records them.

    marin predictions                 every prediction under the prefix, with its outcome
    marin predictions stdlib-1e13     those whose step name matches (re.search)
    marin show predictions/stdlib-1e13   one of them (also on the target's and the report's page)

A prediction is the output of `operations.scaling_laws.write_prediction` (prediction.json,
written once). Its *target* is the training step that took it as an input
(`train_preregistered`, which recorded the prediction's digest in preregistration.json before
it trained) and its *report* the step that compared the two (`report_prediction`, report.json).
They are found through the dependencies the executor recorded, not through names.

What is checked here, again, on every read: prediction.json still matches its own digest (an
edit shows as "EDITED"); the target recorded that same digest when it started; the prediction
was written before the target's first RUNNING line. The tree is untrusted input: JSON only,
bounded reads, numbers type-checked; nothing named in it is imported or called.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Any

from marin.leaderboard import _json_object, name_regex
from marin.outputs import OutputTree, StepOutput, TreeFileError, finite_number

PREDICTION_FN = "operations.scaling_laws:write_prediction"
TARGET_FN = "operations.scaling_laws:train_preregistered"
REPORT_FN = "operations.scaling_laws:report_prediction"

PREDICTION_FILE = "prediction.json"
PREREGISTRATION_FILE = "preregistration.json"
REPORT_FILE = "report.json"
PLOT_FILE = "prediction.png"
MAX_FILE_BYTES = 1 << 20
"""The largest prediction.json, preregistration.json or report.json read (they are ~2-5 KB)."""


MAX_LABEL_CHARS = 200
"""A target label longer than this is cut where it is shown (`Prediction.label`)."""


@dataclass(frozen=True)
class Prediction:
    """One pre-registered prediction and, once there, the outcome it was compared with."""

    step: StepOutput
    """The prediction step's output."""

    problem: str | None
    """Why prediction.json could not be read (missing, not JSON, too large), else None."""

    target_label: str | None
    target_flops: float | None
    target_parameters: float | None
    predicted_loss: float | None
    interval: tuple[float, float] | None
    confidence: float | None
    created_at: str | None
    extrapolation: float | None
    """The target's FLOPs over the largest budget the fit used."""

    intact: bool | None
    """prediction.json matches its digest (None: not read)."""

    digest: str | None
    target: StepOutput | None
    """The training step that depends on this prediction (the most recent, if several)."""

    recorded_digest: str | None
    """The digest the target recorded before it trained (preregistration.json)."""

    training_started_at: str | None
    report: StepOutput | None
    actual_loss: float | None
    """From the report (report.json), else the target's stats.json final_eval_loss."""

    @property
    def inside(self) -> bool | None:
        if self.actual_loss is None or self.interval is None:
            return None
        return self.interval[0] <= self.actual_loss <= self.interval[1]

    @property
    def relative_error(self) -> float | None:
        if self.actual_loss is None or not self.predicted_loss:
            return None
        error = (self.actual_loss - self.predicted_loss) / self.predicted_loss
        # Finite losses near the float limit (untrusted) may still overflow to +-inf here.
        return error if math.isfinite(error) else None

    @property
    def preceded_training(self) -> bool | None:
        created, started = _time(self.created_at), _time(self.training_started_at)
        return None if created is None or started is None else created < started

    @property
    def preregistered(self) -> bool | None:
        """Intact, recorded by the target with the same digest, and written before it trained;
        None while there is no target run to check against."""
        if self.target is None or self.training_started_at is None:
            return None
        return bool(self.intact and self.recorded_digest == self.digest and self.preceded_training)

    @property
    def verdict(self) -> str:
        if self.problem:
            return "not read"
        if self.intact is False:
            return "EDITED"
        if self.actual_loss is None:
            return (
                "waiting for the target"
                if self.target is None or self.target.status != "SUCCESS"
                else "no loss"
            )
        if self.inside is None:
            return "no interval"
        return "inside" if self.inside else "outside"

    @property
    def label(self) -> str:
        """The target's label as shown (`marin predictions`, `marin show`, the browser): cut at
        `MAX_LABEL_CHARS`, saying how long it was (prediction.json may hold 1 MiB of it)."""
        text = self.target_label or "?"
        if len(text) <= MAX_LABEL_CHARS:
            return text
        return f"{text[:MAX_LABEL_CHARS]}\u2026 ({len(text):,} characters)"

    def as_json(self) -> dict[str, Any]:
        return {
            "prediction": self.step.path,
            "problem": self.problem,
            "target": self.target_label,
            "target_flops": self.target_flops,
            "target_parameters": self.target_parameters,
            "predicted_loss": self.predicted_loss,
            "interval": list(self.interval) if self.interval else None,
            "confidence": self.confidence,
            "created_at": self.created_at,
            "extrapolation": self.extrapolation,
            "intact": self.intact,
            "target_run": self.target.path if self.target else None,
            "target_status": self.target.status if self.target else None,
            "training_started_at": self.training_started_at,
            "report": self.report.path if self.report else None,
            "actual_loss": self.actual_loss,
            "relative_error": self.relative_error,
            "verdict": self.verdict,
            "preregistered": self.preregistered,
        }


def predictions(tree: OutputTree, pattern: str | None = None) -> list[Prediction]:
    """Every prediction under the prefix (step name matching `pattern`, re.search), by name."""
    regex = name_regex(pattern, "not a valid name pattern") if pattern else None
    steps = [
        step
        for step in tree.steps
        if _fn(step) == PREDICTION_FN and (regex is None or regex.search(step.name))
    ]
    dependents = _dependents_index(tree)  # once, not once per prediction
    return [load(tree, step, dependents) for step in sorted(steps, key=lambda s: (s.name, s.started or ""))]


def prediction_of(tree: OutputTree, step: StepOutput) -> Prediction | None:
    """The prediction a step is, or is the target or the report of; None for other steps."""
    fn = _fn(step)
    if fn == PREDICTION_FN:
        return load(tree, step)
    if fn in (TARGET_FN, REPORT_FN):
        for dep in step.dependencies:
            upstream = tree.by_path.get(str(dep.get("output_path")))
            if upstream is not None and _fn(upstream) == PREDICTION_FN:
                return load(tree, upstream)
    return None


def load(tree: OutputTree, step: StepOutput, dependents: _Dependents | None = None) -> Prediction:
    """Read one prediction step's record, find its target and report, and check them.
    `dependents`: `_dependents_index(tree)`, when many predictions of one tree are loaded."""
    problem = None
    try:
        record = _json_object(tree.read_record(f"{step.path}/{PREDICTION_FILE}", limit=MAX_FILE_BYTES))
        if record is None:
            problem = f"{PREDICTION_FILE} is missing or is not a JSON object"
    except TreeFileError as error:
        record, problem = None, str(error)
    record = record or {}
    target_info = _dict(record.get("target"))
    parameters = _dict(target_info.get("parameters"))
    counted = record.get("parameters_counted")
    interval = record.get("interval")
    digest = record.get("digest") if isinstance(record.get("digest"), str) else None
    target, report = _dependents(dependents if dependents is not None else _dependents_index(tree), step)
    prereg = _read(tree, target, PREREGISTRATION_FILE) if target else {}
    report_record = _read(tree, report, REPORT_FILE) if report else {}
    actual = finite_number(report_record.get("actual_loss"))
    if actual is None and target is not None and target.status == "SUCCESS":
        actual = finite_number(_read(tree, target, "stats.json").get("final_eval_loss"))
    started = [
        value
        for value in (prereg.get("training_started_at"), _first_running(target))
        if _time(value) is not None
    ]
    return Prediction(
        step=step,
        problem=problem,
        target_label=target_info.get("label") if isinstance(target_info.get("label"), str) else None,
        target_flops=finite_number(target_info.get("flops")),
        target_parameters=finite_number(record.get("target_parameters"))
        or (finite_number(parameters.get(counted)) if isinstance(counted, str) else None),
        predicted_loss=finite_number(record.get("predicted_loss")),
        interval=(
            (float(interval[0]), float(interval[1]))
            if isinstance(interval, list)
            and len(interval) == 2
            and all(finite_number(v) is not None for v in interval)
            else None
        ),
        confidence=finite_number(record.get("confidence")),
        created_at=record.get("created_at") if _time(record.get("created_at")) else None,
        extrapolation=finite_number(record.get("extrapolation")),
        intact=None if problem else (digest is not None and digest == _digest(record)),
        digest=digest,
        target=target,
        recorded_digest=prereg.get("prediction_digest")
        if isinstance(prereg.get("prediction_digest"), str)
        else None,
        training_started_at=min(started, key=_time) if started else None,
        report=report,
        actual_loss=actual,
    )


def describe(prediction: Prediction) -> list[str]:
    """Lines for `marin show` and `marin predictions`."""
    p = prediction
    if p.problem:
        return [f"prediction: not read ({p.problem})"]
    lines = [
        f"prediction:  {p.label}: final eval loss {_fmt(p.predicted_loss)}"
        + (
            f", {_percent(p.confidence)} interval [{_fmt(p.interval[0])}, {_fmt(p.interval[1])}]"
            if p.interval
            else ", no interval"
        )
        + (f"  ({p.extrapolation:.0f}x the largest budget fitted)" if p.extrapolation else ""),
        f"  written:   {p.created_at or '?'}"
        + ("" if p.intact else "  EDITED: prediction.json no longer matches its digest"),
    ]
    if p.target is None:
        lines.append("  target:    no training step depends on it yet")
    else:
        lines.append(f"  target:    {p.target.relpath} [{p.target.status}]")
    if p.actual_loss is not None:
        error = p.relative_error
        lines.append(
            f"  outcome:   {_fmt(p.actual_loss)} ({error:+.2%} from the prediction), {p.verdict} the interval"
            if error is not None and p.inside is not None
            else f"  outcome:   {_fmt(p.actual_loss)}, {p.verdict}"
        )
    if p.preregistered is not None:
        if p.preregistered:
            lines.append(
                f"  pre-registered: yes (written {p.created_at}, training started {p.training_started_at}, "
                "digest recorded by the target)"
            )
        else:
            lines.append(f"  pre-registered: NO ({'; '.join(_failed_checks(p))})")
    if p.report is not None:
        lines.append(f"  report:    {p.report.relpath} [{p.report.status}]")
    return lines


def _failed_checks(p: Prediction) -> list[str]:
    failed = []
    if not p.intact:
        failed.append("prediction.json was edited")
    if p.recorded_digest != p.digest:
        failed.append(
            "the target recorded another digest" if p.recorded_digest else "the target recorded no digest"
        )
    if p.preceded_training is False:
        failed.append("written after the target started training")
    elif p.preceded_training is None:
        failed.append("times not recorded")
    return failed or ["?"]


# -- reading ---------------------------------------------------------------------------------------


_Dependents = dict  # output path -> ([target steps], [report steps]) that list it as an input


def _dependents_index(tree: OutputTree) -> _Dependents:
    """Which target training and report steps list each output as an input: one pass over
    the tree's steps. (Scanning every step's inputs once per prediction made 200 predictions
    and one step of 60,000 inputs -- a 2.8 MB tree -- cost the predictions page 5 s of CPU.)"""
    index: _Dependents = {}
    for step in tree.steps:
        fn = _fn(step)
        if fn not in (TARGET_FN, REPORT_FN):
            continue
        for dep in step.dependencies:
            found = index.setdefault(str(dep.get("output_path")), ([], []))
            steps = found[0] if fn == TARGET_FN else found[1]
            if not steps or steps[-1] is not step:  # (a step listing the same input twice)
                steps.append(step)
    return index


def _dependents(index: _Dependents, prediction: StepOutput) -> tuple[StepOutput | None, StepOutput | None]:
    """The most recent target training step and report step that list `prediction` as an input."""
    targets, reports = index.get(prediction.path, ([], []))

    def latest(steps: list[StepOutput]) -> StepOutput | None:
        return max(steps, key=lambda s: (s.started or "", s.path)) if steps else None

    return latest(targets), latest(reports)


def _read(tree: OutputTree, step: StepOutput | None, name: str) -> dict[str, Any]:
    if step is None:
        return {}
    try:
        return _json_object(tree.read_record(f"{step.path}/{name}", limit=MAX_FILE_BYTES)) or {}
    except TreeFileError:
        return {}


def _first_running(step: StepOutput | None) -> str | None:
    if step is None:
        return None
    return next((event.date for event in step.history if event.status.value == "RUNNING"), None)


def _fn(step: StepOutput) -> Any:
    return (step.info or {}).get("fn_name")


def _digest(record: dict[str, Any]) -> str | None:
    """The record's digest as `write_prediction` computes it (its own function, so the two
    cannot drift); None if the record holds what JSON cannot hold canonically."""
    from operations.scaling_laws import digest_of

    try:
        return digest_of(record)
    except (ValueError, TypeError):
        return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _time(value: Any) -> datetime.datetime | None:
    from operations.scaling_laws import parse_time

    return parse_time(value)


def _fmt(value: float | None) -> str:
    return "?" if value is None else f"{value:.4f}"


def _percent(value: float | None) -> str:
    return "?" if value is None else f"{value:.0%}"
