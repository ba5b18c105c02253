"""What a cold step's bookkeeping writes cost by themselves, against the cold floor.

    .venv/bin/python bench/bookkeeping_floor.py                    # system temp dir
    .venv/bin/python bench/bookkeeping_floor.py --tmp-dir /dev/shm # no disk latency

`bench/executor_overhead.py` compares a cold run of 1,000 trivial steps with a floor that
writes each step's output and one status file. This script asks how much of the gap the
writes themselves are: it performs, in straight-line Python with no executor code, no
threads and no JSON building, exactly the system calls the runner makes for one cold step
on local disk (docs/benchmarks.md, "What one step writes on a cold run"):

- floor: the step function (`os.makedirs` of its output, one 3-byte file written with
  `open`) and one status file (`open(O_CREAT|O_EXCL)`, one write, close): the cold floor;
- all writes: `mkdir` of the output; the lease (`open` the directory, `flock`, create
  `.executor_status.lock` with `O_EXCL`, one write, close both); `.executor_info` (a
  temporary file of 1.4 KB, then `rename`); the RUNNING line (`open(O_APPEND|O_CREAT)`,
  `fstat`, one write, close); the step function; the SUCCESS line (likewise); `unlink` of
  the lease;
- all writes but one: each write left out in turn, to show what it costs.

Rounds alternate the variants; each variant starts on a fresh directory after `os.sync()`.
Medians over rounds, ratios to the floor of the same round. The gap between "all writes"
and the executor's cold run in `executor_overhead.py` is the executor's own code (events,
JSON, locks, thread hand-offs, lease-keeper messages), not the file system.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from revision import commit  # noqa: E402

INFO = b"x" * 1400
"""About the size of a bench step's `.executor_info`."""

LEASE = b'{"timestamp": 1795500294.9756758, "worker_id": "host:12345:0123456789abcdef"}'
RUNNING = b'{"date": "2026-11-24T06:04:54.975Z", "message": null, "status": "RUNNING", "worker": "host:12345:0123456789abcdef"}\n'
SUCCESS = (
    b'{"config_digest": "' + b"a" * 64 + b'", "date": "2026-11-24T06:04:54.976Z", "duration_s": 0.0, '
    b'"message": null, "status": "SUCCESS", "version_hash": "' + b"b" * 64 + b'", '
    b'"worker": "host:12345:0123456789abcdef"}\n'
)
FLOOR_STATUS = b'{"status": "SUCCESS"}\n'


def step_function(output: str) -> None:
    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, "done"), "w") as handle:
        handle.write("ok\n")


def floor(root: str, steps: int) -> None:
    for index in range(steps):
        output = f"{root}/chain/step-{index:05d}-0123abcd"
        step_function(output)
        fd = os.open(f"{output}/.executor_status", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        os.write(fd, FLOOR_STATUS)
        os.close(fd)


def append(path: str, line: bytes) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
    os.fstat(fd)
    os.write(fd, line)
    os.close(fd)


def ours(root: str, steps: int, without: str | None = None) -> None:
    for index in range(steps):
        output = f"{root}/chain/step-{index:05d}-0123abcd"
        try:
            os.mkdir(output)
        except FileNotFoundError:
            os.makedirs(output)
        if without != "lease":
            directory = os.open(output, os.O_RDONLY)
            fcntl.flock(directory, fcntl.LOCK_EX)
            fd = os.open(f"{output}/.executor_status.lock", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            os.write(fd, LEASE)
            os.close(fd)
            os.close(directory)
        if without != "info":
            temp = f"{output}/.tmp-0123abcd-.executor_info"
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            os.write(fd, INFO)
            os.close(fd)
            os.replace(temp, f"{output}/.executor_info")
        if without != "running line":
            append(f"{output}/.executor_status", RUNNING)
        step_function(output)
        append(f"{output}/.executor_status", SUCCESS)
        if without != "lease":
            os.unlink(f"{output}/.executor_status.lock")


VARIANTS = {
    "floor (output + one status file)": floor,
    "all our writes": ours,
    "all but the lease": lambda root, steps: ours(root, steps, "lease"),
    "all but .executor_info": lambda root, steps: ours(root, steps, "info"),
    "all but the RUNNING line": lambda root, steps: ours(root, steps, "running line"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tmp-dir", default=None, help="where the temporary directories go")
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="bookkeeping-", dir=args.tmp_dir)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    try:
        for round_index in range(args.rounds):
            order = list(VARIANTS) if round_index % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                root = os.path.join(base, f"r{round_index}-{list(VARIANTS).index(name)}")
                os.sync()
                start = time.perf_counter()
                VARIANTS[name](root, args.steps)
                times[name].append(time.perf_counter() - start)
        # Removed only at the end: deleting thousands of directories slows the next runs on
        # a disk mounted with `discard`.
    finally:
        shutil.rmtree(base, ignore_errors=True)
    floor_name = next(iter(VARIANTS))
    print(
        f"bookkeeping writes of {args.steps:,} cold steps at commit {commit(('bench',))}, under "
        f"{args.tmp_dir or tempfile.gettempdir()}; medians of {args.rounds} rounds\n"
    )
    print("| variant | seconds | per step | x floor |")
    print("|---|---|---|---|")
    for name, values in times.items():
        ratio = statistics.median(a / b for a, b in zip(values, times[floor_name], strict=True))
        seconds = statistics.median(values)
        print(f"| {name} | {seconds:.3f} | {seconds / args.steps * 1e6:.0f} us | {ratio:.2f} |")


if __name__ == "__main__":
    main()
