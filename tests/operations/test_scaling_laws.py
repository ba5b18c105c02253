"""operations.scaling_laws: FLOP accounting against Levanter, the grid arithmetic, the fits on
synthetic laws with known exponents, the bootstrap, and the prediction written once.

The step functions run here on output trees written by the test (stats.json and
`.executor_info` as training steps write them), with losses from a known law; training for
real is in tests/integration/test_scaling_law.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import numpy as np
import pytest

from marin.models import MODELS, LlamaSpec
from operations import scaling_laws as sl
from operations.scaling_laws import (
    LearningRateRule,
    NotEnoughBudgets,
    PredictionConfig,
    PredictionReportConfig,
    PreregisteredTrainConfig,
    RunResult,
    ScalingFitConfig,
    ScalingRun,
    attention_flops_per_token,
    bootstrap_isoflops,
    budget_label,
    fit_budget,
    fit_isoflops,
    fit_parabola,
    flops_per_token,
    parameter_counts,
    percentile_interval,
    plan_cell,
    plan_isoflop_grid,
    report_prediction,
    train_preregistered,
    write_prediction,
)
from operations.train import SimpleTrainConfig

VOCAB = 4096


def shape(
    width: int, layers: int, heads: int | None = None, kv: int | None = None, seq: int = 128
) -> LlamaSpec:
    heads = heads or max(1, width // 32)
    return LlamaSpec(
        hidden_dim=width,
        intermediate_dim=2 * width,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv or heads,
        seq_len=seq,
    )


FAMILY = {f"d{w}l{n}": shape(w, n) for w, n in ((32, 2), (64, 2), (96, 3), (128, 4), (160, 5), (192, 6))}

# ---------------------------------------------------------------------------- FLOPs and parameters

SHAPES = [
    *MODELS.values(),
    shape(96, 3),
    shape(128, 4, heads=8, kv=2),  # grouped-query attention
    shape(64, 2, seq=512),
    dataclasses.replace(MODELS["llama_nano"], tie_word_embeddings=True),
]


@pytest.mark.parametrize(
    "model",
    SHAPES,
    ids=lambda m: f"d{m.hidden_dim}l{m.num_layers}h{m.num_heads}kv{m.num_kv_heads}s{m.seq_len}",
)
@pytest.mark.parametrize("vocab", [384, 4096, 32000, 128_256])
def test_flops_per_token_equal_levanters_count_for_training(model, vocab):
    # Levanter's flops_per_token is one forward pass; training is forward + backward = 3x.
    levanter = 3 * model.to_levanter().flops_per_token(vocab)
    assert flops_per_token(model, vocab) == pytest.approx(levanter, rel=1e-12)


def test_flops_per_token_follow_the_training_sequence_length():
    model = MODELS["llama_nano"]
    levanter = 3 * model.to_levanter(seq_len=512).flops_per_token(VOCAB)
    assert flops_per_token(model, VOCAB, seq_len=512) == pytest.approx(levanter, rel=1e-12)
    assert flops_per_token(model, VOCAB, seq_len=512) > flops_per_token(model, VOCAB)


@pytest.mark.parametrize(
    "model", SHAPES, ids=lambda m: f"d{m.hidden_dim}l{m.num_layers}kv{m.num_kv_heads}t{m.tie_word_embeddings}"
)
def test_parameter_counts_agree_with_llamaspec_and_levanter(model):
    counts = parameter_counts(model, VOCAB)
    assert counts["total"] == model.parameter_count(VOCAB)
    if not model.tie_word_embeddings:
        assert counts["total"] == model.to_levanter().total_trainable_params(VOCAB)
    # Compute parameters: the non-embedding weights less the norm gains, plus the output head.
    norms = model.num_layers * 2 * model.hidden_dim + model.hidden_dim
    assert counts["compute"] == counts["non_embedding"] - norms + VOCAB * model.hidden_dim


def test_llama_nano_counts_are_the_documented_ones():
    counts = parameter_counts(MODELS["llama_nano"], 32_000)
    assert counts["total"] == 4_178_240 and counts["non_embedding"] == 82_240


def test_flops_are_six_n_plus_attention():
    model = shape(128, 4)
    n = parameter_counts(model, VOCAB)["compute"]
    attention = 3 * 4 * (4 * 128 * 128 + 3 * 128 * 4)  # 3 L (4 s d + 3 s h)
    assert attention_flops_per_token(model) == attention
    assert flops_per_token(model, VOCAB) == 6 * n + attention


# ---------------------------------------------------------------------------- the grid


def test_a_cell_trains_the_budget_in_whole_steps():
    model = FAMILY["d64l2"]
    cell = plan_cell("x", "d64l2", model, 3e11, vocab_size=VOCAB, batch_size=8)
    per_step = flops_per_token(model, VOCAB) * 8 * 128
    assert cell.steps == round(3e11 / per_step)
    assert cell.tokens == cell.steps * 8 * 128
    assert cell.flops == cell.tokens * flops_per_token(model, VOCAB)
    assert abs(cell.flops - 3e11) <= per_step / 2
    assert plan_cell("y", "d64l2", model, per_step * 10.6, vocab_size=VOCAB, batch_size=8).steps == 11


def test_a_budget_under_one_step_still_trains_one():
    cell = plan_cell("x", "d64l2", FAMILY["d64l2"], 1.0, vocab_size=VOCAB, batch_size=8)
    assert cell.steps == 1


def test_the_learning_rate_rule_falls_with_width():
    rule = LearningRateRule(base=4e-3, base_width=64, width_exponent=1.0)
    assert rule(shape(64, 2)) == pytest.approx(4e-3)
    assert rule(shape(128, 2)) == pytest.approx(2e-3)
    assert LearningRateRule(base=4e-3, width_exponent=0.0)(shape(256, 2)) == pytest.approx(4e-3)
    assert LearningRateRule(base=4e-3, base_width=64, width_exponent=0.5)(shape(256, 2)) == pytest.approx(
        2e-3
    )


def test_the_grid_holds_every_model_at_every_budget_by_size():
    plan = plan_isoflop_grid([3e11, 1e11], FAMILY, vocab_size=VOCAB, batch_size=8, min_steps=1)
    assert [c.budget for c in plan.cells] == [1e11] * 6 + [3e11] * 6
    for budget in (1e11, 3e11):
        sizes = [c.parameters["compute"] for c in plan.cells if c.budget == budget]
        assert sizes == sorted(sizes)
    assert plan.cells[0].label == "1e11-d32l2" and plan.skipped == ()
    rule = LearningRateRule()
    assert all(c.learning_rate == pytest.approx(rule(c.model)) for c in plan.cells)


def test_the_grid_leaves_out_short_runs_and_says_why():
    plan = plan_isoflop_grid([3e11], FAMILY, vocab_size=VOCAB, batch_size=8, min_steps=60)
    kept = {c.model_name for c in plan.cells}
    assert all(c.steps >= 60 for c in plan.cells)
    assert {label for label, _ in plan.skipped} == {f"3e11-{name}" for name in FAMILY if name not in kept}
    assert all("< min_steps=60" in why for _, why in plan.skipped)


def test_the_grid_leaves_out_runs_longer_than_the_data():
    plan = plan_isoflop_grid([3e11], FAMILY, vocab_size=VOCAB, batch_size=8, min_steps=1, max_tokens=200_000)
    assert all(c.tokens <= 200_000 for c in plan.cells)
    assert any("max_tokens" in why for _, why in plan.skipped)


def test_the_grid_keeps_a_window_of_sizes_around_the_expected_optimum():
    plan = plan_isoflop_grid(
        [1e11, 1e12],
        FAMILY,
        vocab_size=VOCAB,
        batch_size=8,
        min_steps=1,
        sizes_per_budget=3,
        tokens_per_parameter=0.1,  # inside the family at both budgets, so the window can move
    )
    small = [c.model_name for c in plan.cells if c.budget == 1e11]
    large = [c.model_name for c in plan.cells if c.budget == 1e12]
    assert len(small) == len(large) == 3
    # The window moves to bigger models at the bigger budget.
    order = list(FAMILY)
    assert order.index(large[-1]) > order.index(small[-1])
    for budget, names in ((1e11, small), (1e12, large)):
        cells = {
            c.model_name: c
            for c in plan_isoflop_grid([budget], FAMILY, vocab_size=VOCAB, batch_size=8, min_steps=1).cells
        }
        distance = {
            name: abs(math.log(c.tokens / c.parameters["compute"]) - math.log(0.1))
            for name, c in cells.items()
        }
        assert max(distance[n] for n in names) <= min(distance[n] for n in cells if n not in names)


def test_a_budget_with_fewer_than_three_sizes_is_refused():
    with pytest.raises(ValueError, match=r"budget 1e\+11 keeps 1 model.*parabola needs 3"):
        plan_isoflop_grid([1e11], FAMILY, vocab_size=VOCAB, batch_size=8, min_steps=60)


def test_budget_labels_are_step_name_parts():
    assert budget_label(3e11) == "3e11"
    assert budget_label(1.5e12) == "1.5e12"
    assert budget_label(6.66e10) == "6.66e10"
    assert budget_label(500) == "500"
    with pytest.raises(ValueError):
        budget_label(0)


# ---------------------------------------------------------------------------- the fit


def model_form_runs(budgets, offsets, *, a=0.5, g=0.06, k_n=0.02, k_l=40.0, k=0.05, noise=0.0, seed=0):
    """Runs from the fit's own model: L = k_l C^-g + k (ln N - ln N*(C))^2, N*(C) = k_n C^a."""
    rng = np.random.default_rng(seed)
    runs = []
    for budget in budgets:
        n_star = k_n * budget**a
        for offset in offsets:
            n = n_star * math.exp(offset)
            loss = k_l * budget**-g + k * offset**2 + (rng.normal(0, noise) if noise else 0.0)
            runs.append(RunResult(f"{budget:g}-{offset:+.2f}", budget, budget, budget / (6 * n), n, loss))
    return runs


def test_a_parabola_vertex_is_found():
    x = np.linspace(-2, 3, 7)
    a, b, c = fit_parabola(x, 0.3 * (x - 0.7) ** 2 + 2.0)
    assert -b / (2 * a) == pytest.approx(0.7) and c - b * b / (4 * a) == pytest.approx(2.0)


def test_the_fit_recovers_the_exponents_of_its_own_model_exactly():
    budgets = [1e15, 1e16, 1e17, 1e18]
    fit = fit_isoflops(model_form_runs(budgets, np.linspace(-1.5, 1.0, 5)))
    assert fit.parameters.exponent == pytest.approx(0.5, abs=1e-9)
    assert fit.parameters.coefficient == pytest.approx(0.02, rel=1e-6)
    assert fit.tokens.exponent == pytest.approx(0.5, abs=1e-9)  # D = C / 6N
    assert fit.loss.exponent == pytest.approx(-0.06, abs=1e-9)
    assert fit.curvature == pytest.approx(0.05)
    # ... and predicts an off-optimum run at 10x the largest budget.
    c = 1e19
    n = 0.02 * c**0.5 * math.exp(0.8)
    assert fit.predict(n, c) == pytest.approx(40.0 * c**-0.06 + 0.05 * 0.8**2, rel=1e-9)


def test_the_fit_recovers_chinchilla_exponents():
    # L(N, D) = A / N^alpha + B / D^beta with D = C / 6N: N*(C) ~ C^(beta / (alpha + beta)) and
    # L*(C) ~ C^-(alpha beta / (alpha + beta)). Sizes at the same offsets from the optimum at
    # every budget: the parabola's bias is then the same factor at each, and the exponents exact.
    alpha, beta, A, B = 0.34, 0.28, 406.4, 410.7
    g = (alpha * A / (beta * B)) ** (1 / (alpha + beta))
    runs = []
    for budget in (1e18, 1e19, 1e20, 1e21):
        n_opt = g * (budget / 6) ** (beta / (alpha + beta))
        for offset in np.linspace(-1.0, 1.0, 7):
            n = n_opt * math.exp(offset)
            d = budget / (6 * n)
            runs.append(RunResult("", budget, budget, d, n, A / n**alpha + B / d**beta))
    fit = fit_isoflops(runs)
    assert fit.parameters.exponent == pytest.approx(beta / (alpha + beta), abs=1e-6)
    assert fit.tokens.exponent == pytest.approx(alpha / (alpha + beta), abs=1e-6)
    assert fit.loss.exponent == pytest.approx(-alpha * beta / (alpha + beta), abs=1e-6)
    assert fit.parameters(1e20) == pytest.approx(g * (1e20 / 6) ** (beta / (alpha + beta)), rel=0.05)


def test_a_budget_whose_minimum_is_not_bracketed_is_left_out():
    runs = model_form_runs([1e15, 1e16, 1e17], np.linspace(-1.0, 1.0, 5))
    shifted = model_form_runs([1e18], np.linspace(0.5, 2.0, 4))  # all sizes above the optimum
    fit = fit_isoflops(runs + shifted)
    last = fit.budgets[-1]
    assert not last.usable and not last.bracketed and "below the smallest size run" in last.why_not_used
    assert [b.usable for b in fit.budgets] == [True, True, True, False]
    assert fit.parameters.exponent == pytest.approx(0.5, abs=1e-9)  # from the three bracketed ones


def test_a_budget_without_a_minimum_or_with_too_few_sizes_is_left_out():
    runs = [RunResult("", 1e15, 1e15, 1.0, n, 3.0 - 0.1 * math.log(n)) for n in (1e3, 1e4, 1e5)]
    assert "does not curve up" in fit_budget(1e15, runs).why_not_used
    assert "2 distinct size(s)" in fit_budget(1e15, runs[:2] + runs[:1]).why_not_used


def test_fewer_than_two_usable_budgets_cannot_be_fitted():
    with pytest.raises(NotEnoughBudgets, match="1 budget"):
        fit_isoflops(model_form_runs([1e15], np.linspace(-1, 1, 5)))


def test_the_bootstrap_interval_covers_the_true_exponents():
    runs = model_form_runs([1e15, 1e16, 1e17, 1e18], np.linspace(-1.2, 1.2, 6), noise=0.004, seed=3)
    boot = bootstrap_isoflops(runs, samples=400, seed=0)
    assert len(boot.fits) > 300
    n_low, n_high = percentile_interval([f.parameters.exponent for f in boot.fits], 0.9)
    l_low, l_high = percentile_interval([f.loss.exponent for f in boot.fits], 0.9)
    assert n_low < 0.5 < n_high and n_high - n_low < 0.2
    assert l_low < -0.06 < l_high
    # Seeded: the same replicates again.
    again = bootstrap_isoflops(runs, samples=400, seed=0)
    assert [f.laws_json() for f in again.fits] == [f.laws_json() for f in boot.fits]


def test_with_three_sizes_per_budget_most_resamples_cannot_be_fitted():
    runs = model_form_runs([1e15, 1e16, 1e17], np.linspace(-1, 1, 3), noise=0.002)
    boot = bootstrap_isoflops(runs, samples=300, seed=0)
    assert len(boot.fits) < 100  # (2/9 of resamples keep 3 distinct sizes per budget)


def test_with_two_budgets_of_three_sizes_the_bootstrap_gives_no_interval():
    # Every usable resample is the runs themselves, reordered: the same fit up to rounding.
    runs = model_form_runs([1e15, 1e16], np.linspace(-1, 1, 3), noise=0.002)
    boot = bootstrap_isoflops(runs, samples=300, seed=0)
    assert len(boot.fits) > 5
    assert percentile_interval([f.loss.exponent for f in boot.fits], 0.9) is None
    assert percentile_interval([f.predict(1e6, 1e17) for f in boot.fits], 0.9) is None


def test_percentile_interval_needs_two_values_and_a_confidence_between_0_and_1():
    assert percentile_interval([1.0], 0.9) is None
    assert percentile_interval([2.5, 2.5, 2.5], 0.9) is None  # identical replicates: no interval
    assert percentile_interval(list(range(101)), 0.9) == pytest.approx((5.0, 95.0))
    with pytest.raises(ValueError):
        percentile_interval([1.0, 2.0], 1.0)


# ---------------------------------------------------------------------------- the steps on a tree

TRUE = {"a": 0.45, "g": 0.05, "k_n": 3.0, "k_l": 30.0, "k": 0.04}


def true_loss(n: float, flops: float) -> float:
    return (
        TRUE["k_l"] * flops ** -TRUE["g"] + TRUE["k"] * math.log(n / (TRUE["k_n"] * flops ** TRUE["a"])) ** 2
    )


def write_run_output(path: str, cell: sl.GridCell, loss: float, version_hash: str | None) -> None:
    os.makedirs(path, exist_ok=True)
    stats = {
        "final_eval_loss": loss,
        "final_train_loss": loss + 0.01,
        "num_train_steps": cell.steps,
        "parameter_count": cell.parameters["total"],
    }
    with open(os.path.join(path, "stats.json"), "w") as handle:
        json.dump(stats, handle)
    if version_hash is not None:
        with open(os.path.join(path, ".executor_info"), "w") as handle:
            json.dump({"version_hash": version_hash, "name": os.path.basename(path)}, handle)


@pytest.fixture
def grid_tree(tmp_path):
    """A finished 3-budget grid of 5 sizes each whose losses follow TRUE, and its fit config."""
    family = {
        f"d{w}l{n}": shape(w, n)
        for w, n in ((32, 1), (32, 2), (64, 2), (96, 2), (96, 3), (128, 4), (192, 4), (256, 6))
    }
    plan = plan_isoflop_grid(
        [1e11, 3e11, 1e12],
        family,
        vocab_size=VOCAB,
        batch_size=8,
        min_steps=1,
        sizes_per_budget=5,
        tokens_per_parameter=0.3,  # windows that bracket TRUE's optimum at every budget
    )
    runs = []
    for index, cell in enumerate(plan.cells):
        path = str(tmp_path / "runs" / cell.label)
        noise = 0.003 * math.sin(7 * index)  # small, deterministic
        write_run_output(
            path, cell, true_loss(cell.parameters["compute"], cell.flops) + noise, f"{index:064x}"
        )
        runs.append(ScalingRun(cell=cell, path=path))
    fit_path = str(tmp_path / "fit")
    config = ScalingFitConfig(runs=tuple(runs), output_path=fit_path, bootstrap_samples=200)
    return tmp_path, plan, config


def test_the_fit_step_writes_the_fit_the_bootstrap_plots_and_a_summary(grid_tree):
    _, plan, config = grid_tree
    sl.fit_scaling_law(config)
    with open(os.path.join(config.output_path, "fit.json")) as handle:
        fit = json.load(handle)
    assert fit["kind"] == "marin.scaling.fit" and fit["parameters"] == "compute"
    assert {"runs", "budgets", "laws", "bootstrap", "method", "loss_key"} <= set(fit)
    assert [run["label"] for run in fit["runs"]] == [cell.label for cell in plan.cells]
    assert fit["runs"][1]["version_hash"] == f"{1:064x}"
    assert all(b["used"] for b in fit["budgets"]) and len(fit["budgets"]) == 3
    assert fit["laws"]["parameters"]["exponent"] == pytest.approx(TRUE["a"], abs=0.05)
    assert fit["laws"]["loss"]["exponent"] == pytest.approx(-TRUE["g"], abs=0.01)
    assert fit["bootstrap"]["used"] > 100
    low, high = fit["bootstrap"]["exponent_intervals"]["parameters"]
    assert low < fit["laws"]["parameters"]["exponent"] < high
    with open(os.path.join(config.output_path, "bootstrap.json")) as handle:
        assert len(json.load(handle)["replicates"]) == fit["bootstrap"]["used"]
    for picture in ("isoflops.png", "frontier.png"):
        with open(os.path.join(config.output_path, picture), "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(os.path.join(config.output_path, "summary.md")) as handle:
        assert "N*(C) =" in handle.read()


def test_the_fit_refuses_a_vocabulary_that_is_not_the_runs(grid_tree):
    _, _, config = grid_tree
    wrong = dataclasses.replace(config.runs[0], cell=dataclasses.replace(config.runs[0].cell, vocab_size=512))
    with pytest.raises(ValueError, match="vocab_size=512"):
        sl.fit_scaling_law(dataclasses.replace(config, runs=(wrong, *config.runs[1:])))


def test_the_fit_names_a_run_that_did_not_finish(grid_tree):
    _, _, config = grid_tree
    os.remove(os.path.join(config.runs[2].path, "stats.json"))
    with pytest.raises(FileNotFoundError, match=config.runs[2].cell.label):
        sl.fit_scaling_law(config)


def target_of(plan, budget=1e13, name="d128l4"):
    model = shape(128, 4)
    return plan_cell(f"target-{name}", name, model, budget, vocab_size=VOCAB, batch_size=8)


@pytest.fixture
def predicted(grid_tree):
    tmp_path, plan, config = grid_tree
    sl.fit_scaling_law(config)
    prediction = PredictionConfig(
        fit_path=config.output_path, target=target_of(plan), output_path=str(tmp_path / "prediction")
    )
    write_prediction(prediction)
    return tmp_path, plan, config, prediction


def read(path):
    with open(path, "rb") as handle:
        return handle.read()


def test_the_prediction_records_the_loss_its_interval_and_every_hash(predicted):
    _, plan, config, prediction = predicted
    record = json.loads(read(os.path.join(prediction.output_path, "prediction.json")))
    assert record["digest"] == sl.digest_of(record)
    target = prediction.target
    expected = true_loss(target.parameters["compute"], target.flops)
    assert record["predicted_loss"] == pytest.approx(expected, rel=0.02)
    low, high = record["interval"]
    assert low <= record["predicted_loss"] <= high
    assert record["extrapolation"] == pytest.approx(target.flops / 1e12)
    assert [run["version_hash"] for run in record["runs"]] == [f"{i:064x}" for i in range(len(plan.cells))]
    assert record["fit"]["fit_json_sha256"] == sl.file_digest(os.path.join(config.output_path, "fit.json"))
    assert record["target"]["tokens"] == target.tokens and record["target"]["model_name"] == "d128l4"
    assert "Predicted final loss" in read(os.path.join(prediction.output_path, "summary.md")).decode()


def test_the_prediction_file_is_read_only(predicted):
    _, _, _, prediction = predicted
    path = os.path.join(prediction.output_path, "prediction.json")
    assert not os.stat(path).st_mode & 0o222


def test_running_the_prediction_again_keeps_the_file(predicted):
    _, _, _, prediction = predicted
    path = os.path.join(prediction.output_path, "prediction.json")
    before = read(path)
    write_prediction(prediction)
    assert read(path) == before


def test_a_prediction_for_other_inputs_is_refused_and_the_file_kept(predicted):
    _, plan, config, prediction = predicted
    path = os.path.join(prediction.output_path, "prediction.json")
    before = read(path)
    with pytest.raises(RuntimeError, match="never rewritten"):
        write_prediction(dataclasses.replace(prediction, target=target_of(plan, budget=2e13)))
    # The fit changed (re-run with other settings): refused too.
    sl.fit_scaling_law(dataclasses.replace(config, bootstrap_samples=50))
    with pytest.raises(RuntimeError, match="other inputs"):
        write_prediction(prediction)
    assert read(path) == before


def test_an_edited_prediction_is_refused(predicted):
    _, _, _, prediction = predicted
    path = os.path.join(prediction.output_path, "prediction.json")
    record = json.loads(read(path))
    record["predicted_loss"] += 0.5
    os.chmod(path, 0o644)
    with open(path, "w") as handle:
        json.dump(record, handle)
    with pytest.raises(RuntimeError, match="does not match its digest"):
        write_prediction(prediction)
    with pytest.raises(ValueError, match="edited"):
        sl.read_prediction(prediction.output_path)


def test_a_changed_run_invalidates_the_fit_for_predictions(grid_tree):
    tmp_path, plan, config = grid_tree
    sl.fit_scaling_law(config)
    write_run_output(config.runs[0].path, plan.cells[0], 5.0, "f" * 64)
    with pytest.raises(ValueError, match="re-run the fit"):
        write_prediction(PredictionConfig(config.output_path, target_of(plan), str(tmp_path / "p")))
    assert not os.path.exists(tmp_path / "p" / "prediction.json")


def target_train_config(prediction, output_path, steps=None):
    target = prediction.target
    return PreregisteredTrainConfig(
        tokenized_path="unused",
        tokenizer="unused",
        model=target.model,
        train=SimpleTrainConfig(
            train_batch_size=target.batch_size,
            num_train_steps=steps or target.steps,
            learning_rate=target.learning_rate,
        ),
        output_path=output_path,
        tracker="none",
        prediction_path=prediction.output_path,
    )


@pytest.fixture
def fake_training(monkeypatch):
    """operations.train.train replaced: records its config, writes a final loss to stats.json."""
    calls = []

    def fake_train(config):
        calls.append(config)
        with open(os.path.join(config.output_path, "stats.json"), "w") as handle:
            json.dump({"final_eval_loss": fake_train.loss}, handle)

    fake_train.loss = 3.0
    monkeypatch.setattr(sl, "train", fake_train)
    return fake_train, calls


def test_the_target_records_the_prediction_before_it_trains(predicted, fake_training, tmp_path):
    _, _, _, prediction = predicted
    fake, calls = fake_training
    output = str(tmp_path / "target")
    train_preregistered(target_train_config(prediction, output))
    (config,) = calls
    assert type(config) is sl.TrainConfig and config.output_path == output
    record = json.loads(read(os.path.join(output, "preregistration.json")))
    digest = json.loads(read(os.path.join(prediction.output_path, "prediction.json")))["digest"]
    assert record["prediction_digest"] == digest
    assert sl.parse_time(record["prediction_created_at"]) <= sl.parse_time(record["training_started_at"])


def test_the_target_refuses_a_prediction_for_another_run(predicted, fake_training, tmp_path):
    _, _, _, prediction = predicted
    _, calls = fake_training
    with pytest.raises(ValueError, match="the prediction at .* is for"):
        train_preregistered(target_train_config(prediction, str(tmp_path / "target"), steps=3))
    assert calls == []


def test_a_prediction_rewritten_after_the_target_started_fails_the_target_and_the_report(
    predicted, fake_training, tmp_path
):
    _, _, config, prediction = predicted
    _, calls = fake_training
    output = str(tmp_path / "target")
    train_preregistered(target_train_config(prediction, output))
    # Someone rewrites the prediction after the run started, digest and all.
    path = os.path.join(prediction.output_path, "prediction.json")
    record = json.loads(read(path))
    record["predicted_loss"] = 3.0
    record["digest"] = sl.digest_of(record)
    os.chmod(path, 0o644)
    with open(path, "w") as handle:
        json.dump(record, handle)
    with pytest.raises(ValueError, match="changed after this run started"):
        train_preregistered(target_train_config(prediction, output))  # a resumed attempt
    assert len(calls) == 1
    report = PredictionReportConfig(
        prediction.output_path, output, config.output_path, str(tmp_path / "report")
    )
    report_prediction(report)
    checks = json.loads(read(str(tmp_path / "report" / "report.json")))["checks"]
    assert checks["prediction_intact"] is True  # (the forger fixed the digest) ...
    assert checks["digest_matches_target_record"] is False  # ... but not the target's record of it
    assert checks["preregistered"] is False


@pytest.mark.parametrize("offset, verdict", [(0.0, "inside"), (1.0, "outside")])
def test_the_report_says_whether_the_outcome_is_inside_the_interval(
    predicted, fake_training, tmp_path, offset, verdict
):
    _, _, config, prediction = predicted
    fake, _ = fake_training
    record = json.loads(read(os.path.join(prediction.output_path, "prediction.json")))
    fake.loss = record["predicted_loss"] + offset
    output = str(tmp_path / "target")
    train_preregistered(target_train_config(prediction, output))
    report_path = str(tmp_path / "report")
    report_prediction(PredictionReportConfig(prediction.output_path, output, config.output_path, report_path))
    report = json.loads(read(os.path.join(report_path, "report.json")))
    assert report["verdict"] == verdict and report["inside_interval"] is (verdict == "inside")
    assert report["error"] == pytest.approx(offset)
    assert report["checks"]["preregistered"] is True
    assert read(os.path.join(report_path, "prediction.png"))[:4] == b"\x89PNG"
    summary = read(os.path.join(report_path, "summary.md")).decode()
    assert ("inside the interval" if verdict == "inside" else "OUTSIDE the interval") in summary


def test_the_report_flags_a_prediction_written_after_training_started(predicted, fake_training, tmp_path):
    _, _, config, prediction = predicted
    output = str(tmp_path / "target")
    train_preregistered(target_train_config(prediction, output))
    record_path = os.path.join(output, "preregistration.json")
    record = json.loads(read(record_path))
    record["training_started_at"] = "2000-01-01T00:00:00.000Z"
    with open(record_path, "w") as handle:
        json.dump(record, handle)
    report_prediction(
        PredictionReportConfig(prediction.output_path, output, config.output_path, str(tmp_path / "r"))
    )
    checks = json.loads(read(str(tmp_path / "r" / "report.json")))["checks"]
    assert checks["prediction_preceded_training"] is False and checks["preregistered"] is False


def test_write_once_never_replaces_a_file(tmp_path):
    path = str(tmp_path / "sub" / "once.json")
    sl.write_once(path, b"first")
    with pytest.raises(FileExistsError):
        sl.write_once(path, b"second")
    assert read(path) == b"first"
    assert not os.stat(path).st_mode & 0o222
    assert os.listdir(tmp_path / "sub") == ["once.json"]  # no temporary file left behind


def test_a_prediction_that_appears_while_the_step_runs_is_not_replaced(grid_tree, monkeypatch):
    # Two drivers racing: the other one's file lands between our check and our write.
    tmp_path, plan, config = grid_tree
    sl.fit_scaling_law(config)
    out = tmp_path / "p"
    real = sl.read_json_object

    def first_sees_nothing(path, what):
        if path.endswith("prediction.json") and not out.joinpath("prediction.json").exists():
            out.mkdir(exist_ok=True)
            out.joinpath("prediction.json").write_text('{"theirs": true}')
            return None
        return real(path, what)

    monkeypatch.setattr(sl, "read_json_object", first_sees_nothing)
    with pytest.raises(RuntimeError, match="appeared while this step ran"):
        write_prediction(PredictionConfig(config.output_path, target_of(plan), str(out)))
    assert json.loads(out.joinpath("prediction.json").read_text()) == {"theirs": True}


def test_version_hashes_are_read_defensively(tmp_path):
    assert sl.version_hash_of(str(tmp_path)) is None
    (tmp_path / ".executor_info").write_text("[1, 2]")
    assert sl.version_hash_of(str(tmp_path)) is None
    (tmp_path / ".executor_info").write_text(json.dumps({"version_hash": "../../etc"}))
    assert sl.version_hash_of(str(tmp_path)) is None
    (tmp_path / ".executor_info").write_text(json.dumps({"version_hash": "a" * 64}))
    assert sl.version_hash_of(str(tmp_path)) == "a" * 64


def test_the_first_running_date_skips_lines_it_cannot_read(tmp_path):
    lines = [
        "not json",
        json.dumps({"status": "RUNNING", "date": "yesterday"}),
        json.dumps({"status": "RUNNING", "date": "2026-11-23T14:10:31.687Z"}),
    ]
    (tmp_path / ".executor_status").write_text("\n".join(lines) + "\n")
    assert sl.first_running_date(str(tmp_path)) == "2026-11-23T14:10:31.687Z"


@pytest.mark.parametrize("path", ["memory://elsewhere/run", "s3://other-bucket/run", "{fit}/../../../etc"])
def test_a_run_path_in_fit_json_off_the_fits_storage_is_not_read(grid_tree, path):
    """fit.json is a file of the tree (untrusted): a run path on another storage, or climbing out
    with '..', is refused before anything is opened there."""
    tmp_path, plan, config = grid_tree
    sl.fit_scaling_law(config)
    fit_file = os.path.join(config.output_path, "fit.json")
    with open(fit_file) as handle:
        record = json.load(handle)
    record["runs"][0]["path"] = path.format(fit=config.output_path)
    with open(fit_file, "w") as handle:
        json.dump(record, handle)
    with pytest.raises(ValueError, match="is not on the fit's storage"):
        write_prediction(PredictionConfig(config.output_path, target_of(plan), str(tmp_path / "p")))
    assert not os.path.exists(tmp_path / "p" / "prediction.json")
