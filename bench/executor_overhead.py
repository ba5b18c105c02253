"""Executor overhead on large DAGs: build+hash, dry-run plan, cold run, warm re-run, floor.

    .venv/bin/python bench/executor_overhead.py                       # 1,000 and 10,000 steps
    .venv/bin/python bench/executor_overhead.py --sizes 1000 --out /tmp/bench-results

Two DAG shapes, each at every size N:

- chain:  step i takes step i-1's output as its input (N steps, depth N);
- fan-in: N-1 independent leaves, each with a versioned field, and one final step whose
  config holds a list of all N-1 leaf outputs as inputs.

Step functions are trivial (each writes one tiny file under its output path), so every
figure is executor overhead. Measurements (median of --repeats runs unless noted):

- build+hash: construct the ExecutorStep objects and `executor.graph.resolve` them, in-process;
- plan (dry run): `Executor(prefix, console=False).run(steps, dry_run=True)` on an empty prefix;
- cold run: `Executor(prefix, console=False).run(steps)` on a fresh local prefix (once for
  sizes >= --cold-once-from; progress goes to stderr);
- warm re-run: in a fresh process, build the steps and `Executor(...).run(steps)` when every
  step has already succeeded; timed inside that process from before building the steps to
  the end of `run` (interpreter start-up and imports excluded; the import of `executor` is
  reported separately);
- floor: in a fresh process, build and resolve the steps, then read each step's
  `.executor_status` once in a plain sequential loop -- the least any warm re-run must do.

Targets: 10,000 steps built and hashed in < 1 s; warm re-run of 1,000 steps <= 1.5x the floor.
The last lines are machine-readable: `warm_vs_floor_1000=R` and `build_hash_10000_s=S` (the
worse of the two shapes). Temporary prefixes are deleted on exit.

To profile one measurement, run a child mode directly under cProfile, e.g. after a cold run
left outputs under PREFIX (`--keep` keeps them):

    .venv/bin/python -m cProfile -s cumulative bench/executor_overhead.py \\
        --child warm --shape chain --size 1000 --prefix PREFIX
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_T_IMPORT = time.perf_counter()
from executor import Executor, ExecutorStep, output_path_of, this_output_path, versioned  # noqa: E402
from executor.events import StepFailed, StepSkipped, StepSucceeded  # noqa: E402
from executor.graph import resolve  # noqa: E402
from executor.plan import Action  # noqa: E402

IMPORT_EXECUTOR_S = time.perf_counter() - _T_IMPORT

SHAPES = ("chain", "fanin")
BUILD_HASH_TARGET_S = 1.0
"""10,000 steps built and hashed in under this many seconds."""
WARM_VS_FLOOR_TARGET = 1.5
"""Warm re-run of 1,000 steps at most this many times the floor."""


# -- the DAGs ------------------------------------------------------------------


@dataclass(frozen=True)
class ChainConfig:
    index: int
    """Position in the chain (versioned)."""

    input_path: str | None
    """The previous step's output (None for the first step)."""

    output_path: str


@dataclass(frozen=True)
class LeafConfig:
    index: int
    """Which leaf (versioned, so every leaf has its own version)."""

    output_path: str


@dataclass(frozen=True)
class FanInConfig:
    inputs: list[str]
    """The outputs of every leaf."""

    output_path: str


def write_marker(config: Any) -> None:
    """The trivial step function: one tiny file under the step's output path."""
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "done"), "w") as handle:
        handle.write("ok\n")


def build_chain(size: int) -> list[ExecutorStep]:
    steps: list[ExecutorStep] = []
    previous = None
    for i in range(size):
        step = ExecutorStep(
            name=f"chain/step-{i:05d}",
            fn=write_marker,
            config=ChainConfig(
                index=versioned(i),
                input_path=None if previous is None else output_path_of(previous),
                output_path=this_output_path(),
            ),
        )
        steps.append(step)
        previous = step
    return steps


def build_fanin(size: int) -> list[ExecutorStep]:
    leaves = [
        ExecutorStep(
            name=f"fanin/leaf-{i:05d}",
            fn=write_marker,
            config=LeafConfig(index=versioned(i), output_path=this_output_path()),
        )
        for i in range(size - 1)
    ]
    final = ExecutorStep(
        name="fanin/final",
        fn=write_marker,
        config=FanInConfig(inputs=[output_path_of(leaf) for leaf in leaves], output_path=this_output_path()),
    )
    return [*leaves, final]


BUILDERS: dict[str, Callable[[int], list[ExecutorStep]]] = {"chain": build_chain, "fanin": build_fanin}


def build_steps(shape: str, size: int) -> list[ExecutorStep]:
    """Every step of the DAG (passing only the sink would do; passing all is what scripts do)."""
    return BUILDERS[shape](size)


# -- child processes (warm re-run, floor) ----------------------------------------


def child_warm(shape: str, size: int, prefix: str) -> dict[str, Any]:
    start = time.perf_counter()
    steps = build_steps(shape, size)
    built = time.perf_counter()
    plan = Executor(prefix, console=False).run(steps)
    end = time.perf_counter()
    actions = {row.action for row in plan.rows}
    if actions != {Action.SKIP} or len(plan.rows) != size:
        raise SystemExit(f"warm re-run was not all skips: {len(plan.rows)} rows, actions {actions}")
    return {"seconds": end - start, "build_s": built - start, "import_s": IMPORT_EXECUTOR_S}


def child_floor(shape: str, size: int, prefix: str) -> dict[str, Any]:
    start = time.perf_counter()
    steps = build_steps(shape, size)
    graph = resolve(steps, prefix)
    texts = []
    for step in graph.steps:
        with open(f"{step.output_path}/.executor_status") as handle:
            texts.append(handle.read())
    end = time.perf_counter()
    done = sum('"SUCCESS"' in text.splitlines()[-1] for text in texts)
    if done != size:
        raise SystemExit(f"floor: only {done} of {size} steps have succeeded under {prefix}")
    return {"seconds": end - start, "import_s": IMPORT_EXECUTOR_S}


CHILDREN = {"warm": child_warm, "floor": child_floor}


def run_child(mode: str, shape: str, size: int, prefix: str) -> dict[str, Any]:
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        mode,
        "--shape",
        shape,
        "--size",
        str(size),
        "--prefix",
        prefix,
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{mode} child failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- the parent ------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Progress:
    """Executor listener: a line on stderr every tenth of the steps."""

    def __init__(self, label: str, total: int):
        self.label = label
        self.total = total
        self.every = max(1, total // 10)
        self.done = 0
        self.start = time.perf_counter()

    def __call__(self, event: Any) -> None:
        if isinstance(event, (StepSucceeded, StepSkipped, StepFailed)):
            self.done += 1
            if self.done % self.every == 0 or self.done == self.total:
                elapsed = time.perf_counter() - self.start
                log(f"  {self.label}: {self.done}/{self.total} steps finished, {elapsed:.1f}s")


@dataclass
class Row:
    shape: str
    size: int
    build_hash: list[float]
    plan: list[float]
    cold: list[float]
    warm: list[float]
    floor: list[float]
    warm_import: list[float]

    @property
    def ratio(self) -> float:
        return median(self.warm) / median(self.floor)


def median(values: list[float]) -> float:
    return statistics.median(values)


def new_prefix(tmp_root: str | None, label: str, made: list[str]) -> str:
    path = tempfile.mkdtemp(prefix=f"executor-bench-{label}-", dir=tmp_root)
    made.append(path)
    return path


def remove(path: str, made: list[str]) -> None:
    shutil.rmtree(path, ignore_errors=True)
    if path in made:
        made.remove(path)


def measure(shape: str, size: int, args: argparse.Namespace, made: list[str]) -> Row:
    label = f"{shape} x {size}"
    repeats = args.repeats

    build_hash = []
    for _ in range(repeats):
        start = time.perf_counter()
        steps = build_steps(shape, size)
        resolve(steps, "/nonexistent/executor-bench")
        build_hash.append(time.perf_counter() - start)
    log(f"{label}: build+hash {fmt_list(build_hash)}")

    steps = build_steps(shape, size)
    plan = []
    empty = new_prefix(args.tmp_dir, "empty", made)
    for _ in range(repeats):
        start = time.perf_counter()
        result = Executor(empty, console=False).run(steps, dry_run=True)
        plan.append(time.perf_counter() - start)
        assert len(result.rows) == size and os.listdir(empty) == []
    remove(empty, made)
    log(f"{label}: plan (dry run) {fmt_list(plan)}")

    cold = []
    cold_runs = 1 if size >= args.cold_once_from else repeats
    prefix = None
    for attempt in range(cold_runs):
        if prefix is not None:
            remove(prefix, made)
        prefix = new_prefix(args.tmp_dir, f"{shape}-{size}", made)
        log(f"{label}: cold run {attempt + 1}/{cold_runs} under {prefix}")
        executor = Executor(prefix, console=False, listeners=[Progress(f"{label} cold", size)])
        start = time.perf_counter()
        executor.run(steps)
        cold.append(time.perf_counter() - start)
    log(f"{label}: cold run {fmt_list(cold)}")

    warm, warm_import, floor = [], [], []
    for _ in range(repeats):  # interleaved, so drift on a noisy machine hits both alike
        result = run_child("warm", shape, size, prefix)
        warm.append(result["seconds"])
        warm_import.append(result["import_s"])
        floor.append(run_child("floor", shape, size, prefix)["seconds"])
    log(f"{label}: warm re-run {fmt_list(warm)}; floor {fmt_list(floor)}")
    if args.keep:
        log(f"{label}: keeping {prefix}")
        made.remove(prefix)
    else:
        remove(prefix, made)
    return Row(shape, size, build_hash, plan, cold, warm, floor, warm_import)


def fmt_list(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "] s"


def fmt_s(value: float) -> str:
    return f"{value:.3f}" if value < 100 else f"{value:.1f}"


def table(rows: list[Row]) -> str:
    header = (
        "| shape | steps | build+hash (s) | plan, dry run (s) | cold run (s) | warm re-run (s) "
        "| floor (s) | warm/floor | import executor (s) |"
    )
    lines = [header, "|" + "---|" * 9]
    for row in rows:
        cold = fmt_s(median(row.cold)) + ("" if len(row.cold) > 1 else " (1 run)")
        lines.append(
            f"| {row.shape} | {row.size:,} | {fmt_s(median(row.build_hash))} | {fmt_s(median(row.plan))} "
            f"| {cold} | {fmt_s(median(row.warm))} | {fmt_s(median(row.floor))} | {row.ratio:.2f} "
            f"| {fmt_s(median(row.warm_import))} |"
        )
    return "\n".join(lines)


def targets(rows: list[Row]) -> tuple[list[str], dict[str, float]]:
    lines, values = [], {}
    big = [row for row in rows if row.size == 10_000]
    if big:
        worst = max(big, key=lambda row: median(row.build_hash))
        seconds = median(worst.build_hash)
        verdict = "PASS" if seconds < BUILD_HASH_TARGET_S else "FAIL"
        lines.append(
            f"target: 10,000 steps built+hashed in < {BUILD_HASH_TARGET_S:g} s: {seconds:.3f} s "
            f"(worst shape: {worst.shape}) {verdict}"
        )
        values["build_hash_10000_s"] = seconds
    small = [row for row in rows if row.size == 1_000]
    if small:
        worst = max(small, key=lambda row: row.ratio)
        verdict = "PASS" if worst.ratio <= WARM_VS_FLOOR_TARGET else "FAIL"
        lines.append(
            f"target: warm re-run of 1,000 steps <= {WARM_VS_FLOOR_TARGET:g}x floor: {worst.ratio:.2f}x "
            f"(worst shape: {worst.shape}) {verdict}"
        )
        values["warm_vs_floor_1000"] = worst.ratio
    return lines, values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000], help="DAG sizes (steps)")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; the median is reported")
    parser.add_argument(
        "--cold-once-from", type=int, default=10_000, help="sizes from this one up get a single cold run"
    )
    parser.add_argument("--out", help="also write results.json and results.md into this directory")
    parser.add_argument("--tmp-dir", help="where the temporary prefixes go (default: the system temp dir)")
    parser.add_argument(
        "--keep", action="store_true", help="keep each DAG's completed prefix (for profiling)"
    )
    # Hidden: one measurement in a fresh process (warm re-run or floor).
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=SHAPES, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        print(json.dumps(CHILDREN[args.child](args.shape, args.size, args.prefix)), flush=True)
        return

    made: list[str] = []
    rows: list[Row] = []
    try:
        for size in args.sizes:
            for shape in args.shapes:
                rows.append(measure(shape, size, args, made))
    finally:
        for path in list(made):
            remove(path, made)

    machine = f"{os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}"
    target_lines, values = targets(rows)
    report = [
        f"executor overhead ({machine}); median of {args.repeats} runs, seconds",
        "",
        table(rows),
        "",
        *target_lines,
        *(f"{key}={value:.3f}" for key, value in values.items()),
    ]
    print("\n".join(report), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.md"), "w") as handle:
            handle.write("\n".join(report) + "\n")
        raw = [
            {
                **row.__dict__,
                "ratio": row.ratio,
                "medians": {k: median(v) for k, v in row.__dict__.items() if isinstance(v, list)},
            }
            for row in rows
        ]
        with open(os.path.join(args.out, "results.json"), "w") as handle:
            json.dump({"machine": machine, "rows": raw, "targets": values}, handle, indent=2)


if __name__ == "__main__":
    main()
