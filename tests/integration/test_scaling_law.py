"""The scaling-law tutorial end to end, reduced: real tiny Llamas trained by Levanter on an
isoflop grid, the fit, a pre-registered prediction, the target run and the report; then a
re-run (all cached) and a forced re-run of the prediction (the file unchanged)."""

import json
import os

import pytest

from executor import Executor
from executor.events import StepStarted
from experiments.tutorials.scaling_law import all_steps, scaling_steps
from marin.outputs import OutputTree
from marin.predictions import predictions
from operations.scaling_laws import parse_time

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PNG = b"\x89PNG\r\n\x1a\n"


def reduced():
    """Two budgets of four sizes on 400 files, and a target at twice the larger budget: nine short
    trainings. (Three sizes would do for the fit, but not for the bootstrap: every usable resample
    would be the runs themselves.) These budgets are about the smallest at which these sizes still
    show a minimum (at 1e10 every size is near the unigram loss)."""
    return scaling_steps(
        budgets=(2e10, 6e10),
        target_budget=1.2e11,
        target_model="d16l1",
        sizes_per_budget=4,
        tokens_per_parameter=80.0,
        max_files=400,
        bootstrap_samples=200,
        max_eval_batches=4,
    )


def load(path):
    with open(path) as handle:
        return json.load(handle)


def read_bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


def test_the_scaling_law_tutorial_predicts_before_training_and_reports(tmp_path):
    steps = reduced()
    executor = Executor(str(tmp_path), console=False)
    executor.run(all_steps(steps))
    out = {role: executor.output_paths[steps[role]] for role in ("fit", "prediction", "target", "report")}

    # The grid: every run trained for its budget, on the one tokenized dataset.
    names = [step.name for step in executor.graph.steps]
    assert sum(name.startswith("tokenized/") for name in names) == 1
    assert len(steps["grid"]) == 8
    fit = load(os.path.join(out["fit"], "fit.json"))
    for step, run in zip(steps["grid"], fit["runs"], strict=True):
        stats = load(os.path.join(executor.output_paths[step], "stats.json"))
        assert stats["num_train_steps"] == run["steps"] and run["tokens"] == run["steps"] * 8 * 128
        assert abs(run["flops"] - run["budget"]) <= run["flops_per_token"] * 8 * 128 / 2
        assert stats["final_eval_loss"] == run["loss"]

    # The fit: exponents, per-budget minima, the hash of every run, two plots.
    for law in ("parameters", "tokens", "loss"):
        assert isinstance(fit["laws"][law]["exponent"], float)
    assert len(fit["runs"]) == 8 and all(len(run["version_hash"]) == 64 for run in fit["runs"])
    for step, run in zip(steps["grid"], fit["runs"], strict=True):
        assert executor.output_paths[step].endswith("-" + run["version_hash"][:8])
    for picture in ("isoflops.png", "frontier.png"):
        assert read_bytes(os.path.join(out["fit"], picture))[:8] == PNG

    # The prediction: made from that fit, before the target's training started.
    prediction_file = os.path.join(out["prediction"], "prediction.json")
    prediction = load(prediction_file)
    assert out["fit"].endswith("-" + prediction["fit"]["version_hash"][:8])
    low, high = prediction["interval"]
    assert low < high
    assert prediction["extrapolation"] == pytest.approx(2.0, rel=0.05)
    assert prediction["target"]["model_name"] == "d16l1"
    prereg = load(os.path.join(out["target"], "preregistration.json"))
    assert prereg["prediction_digest"] == prediction["digest"]
    assert parse_time(prediction["created_at"]) < parse_time(prereg["training_started_at"])

    # The report: the verdict, the checks, the picture.
    report = load(os.path.join(out["report"], "report.json"))
    target_stats = load(os.path.join(out["target"], "stats.json"))
    assert report["actual_loss"] == target_stats["final_eval_loss"]
    assert report["predicted_loss"] == prediction["predicted_loss"]
    assert report["verdict"] in ("inside", "outside")
    assert report["checks"]["preregistered"] is True
    assert read_bytes(os.path.join(out["report"], "prediction.png"))[:8] == PNG

    # What `marin predictions` (and `marin show`, the browser) read back from the tree agrees.
    (listed,) = predictions(OutputTree(str(tmp_path)))
    assert (listed.step.path, listed.target.path, listed.report.path) == (
        out["prediction"],
        out["target"],
        out["report"],
    )
    assert (listed.predicted_loss, listed.actual_loss) == (report["predicted_loss"], report["actual_loss"])
    assert (listed.verdict, listed.preregistered, listed.intact) == (report["verdict"], True, True)

    # Again: everything cached.
    before = read_bytes(prediction_file)
    again = Executor(str(tmp_path), console=False)
    again.run(all_steps(reduced()))
    assert not [event for event in again.events if isinstance(event, StepStarted)]

    # Forced: the prediction step runs again (its status lost) and leaves the file as it was;
    # the target, whose inputs did not change, stays done.
    os.remove(os.path.join(out["prediction"], ".executor_status"))
    forced = Executor(str(tmp_path), console=False)
    forced.run(all_steps(reduced()))
    started = [event.name for event in forced.events if isinstance(event, StepStarted)]
    assert started == [steps["prediction"].name]
    assert read_bytes(prediction_file) == before
