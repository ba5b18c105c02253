"""What each part of a cold step's bookkeeping costs: the cold run with one part switched off at a time.

    .venv/bin/python bench/cold_ablation.py [--shape chain] [--rounds 5] [--tmp-dir DIR ...]

Runs the cold 1,000-step DAG of `bench/executor_overhead.py` (`Executor(prefix,
console=False).run(steps)` on a fresh prefix, the steps built before the timer starts, after
`os.sync()`) as shipped, then with parts of the executor's bookkeeping replaced by no-ops,
and the cold floor of that bench (resolve, then per step the step function and one status
file). The variants are measurements, not configurations anyone should run: without the
lease two drivers may run a step twice, without `.executor_info` nothing can explain or
reproduce it. They answer one question: how far from the floor is the executor with a part
gone, so how much of the 3x target each part stands between.

- as shipped: the executor, keeper process and all;
- heartbeats in a thread: `LeaseConfig(heartbeat_process=False)`, a real setting (no keeper
  messages: `hold`, `drop`);
- no experiment manifest: `write_experiment_info` (before and after the run) a no-op;
- no .executor_info: `write_info` a no-op (the record is not built either);
- no RUNNING line: `append_status` skips RUNNING (SUCCESS is still written);
- no status read after the lease: `read_last_status` in the runner returns None;
- no lease: `try_acquire` makes the directory and returns "acquired"; `confirm` and
  `release` do nothing (no lease file, no keeper message);
- none of the above: every no-op at once -- the runner, its threads and events, the step's
  log capture, the step function and its SUCCESS line;
- the floor.

Rounds are interleaved (each round runs every variant once, the order rotated between rounds,
all on the same disk), and each ratio is the median over rounds of the variant's time over
that round's floor. Prefixes are deleted only at the end (on a disk mounted with `discard`,
deleting slows the runs that follow). Prints one table per --tmp-dir, with the commit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import executor_overhead as bench  # noqa: E402
from revision import commit  # noqa: E402

import executor.executor as executor_module  # noqa: E402
import executor.runner as runner  # noqa: E402
from executor import Executor  # noqa: E402
from executor.lease import AcquireResult, LeaseConfig, LeaseManager  # noqa: E402

SHIPPED = LeaseConfig()
THREAD_HEARTBEATS = LeaseConfig(heartbeat_process=False)


class Patches:
    """Replaces attributes for one variant's run and puts the originals back after it."""

    def __init__(self):
        self._saved: list[tuple[object, str, object]] = []

    def set(self, owner: object, name: str, value: object) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def restore(self) -> None:
        while self._saved:
            owner, name, value = self._saved.pop()
            setattr(owner, name, value)


def no_manifest(patches: Patches) -> None:
    patches.set(executor_module, "write_experiment_info", lambda *args, **kwargs: None)


def no_info(patches: Patches) -> None:
    patches.set(runner, "write_info", lambda store, record: None)
    patches.set(runner, "step_info_record", lambda *args, **kwargs: None)


def no_running_line(patches: Patches) -> None:
    append = runner.append_status

    def append_but_running(store, path, status, *args, **kwargs):
        return None if status == runner.Status.RUNNING else append(store, path, status, *args, **kwargs)

    patches.set(runner, "append_status", append_but_running)


def no_status_read(patches: Patches) -> None:
    patches.set(runner, "read_last_status", lambda store, path: None)


def no_lease(patches: Patches) -> None:
    def acquire(self, output_path, expect_absent=False):
        os.makedirs(output_path, exist_ok=True)
        return AcquireResult(acquired=True, holder=None)

    patches.set(LeaseManager, "try_acquire", acquire)
    patches.set(LeaseManager, "confirm", lambda self, output_path: True)
    patches.set(LeaseManager, "release", lambda self, output_path: None)


VARIANTS: dict[str, tuple[LeaseConfig, list[Callable[[Patches], None]]]] = {
    "as shipped": (SHIPPED, []),
    "heartbeats in a thread (no keeper messages)": (THREAD_HEARTBEATS, []),
    "no experiment manifest": (SHIPPED, [no_manifest]),
    "no .executor_info": (SHIPPED, [no_info]),
    "no RUNNING line": (SHIPPED, [no_running_line]),
    "no status read after the lease": (SHIPPED, [no_status_read]),
    "no lease": (SHIPPED, [no_lease]),
    "none of the above": (SHIPPED, [no_manifest, no_info, no_running_line, no_status_read, no_lease]),
}
FLOOR = "the floor"


STEPS = 1000


def run_variant(name: str, shape: str, prefix: str, size: int = STEPS) -> float:
    config, switches = VARIANTS[name]
    patches = Patches()
    try:
        for switch in switches:
            switch(patches)
        steps = bench.build_steps(shape, size)
        os.sync()
        start = time.perf_counter()
        Executor(prefix, console=False, lease_config=config).run(steps)
        return time.perf_counter() - start
    finally:
        patches.restore()


def run_floor(shape: str, prefix: str, size: int = STEPS) -> float:
    steps = bench.build_steps(shape, size)
    os.sync()
    return bench.floor_cold(steps, prefix)


def measure(shape: str, rounds: int, tmp_dir: str) -> dict[str, list[float]]:
    scratch = tempfile.mkdtemp(prefix="cold-ablation-", dir=tmp_dir)
    names = [*VARIANTS, FLOOR]
    times: dict[str, list[float]] = {name: [] for name in names}
    try:
        # The keeper starts with a process's first run: start it before anything is timed.
        Executor(os.path.join(scratch, "warm-up"), console=False).run(bench.build_steps(shape, 20))
        for round_index in range(rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                prefix = os.path.join(scratch, f"r{round_index}-{names.index(name)}")
                elapsed = run_floor(shape, prefix) if name == FLOOR else run_variant(name, shape, prefix)
                times[name].append(elapsed)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return times


def table(times: dict[str, list[float]]) -> str:
    floor = times[FLOOR]
    lines = [
        "| variant | ms per run | per step over the floor, us | ratio to the floor |",
        "|---|---|---|---|",
    ]
    for name, values in times.items():
        ratio = statistics.median(ours / base for ours, base in zip(values, floor, strict=True))
        over = (statistics.median(values) - statistics.median(floor)) * 1e6 / STEPS  # us a step
        lines.append(f"| {name} | {statistics.median(values) * 1000:.0f} | {over:.0f} | {ratio:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=bench.SHAPES, default="chain")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--tmp-dir",
        action="append",
        help="where the prefixes go (repeat for several disks; default: the system's temporary directory)",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    revision = commit(("executor", "bench"))
    for tmp_dir in args.tmp_dir or [tempfile.gettempdir()]:
        times = measure(args.shape, args.rounds, tmp_dir)
        print(
            f"\ncold {args.shape} of 1,000 steps under {tmp_dir}, {args.rounds} rounds, commit {revision}\n"
        )
        print(table(times))


if __name__ == "__main__":
    main()
