"""`marin ls` and the browser's experiment page on a tree of N steps (target: under 1 s at 1,000).

    .venv/bin/python bench/tree_tools.py [--steps 1000] [--repeats 5] [--no-s3] [--out DIR]

Builds one experiment of N steps with the real executor (a chain of 10 branches, each
step writing one small file), then times, each --repeats times, median reported:

- `marin ls` in a fresh process (interpreter start and imports included: what a person waits for);
- `marin ls` in-process (a fresh `OutputTree` each time: walking, reading every step's
  info and status, sizes);
- `marin ls --no-size`, in-process;
- the experiment page (`GET /exp/<id>`), the experiments list (`GET /`) and all steps (`GET /steps`) of
  `marin browse`, each request on a fresh server so nothing is cached between them.

With a SeaweedFS S3 server (the tests' `weed mini`; skipped with --no-s3 or when the
binary is missing) the same tree is uploaded to `s3://bench/...` and `marin ls` is timed
there with parallel reads (the default) and with one read at a time, to show why
listings on object stores read in parallel.

The last lines are machine-readable: `ls_1000_s=...` and `experiment_page_1000_s=...`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from executor import Executor, ExecutorStep, LeaseConfig, output_path_of, this_output_path, versioned  # noqa: E402
from marin import outputs  # noqa: E402
from marin.cli import main as marin_main  # noqa: E402

TARGET_S = 1.0
BRANCHES = 10


@dataclass(frozen=True)
class MarkerConfig:
    output_path: str
    index: int
    """Versioned: one output per index."""

    upstream: str | None = None
    """The previous step of the branch (a real dependency edge)."""


def write_marker(config: MarkerConfig) -> None:
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "part-0.txt"), "w") as handle:
        handle.write(f"{config.index}\n" * 20)


def build_steps(size: int) -> list[ExecutorStep]:
    steps: list[ExecutorStep] = []
    last: dict[int, ExecutorStep] = {}
    for index in range(size):
        branch = index % BRANCHES
        upstream = output_path_of(last[branch]) if branch in last else None
        step = ExecutorStep(
            name=f"branch{branch}/step-{index:05d}",
            fn=write_marker,
            config=MarkerConfig(this_output_path(), versioned(index), upstream),
        )
        last[branch] = step
        steps.append(step)
    return steps


def timed(fn, repeats: int) -> list[float]:
    """Wall time of each call, or what the call returns when it times itself."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        own = fn()
        times.append(own if isinstance(own, float) else time.perf_counter() - start)
    return times


def ls_in_process(prefix: str, *extra: str) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        code = marin_main(["ls", "--prefix", prefix, *extra])
    if code != 0:
        raise RuntimeError(f"marin ls failed with {code}")


def ls_subprocess(prefix: str) -> None:
    marin = os.path.join(os.path.dirname(sys.executable), "marin")
    command = [marin] if os.path.exists(marin) else [sys.executable, "-m", "marin.cli"]
    subprocess.run(
        [*command, "ls", "--prefix", prefix], check=True, capture_output=True, env=dict(os.environ)
    )


def page_once(prefix: str, path_of) -> float:
    from marin.web import start_server

    server = start_server(prefix, port=0).start_in_thread()
    try:
        start = time.perf_counter()
        with urllib.request.urlopen(server.url.rstrip("/") + path_of(), timeout=60) as response:
            body = response.read()
        elapsed = time.perf_counter() - start
        if response.status != 200 or not body:
            raise RuntimeError(f"page {path_of()} answered {response.status}")
    finally:
        server.shutdown()  # not timed: it waits for the serving loop's poll interval
    return elapsed


def experiment_url(prefix: str) -> str:
    from urllib.parse import quote

    experiment = outputs.OutputTree(prefix).experiments[0]
    return f"/exp/{quote(experiment.id)}"


def s3_figures(local_prefix: str, repeats: int) -> dict[str, list[float]] | None:
    try:
        from tests.operations.servers import run_s3_server
    except ImportError as error:
        print(f"(s3 skipped: {error})", file=sys.stderr)
        return None
    work = Path(tempfile.mkdtemp(prefix="bench-weed-"))
    try:
        with run_s3_server(work) as server:
            os.environ.update(server.env)
            fs = server.filesystem()
            remote = f"{server.bucket}/tree-{os.getpid()}"
            print("uploading the tree to S3 ...", file=sys.stderr, flush=True)
            fs.put(local_prefix + "/", remote + "/", recursive=True)
            prefix = f"s3://{remote}"
            figures = {"s3 ls (parallel reads)": timed(lambda: ls_in_process(prefix, "--no-size"), repeats)}
            saved = outputs.PARALLEL_READS
            outputs.PARALLEL_READS = 1
            try:
                figures["s3 ls (one read at a time)"] = timed(
                    lambda: ls_in_process(prefix, "--no-size"), repeats
                )
            finally:
                outputs.PARALLEL_READS = saved
            return figures
    except Exception as error:  # a missing weed binary or a failed start: report, go on
        print(f"(s3 skipped: {type(error).__name__}: {error})", file=sys.stderr)
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--out", help="also write results.md here")
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="bench-tree-")
    prefix = os.path.join(root, "tree")
    try:
        print(f"building a {args.steps}-step tree with the executor ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        Executor(prefix, console=False, lease_config=LeaseConfig()).run(build_steps(args.steps))
        print(f"  built in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        rows: dict[str, list[float]] = {
            "marin ls (fresh process)": timed(lambda: ls_subprocess(prefix), args.repeats),
            "marin ls (in-process)": timed(lambda: ls_in_process(prefix), args.repeats),
            "marin ls --no-size (in-process)": timed(
                lambda: ls_in_process(prefix, "--no-size"), args.repeats
            ),
        }
        try:
            url = experiment_url(prefix)
            rows["experiment page (GET)"] = timed(lambda: page_once(prefix, lambda: url), args.repeats)
            rows["experiments list (GET /)"] = timed(lambda: page_once(prefix, lambda: "/"), args.repeats)
            rows["all steps (GET /steps)"] = timed(lambda: page_once(prefix, lambda: "/steps"), args.repeats)
        except ImportError as error:
            print(f"(browser pages skipped: {error})", file=sys.stderr)
        if not args.no_s3:
            rows.update(s3_figures(prefix, args.repeats) or {})
    finally:
        shutil.rmtree(root, ignore_errors=True)

    lines = [
        f"{args.steps} steps, {args.repeats} repeats, median (min-max) seconds; "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs",
        "",
        "| what | median s | min s | max s |",
        "|---|---|---|---|",
    ]
    for label, times in rows.items():
        lines.append(f"| {label} | {statistics.median(times):.3f} | {min(times):.3f} | {max(times):.3f} |")
    ls_s = statistics.median(rows["marin ls (fresh process)"])
    page = rows.get("experiment page (GET)")
    lines.append("")
    lines.append(
        f"target: marin ls on {args.steps} steps < {TARGET_S} s: {ls_s:.3f} s {'PASS' if ls_s < TARGET_S else 'FAIL'}"
    )
    if page:
        page_s = statistics.median(page)
        lines.append(
            f"target: experiment page on {args.steps} steps < {TARGET_S} s: {page_s:.3f} s "
            f"{'PASS' if page_s < TARGET_S else 'FAIL'}"
        )
    lines.append(f"ls_{args.steps}_s={ls_s:.3f}")
    if page:
        lines.append(f"experiment_page_{args.steps}_s={statistics.median(page):.3f}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        Path(args.out, "results.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
