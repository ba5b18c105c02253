"""Where a cold run's time goes: each part of a step's bookkeeping timed inside a real run.

    .venv/bin/python bench/cold_phases.py [--shape fanin] [--runs 5] [--tmp-dir /dev/shm] [--no-keeper]

Runs `Executor(prefix, console=False).run(steps)` on fresh prefixes (the 1,000-step DAGs of
`bench/executor_overhead.py`), with the runner's and the lease manager's parts wrapped in
timers (each wrapper adds ~1 us a call), and prints milliseconds per run and calls per run
for each part, and how many worker threads each run started. Parts overlap (the step's
total contains the lease, the records, the step function); with more than one worker
thread, the parts of different steps overlap too, and their sum can exceed the run. The
parts marked "outside the steps" run in the main thread before the first step or after the
last. An untimed run of 20 steps comes first, so that the lease keeper is up (as it is for
every run but a process's first: `bench/cold_ab.py` takes the fastest of three).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import executor_overhead as bench  # noqa: E402
from revision import commit  # noqa: E402

import executor.backends as backends  # noqa: E402
import executor.executor as executor_module  # noqa: E402
import executor.runner as runner  # noqa: E402
from executor import Executor  # noqa: E402
from executor.lease import LeaseConfig, LeaseManager  # noqa: E402

TOTALS: collections.Counter = collections.Counter()
CALLS: collections.Counter = collections.Counter()


def timed(owner, name: str, label: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TOTALS[label] += time.perf_counter() - start
            CALLS[label] += 1

    setattr(owner, name, wrapper)


PARTS = [
    (runner.Runner, "_acquire_and_run", "a step, all told (worker)"),
    (LeaseManager, "try_acquire", "lease taken (with the keeper's hold)"),
    (runner, "write_info", ".executor_info written"),
    (runner, "step_info_record", ".executor_info record built"),
    (runner, "append_status", "status lines (RUNNING, SUCCESS)"),
    (backends.Backend, "call", "the step function"),
    (LeaseManager, "release", "lease released (with the keeper's drop)"),
    (runner, "read_last_status", "status read after the lease"),
    (runner.Runner, "_take", "worker taking a queued step (waits included)"),
    (runner.Runner, "_report", "worker reporting"),
    (runner.Runner, "_following_step", "worker choosing the next step of a chain"),
    (runner.Runner, "run", "the runner, all told (first step to last report)"),
    (executor_module, "resolve", "outside the steps: resolve (versions, paths)"),
    (executor_module, "make_plan", "outside the steps: the plan (a listing, status reads)"),
    (
        executor_module,
        "write_experiment_info",
        "outside the steps: the experiment manifest, before and after",
    ),
    (executor_module, "collect_provenance", "outside the steps: provenance (git, packages)"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=bench.SHAPES, default="fanin")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tmp-dir", default="/dev/shm")
    parser.add_argument("--no-keeper", action="store_true", help="heartbeats from a thread, not the keeper")
    args = parser.parse_args()
    for owner, name, label in PARTS:
        timed(owner, name, label)
    workers = []
    run = runner.Runner.run

    def counting_run(self):
        try:
            return run(self)
        finally:
            workers.append(self._workers)

    runner.Runner.run = counting_run
    config = LeaseConfig(heartbeat_process=not args.no_keeper)
    warm_up = tempfile.mkdtemp(dir=args.tmp_dir)
    try:
        Executor(warm_up, console=False, lease_config=config).run(bench.build_steps(args.shape, 20))
    finally:
        shutil.rmtree(warm_up)
    TOTALS.clear()
    CALLS.clear()
    workers.clear()
    for _ in range(args.runs):
        steps = bench.build_steps(args.shape, 1000)
        prefix = tempfile.mkdtemp(dir=args.tmp_dir)
        try:
            start = time.perf_counter()
            Executor(prefix, console=False, lease_config=config).run(steps)
            TOTALS["the whole run (Executor.run)"] += time.perf_counter() - start
            CALLS["the whole run (Executor.run)"] += 1
        finally:
            shutil.rmtree(prefix)
    print(
        f"cold {args.shape} of 1,000 steps at commit {commit()}, {args.runs} runs under {args.tmp_dir}, "
        f"keeper {'off' if args.no_keeper else 'on'}; worker threads per run: {workers}\n"
    )
    print("| part | ms per run | calls per run |\n|---|---|---|")
    for label, seconds in sorted(TOTALS.items(), key=lambda item: -item[1]):
        print(f"| {label} | {seconds / args.runs * 1000:.1f} | {CALLS[label] / args.runs:.0f} |")


if __name__ == "__main__":
    main()
