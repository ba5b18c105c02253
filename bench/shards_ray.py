"""The per-shard map (`operations.shards.map_shards`) on the local pool and on Ray.

    .venv/bin/python bench/shards_ray.py [--shards 8] [--documents 400] [--rounds 3] [--workers 2]

One data operation -- the filter step with FineWeb's recipe (`default_web_rules()`:
datatrove's Gopher, C4 and FineWeb blocks, CPU bound) -- over a synthetic corpus of
`--shards` gzip shards written by this script, run three ways:

    local pool     `--workers` local worker processes (the map without Ray)
    ray, 1 node    connected to a local Ray cluster (`ray.cluster_utils.Cluster`, 127.0.0.1)
                   of one node with 1 CPU: one shard task at a time
    ray, 2 nodes   the same with two nodes of 1 CPU each: two shard tasks at a time

The local pool is measured beside each cluster, alternating with the Ray map round by round
(`operations.shards.ray_connected` patched off for its rounds), so both see the same load
on shared cores. The first Ray round includes starting the workers' processes and
importing the operation there; later rounds reuse them. Starting the cluster is timed
apart. The script checks that every output file (shards, `.shard_stats/`, `stats.json`) is
byte-identical across all runs, then prints a table: seconds per round, medians, and the
Ray median over the local pool's median in the same cluster's rounds (below 1: Ray faster).

Not a test: run it by hand; record the figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [REPO]

from operations.filter import FilterConfig, default_web_rules, filter_documents  # noqa: E402
from operations.shards import shard_name, write_documents  # noqa: E402


def make_corpus(directory: Path, shards: int, documents: int) -> int:
    """Prose-like documents (sentences of random words, some lines repeated, some short
    documents) so that every rule has work; returns the corpus size in bytes."""
    rng = random.Random(0)
    vocabulary = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 10))) for _ in range(5_000)]
    vocabulary[:8] = ["the", "and", "of", "to", "that", "with", "have", "this"]  # Gopher's stop words
    for index in range(shards):
        batch = []
        for number in range(documents):
            lines = []
            for _ in range(rng.randint(3, 30)):
                words = rng.choices(vocabulary, k=rng.randint(6, 30))
                lines.append(" ".join(words).capitalize() + rng.choice([".", ".", "!", "?", ""]))
            if number % 7 == 0:
                lines += lines[:3] * 4
            text = "\n".join(lines if number % 11 else lines[:1])
            batch.append({"id": f"{index}-{number}", "text": text, "source": "bench", "metadata": {}})
        write_documents(str(directory / shard_name(index)), batch)
    return sum(path.stat().st_size for path in directory.iterdir())


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()
    }


def run_once(corpus: str, out: Path, workers: int | None, local: bool) -> tuple[float, dict]:
    """One filter run into `out`; with `local`, on the local pool although Ray is connected."""
    import operations.shards as shards_module

    connected = shards_module.ray_connected
    if local:
        shards_module.ray_connected = lambda: False
    try:
        started = time.perf_counter()
        filter_documents(
            FilterConfig(input_path=corpus, output_path=str(out), rules=default_web_rules(), workers=workers)
        )
        seconds = time.perf_counter() - started
    finally:
        shards_module.ray_connected = connected
    files = tree(out)
    shutil.rmtree(out)
    return seconds, files


def with_cluster(nodes: int, corpus: str, work: Path, rounds: int, workers: int, reference: dict) -> dict:
    """Start a local cluster of `nodes` nodes with 1 CPU each and connect; then, per round,
    the local pool and the Ray map in turn (so both see the same load on shared cores)."""
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    # Keep 127.0.0.1 as the cluster address (else Ray rewrites it to an address nothing listens on).
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    started = time.perf_counter()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "node_ip_address": "127.0.0.1"},
    )
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    result = {"startup": time.perf_counter() - started, "local": [], "ray": []}
    try:
        for round_number in range(rounds):
            for side in ("local", "ray"):
                out = work / f"{nodes}-{side}-{round_number}"
                seconds, files = run_once(corpus, out, workers if side == "local" else None, side == "local")
                if files != reference:
                    raise AssertionError(f"{side} (cluster of {nodes}) round {round_number}: other bytes")
                result[side].append(seconds)
                print(
                    f"  {nodes} node(s), {side}, round {round_number}: {seconds:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        ray.shutdown()
        cluster.shutdown()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--documents", type=int, default=400, help="documents per shard")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="local pool processes")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="shards-ray-bench-"))
    try:
        corpus = work / "corpus"
        size = make_corpus(corpus, args.shards, args.documents)
        print(
            f"corpus: {args.shards} shards x {args.documents} documents, {size / 1e6:.1f} MB gzip",
            file=sys.stderr,
        )
        _, reference = run_once(
            str(corpus), work / "reference", args.workers, local=True
        )  # warm-up, reference bytes
        results = {
            nodes: with_cluster(nodes, str(corpus), work, args.rounds, args.workers, reference)
            for nodes in (1, 2)
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    print(
        f"filter (default_web_rules) over {args.shards} shards x {args.documents} documents "
        f"({size / 1e6:.1f} MB gzip); cores: {os.cpu_count()}; rounds alternate local pool / Ray"
    )
    rounds = " | ".join(f"round {i + 1} s" for i in range(args.rounds))
    print(f"| map on | cluster start s | {rounds} | median s | Ray median / local median |")
    print("|---|---|" + "---|" * args.rounds + "---|---|")
    for nodes, result in results.items():
        local_median = statistics.median(result["local"])
        for side, label in (
            ("local", f"local pool, {args.workers} processes (beside the {nodes}-node cluster)"),
            ("ray", f"Ray, {nodes} node{'s' if nodes > 1 else ''} x 1 CPU"),
        ):
            times = result[side]
            start = f"{result['startup']:.1f}" if side == "ray" else "-"
            ratio = f"{statistics.median(times) / local_median:.2f}" if side == "ray" else "1.00"
            cells = " | ".join(f"{t:.2f}" for t in times)
            print(f"| {label} | {start} | {cells} | {statistics.median(times):.2f} | {ratio} |")
    print("outputs byte-identical across all runs: yes")
    print(f"commit={commit.stdout.strip()}")


if __name__ == "__main__":
    main()
