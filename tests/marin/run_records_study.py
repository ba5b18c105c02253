"""A tiny study whose step declares records of its run (a log file, a timing field), for the
`marin reproduce` tests: its function lives at module level, so the tree records it as
importable `tests.marin.run_records_study:fit`."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from executor import ExecutorStep, this_output_path, versioned
from executor.run_records import run_records


@dataclass(frozen=True)
class FitConfig:
    output_path: str
    rate: float = 0.5
    """Shapes the (deterministic) loss curve."""

    drift: bool = False
    """Also write a loss that differs on every run (what reproduce must still catch)."""


@run_records(
    "logs/**", "attempts.json", fields={"stats.json": ["seconds", "runs.host"], "*.jsonl": ["time/*"]}
)
def fit(config: FitConfig) -> None:
    started = time.time_ns()
    os.makedirs(os.path.join(config.output_path, "logs"), exist_ok=True)
    with open(os.path.join(config.output_path, "logs", f"fit-{started}.log"), "w") as handle:
        handle.write(f"started at {started}\n")
    with open(os.path.join(config.output_path, "attempts.json"), "w") as handle:
        json.dump([{"seconds": started % 1000}], handle)
    with open(os.path.join(config.output_path, "metrics.jsonl"), "w") as handle:
        for step in range(5):
            loss = round(4.0 / (1 + config.rate * step), 6) + (started % 97 if config.drift else 0)
            handle.write(json.dumps({"step": step, "loss": loss, "time/step_s": (started % 13) / 10}) + "\n")
    with open(os.path.join(config.output_path, "stats.json"), "w") as handle:
        json.dump(
            {"final_loss": loss, "seconds": started % 7, "runs": [{"host": str(started), "ok": True}]}, handle
        )
    with open(os.path.join(config.output_path, "weights.bin"), "wb") as handle:
        handle.write(bytes(range(256)) * 4)


def fit_step(drift: bool = False) -> ExecutorStep:
    return ExecutorStep(
        name="checkpoints/fit", fn=fit, config=FitConfig(this_output_path(), drift=versioned(drift))
    )
