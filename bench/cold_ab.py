"""Cold run of 1,000 trivial steps, two commits interleaved, for A/B checks of one change.

    git worktree add /tmp/base <commit>
    .venv/bin/python bench/cold_ab.py --other /tmp/base [--rounds 12] [--tmp-dir /dev/shm]

Each round runs one child process per side (the order alternates between rounds). A child
imports the executor of its checkout (PYTHONPATH), then for each shape of
`bench/executor_overhead.py` (chain, fan-in) times `Executor(prefix, console=False).run(steps)`
on a fresh prefix three times and the cold floor (`executor_overhead.floor_cold`, the same
steps' outputs and one status file each) three times, and reports the fastest of each: the
in-process cold run, interpreter start and imports excluded. Printed per shape: each side's
median time and median ratio to its floor, and the median of the per-round ratios of the
two sides (ours / other), which outside load moves far less than either time. "Ours" is the
code `import executor` finds from this checkout (or $PYTHONPATH's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, shutil, sys, tempfile, time
sys.path.insert(0, os.path.join(sys.argv[1], "bench"))
import executor_overhead as bench
from executor import Executor
results, made = {}, []
for shape in ("chain", "fanin"):
    runs, floors = [], []
    for _ in range(3):
        steps = bench.build_steps(shape, 1000)
        prefix = tempfile.mkdtemp(dir=sys.argv[2])
        made.append(prefix)
        start = time.perf_counter()
        Executor(prefix, console=False).run(steps)
        runs.append(time.perf_counter() - start)
    for _ in range(3):
        made.append(tempfile.mkdtemp(dir=sys.argv[2]))
        floors.append(bench.floor_cold(bench.build_steps(shape, 1000), made[-1]))
    results[shape] = [min(runs), min(floors)]
for prefix in made:  # after the last measurement (a deletion slows the runs after it)
    shutil.rmtree(prefix)
print(json.dumps(results))
"""


def run_side(checkout: str, tmp_dir: str) -> dict[str, list[float]]:
    env = dict(os.environ, PYTHONPATH=checkout)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as on a user's machine
    done = subprocess.run(
        [sys.executable, "-c", CHILD, checkout, tmp_dir], env=env, cwd=tmp_dir, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(f"the child for {checkout} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", required=True, help="a checkout of the other commit")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--tmp-dir", default="/dev/shm", help="where the prefixes go (tmpfs: no disk noise)")
    args = parser.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sides = {"ours": os.environ.get("PYTHONPATH") or here, "other": os.path.abspath(args.other)}
    scratch = os.path.join(args.tmp_dir, f"cold-ab-{os.getpid()}")
    os.makedirs(scratch)
    results: dict[str, dict[str, list[list[float]]]] = {side: {"chain": [], "fanin": []} for side in sides}
    try:
        for round_index in range(args.rounds):
            order = list(sides) if round_index % 2 == 0 else list(sides)[::-1]
            for side in order:
                for shape, pair in run_side(sides[side], scratch).items():
                    results[side][shape].append(pair)
            print(f"round {round_index + 1}/{args.rounds}", file=sys.stderr, flush=True)
    finally:
        subprocess.run(["rm", "-rf", scratch], check=False)
    commit = subprocess.run(
        ["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    print(
        f"ours: {sides['ours']} (commit {commit.stdout.strip()}), other: {sides['other']}, rounds: {args.rounds}"
    )
    print("| shape | ours, s | ours / floor | other, s | other / floor | ours / other |")
    print("|---|---|---|---|---|---|")
    for shape in ("chain", "fanin"):
        ours, other = results["ours"][shape], results["other"][shape]
        print(
            f"| {shape} | {statistics.median(t for t, _ in ours):.3f} "
            f"| {statistics.median(t / f for t, f in ours):.2f} "
            f"| {statistics.median(t for t, _ in other):.3f} "
            f"| {statistics.median(t / f for t, f in other):.2f} "
            f"| {statistics.median(a[0] / b[0] for a, b in zip(ours, other, strict=True)):.3f} |"
        )


if __name__ == "__main__":
    main()
