"""Whole-process cached re-run against its floor, interleaved, for A/B checks of one change.

    .venv/bin/python bench/whole_process_ab.py [--rounds 20] [--shape chain] [--dir /dev/shm/ab]

The same two generated scripts as `bench/executor_overhead.py` (`python experiment.py` with
`executor_main`, and `python floor.py warm`), on prefixes made once by their cold runs and
kept in `--dir` (delete it after a change that alters versions or the status format). Each
round runs ours then the floor; prints the medians and the median of the per-round ratios.
Run it on the commit before and after a change, in one sitting: machines differ by tens of
percent, so only ratios taken side by side compare. Better, for a change worth ~1 ms: give a
checkout of the other commit with `--other` (e.g. `git worktree add /tmp/base HEAD`); each
round then also runs the experiment on that code (PYTHONPATH, on a prefix of its own), and the
last line gives the median per-round ratio of the two, which outside load moves far less.
"Ours" is the code `import executor` finds: this checkout's, unless $PYTHONPATH names another
(`PYTHONPATH=/tmp/a .venv/bin/python bench/whole_process_ab.py --other /tmp/b` compares two
older commits); the first line's commit is this checkout's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import executor_overhead as bench  # noqa: E402 - the bench's scripts and child environment

SIZE = 1_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--shape", choices=bench.SHAPES, default="chain")
    parser.add_argument("--dir", default="/dev/shm/whole-process-ab", help="scripts and prefixes (kept)")
    parser.add_argument("--other", help="a checkout of another commit, run interleaved (see above)")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    experiment, floor = bench.write_scripts(args.dir)
    prefix, floor_prefix = (os.path.join(args.dir, f"{side}-{args.shape}") for side in ("ours", "floor"))
    env = dict(bench.CHILD_ENV, BENCH_SHAPE=args.shape, BENCH_SIZE=str(SIZE), MARIN_PREFIX=prefix)
    ours_cmd = [sys.executable, experiment]
    floor_cmd = [sys.executable, floor, "warm", args.shape, str(SIZE), floor_prefix]
    if not os.path.exists(prefix):
        subprocess.run(ours_cmd, env=env, stdout=subprocess.DEVNULL, check=True)
        subprocess.run(
            [sys.executable, floor, "cold", args.shape, str(SIZE), floor_prefix], env=env, check=True
        )

    other_env = None
    if args.other:
        other = os.path.abspath(args.other)
        other_prefix = os.path.join(args.dir, f"other-{args.shape}")
        other_env = dict(env, MARIN_PREFIX=other_prefix, PYTHONPATH=other)
        if not os.path.exists(other_prefix):
            subprocess.run(ours_cmd, env=other_env, stdout=subprocess.DEVNULL, check=True)

    def wall(command: list[str], environ: dict[str, str] = env) -> float:
        start = time.perf_counter()
        subprocess.run(command, env=environ, stdout=subprocess.DEVNULL, check=True)
        return time.perf_counter() - start

    for _ in range(3):  # warm the page cache and bytecode caches
        wall(ours_cmd), wall(floor_cmd)
        if other_env is not None:
            wall(ours_cmd, other_env)
    ours, floors, others = [], [], []
    for _ in range(args.rounds):
        ours.append(wall(ours_cmd))
        floors.append(wall(floor_cmd))
        if other_env is not None:
            others.append(wall(ours_cmd, other_env))
    ratio = statistics.median(a / b for a, b in zip(ours, floors, strict=True))
    print(
        f"{args.shape}, {SIZE:,} steps, {args.rounds} rounds: ours {statistics.median(ours) * 1000:.1f} ms, "
        f"floor {statistics.median(floors) * 1000:.1f} ms, ratio {ratio:.3f} (commit {bench.git_commit()})"
    )
    if others:
        other_ratio = statistics.median(a / b for a, b in zip(others, floors, strict=True))
        versus = statistics.median(a / b for a, b in zip(ours, others, strict=True))
        print(
            f"other ({args.other}, commit {bench.git_commit(other)}): {statistics.median(others) * 1000:.1f} ms, "
            f"ratio {other_ratio:.3f}; "
            f"ours / other {versus:.3f}"
        )


if __name__ == "__main__":
    main()
