"""Hello world: the smallest experiment -- generate numbers, then compute their statistics.

    python experiments/tutorials/hello_world.py                 # writes under ./marin-output
    python experiments/tutorials/hello_world.py --dry_run true  # shows the plan only

Run it twice: the second run skips both steps. Change `n` below and only the steps
whose version changed run again (the plan says why their hash differs).
"""

import json
import os
import random
from dataclasses import dataclass

from executor import ExecutorStep, executor_main, output_path_of, this_output_path, versioned


@dataclass(frozen=True)
class GenerateConfig:
    n: int
    """How many numbers to generate (versioned: changing it changes the output)."""

    seed: int
    """Random seed (versioned)."""

    output_path: str
    """Directory to write `numbers.json` into (filled in by the executor)."""


def generate_numbers(config: GenerateConfig) -> None:
    rng = random.Random(config.seed)
    numbers = [rng.randint(0, 1000) for _ in range(config.n)]
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "numbers.json"), "w") as handle:
        json.dump(numbers, handle)
    print(f"generated {len(numbers)} numbers")


@dataclass(frozen=True)
class StatsConfig:
    input_path: str
    """Directory holding `numbers.json` (an upstream step's output)."""

    output_path: str
    """Directory to write `stats.json` into."""


def compute_stats(config: StatsConfig) -> None:
    with open(os.path.join(config.input_path, "numbers.json")) as handle:
        numbers = json.load(handle)
    stats = {
        "count": len(numbers),
        "min": min(numbers),
        "max": max(numbers),
        "mean": sum(numbers) / len(numbers),
    }
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "stats.json"), "w") as handle:
        json.dump(stats, handle, indent=2)
    print(f"stats: {stats}")


numbers = ExecutorStep(
    name="hello_world/numbers",
    fn=generate_numbers,
    config=GenerateConfig(n=versioned(100), seed=versioned(0), output_path=this_output_path()),
    description="Generate random integers.",
)

stats = ExecutorStep(
    name="hello_world/stats",
    fn=compute_stats,
    config=StatsConfig(input_path=output_path_of(numbers), output_path=this_output_path()),
    description="Count, min, max and mean of the numbers.",
)

if __name__ == "__main__":
    executor_main(steps=[stats], description="Hello world: generate numbers and compute their statistics.")
