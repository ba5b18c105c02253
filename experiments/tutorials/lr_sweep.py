"""Learning-rate sweep (a learning-rate finder): three tiny Llamas sharing one tokenized
dataset, a results table, a loss-curve picture, and the learning rate it picks, with why.

    python experiments/tutorials/lr_sweep.py           # data once, three trainings, three evals
    python experiments/tutorials/lr_sweep.py           # again: everything cached

The data steps are shared (built once), each learning rate gets its own training and eval
step, and a final `analysis/lr-sweep` step writes `results.md` (the table and the choice, also printed),
`loss_curves.png` (train and eval loss of the three runs) and `choice.json` (the learning
rate with the lowest held-out loss, the ranking, and a warning when the best is at the edge
of the sweep, where a wider sweep may find better) under its output path. The runs train on
equal tokens, so `marin leaderboard lr_sweep` ranks them too.
"""

import io
import json
from dataclasses import dataclass

from executor import ExecutorStep, executor_main, this_output_path, versioned
from experiments.tutorials.stdlib_data import build_steps
from marin.defaults import default_eval, default_train
from marin.models import MODELS, SimpleTrainConfig

LEARNING_RATES = (1e-3, 3e-3, 1e-2)


@dataclass(frozen=True)
class SweepReportConfig:
    labels: tuple[str, ...]
    """One label per run (e.g. "lr=0.003"), in the order of the paths below."""

    train_paths: list
    """Output paths of the training steps (metrics.jsonl inside)."""

    eval_paths: list
    """Output paths of the eval steps (results.json inside)."""

    output_path: str
    """Where results.md, loss_curves.png and choice.json go."""

    learning_rates: tuple[float, ...] = ()
    """The learning rate of each run (the labels say the same; not versioned)."""


def report_sweep(config: SweepReportConfig) -> None:
    """Write the results table and the loss-curve picture of a sweep."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    from operations.shards import atomic_output, join, read_json
    from operations.train import read_metrics

    rows = ["| run | final train loss | eval loss | bits per byte |", "|---|---|---|---|"]
    eval_losses = []
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for label, train_path, eval_path in zip(
        config.labels, config.train_paths, config.eval_paths, strict=True
    ):
        metrics = read_metrics(train_path)
        train = [(m["step"], m["train/loss"]) for m in metrics if "train/loss" in m]
        evals = [(m["step"], m["eval/loss"]) for m in metrics if "eval/loss" in m]
        line = axis.plot(*zip(*train, strict=True), label=f"{label} train", linewidth=1.2)[0]
        if evals:
            axis.plot(*zip(*evals, strict=True), "o--", color=line.get_color(), label=f"{label} eval")
        results = read_json(join(eval_path, "results.json"))
        if results is None:
            raise FileNotFoundError(f"{eval_path}/results.json: the eval step wrote no results")
        domain = next(iter(results["domains"].values()))
        eval_losses.append(domain["loss"])
        rows.append(f"| {label} | {train[-1][1]:.3f} | {domain['loss']:.3f} | {domain['bpb']:.3f} |")
    axis.set_xlabel("step")
    axis.set_ylabel("loss (nats/token)")
    axis.set_title("Learning-rate sweep: llama_nano on the Python stdlib")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    # Through a buffer: the output path may be a bucket (s3://, gs://), where files appear whole.
    picture = io.BytesIO()
    figure.savefig(picture, format="png", dpi=120)
    plt.close(figure)
    with atomic_output(join(config.output_path, "loss_curves.png")) as handle:
        handle.write(picture.getvalue())
    choice = choose_learning_rate(config.labels, config.learning_rates, eval_losses)
    with atomic_output(join(config.output_path, "choice.json")) as handle:
        handle.write(json.dumps(choice, indent=2).encode("utf-8"))
    table = "\n".join(rows) + f"\n\n**Choice:** {choice['why']}\n"
    with atomic_output(join(config.output_path, "results.md")) as handle:
        handle.write(table.encode("utf-8"))
    print(table)


def choose_learning_rate(labels, learning_rates, eval_losses) -> dict:
    """The run with the lowest held-out loss (equal tokens for all), the ranking, and why."""
    order = sorted(range(len(labels)), key=lambda i: eval_losses[i])
    best = order[0]
    why = f"{labels[best]} has the lowest held-out loss ({eval_losses[best]:.4f})"
    if len(order) > 1:
        runner_up = order[1]
        why += f", {eval_losses[runner_up] - eval_losses[best]:.4f} below {labels[runner_up]}"
    edge = None
    if len(learning_rates) == len(labels) and len(labels) > 2:
        by_rate = sorted(range(len(labels)), key=lambda i: learning_rates[i])
        if best in (by_rate[0], by_rate[-1]):
            edge = "lowest" if best == by_rate[0] else "highest"
            why += f"; it is the {edge} rate swept, so a wider sweep may find a better one"
    return {
        "chosen": labels[best],
        "learning_rate": learning_rates[best] if len(learning_rates) == len(labels) else None,
        "eval_loss": eval_losses[best],
        "ranking": [{"run": labels[i], "eval_loss": eval_losses[i]} for i in order],
        "at_edge_of_sweep": edge,
        "why": why,
    }


def sweep_steps(learning_rates=LEARNING_RATES, max_files=None, steps=100, vocab_size=4096):
    *_, tokenized = build_steps(max_files, vocab_size=vocab_size)
    trains, evals, labels = [], [], []
    for lr in learning_rates:
        train_config = SimpleTrainConfig(
            train_batch_size=8,
            num_train_steps=steps,
            learning_rate=lr,
            steps_per_eval=max(steps // 5, 1),
            max_eval_batches=8,
            steps_per_checkpoint=steps,
        )
        trained = default_train(f"lr-sweep/nano-lr{lr:g}", tokenized, MODELS["llama_nano"], train_config)
        trains.append(trained)
        evals.append(
            default_eval(f"lr-sweep/nano-lr{lr:g}", trained, {"stdlib": tokenized}, max_eval_batches=8)
        )
        labels.append(f"lr={lr:g}")
    report = ExecutorStep(
        name="analysis/lr-sweep",
        fn=report_sweep,
        config=SweepReportConfig(
            labels=versioned(tuple(labels)),
            train_paths=trains,
            eval_paths=evals,
            output_path=this_output_path(),
            learning_rates=versioned(tuple(learning_rates)),  # new output (choice.json): new version
        ),
        description="Results table, loss curves and the chosen learning rate of the sweep",
    )
    return [*trains, *evals, report]


if __name__ == "__main__":
    import fsspec

    steps = sweep_steps()
    executor = executor_main(steps=steps, description="Learning-rate sweep of a tiny Llama")
    report = executor.output_paths[steps[-1]]
    fs, path = fsspec.core.url_to_fs(f"{report}/results.md")  # local or a bucket
    if fs.exists(path):
        print(fs.cat_file(path).decode("utf-8"))
        print(f"Loss curves: {report}/loss_curves.png")
