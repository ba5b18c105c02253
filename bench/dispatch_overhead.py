"""Per-step dispatch overhead of heavy steps: in the driver, local subprocesses, Ray actors.

    .venv/bin/python bench/dispatch_overhead.py                 # 20 steps per backend
    .venv/bin/python bench/dispatch_overhead.py --steps 1000    # the issue's size (long on 2 cores)

N independent trivial steps (each writes one 3-byte file), run cold, three ways:

- driver: no `resources` -- the step runs in a driver thread (what light steps cost);
- local: `resources=ResourceConfig.with_cpu(cpu=1)` on the local backend -- a subprocess per
  step that takes the lease over, heartbeats it from a second process and records the result
  (`executor.backends.host`);
- ray: the same resources on the Ray backend, on a 2-node Ray cluster on 127.0.0.1 started by
  this script (`ray.cluster_utils.Cluster`, 1 CPU each) -- a detached actor per step.

Reported: wall time of `Executor.run` and seconds per step; the Ray cluster's start-up is
timed apart and not included. The machine's CPUs bound how many heavy steps run at once
(local: admitted by CPUs; Ray: one per node CPU), so the per-step figures are throughput on
this machine, not latency. The last lines are `key=value` (`local_s_per_step`,
`ray_s_per_step`, `driver_s_per_step`, `commit`).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from revision import commit  # noqa: E402

from executor import Executor, ExecutorStep, ResourceConfig, this_output_path, versioned  # noqa: E402


@dataclass(frozen=True)
class MarkConfig:
    index: int
    output_path: str


def write_marker(config: MarkConfig) -> None:
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "done"), "w") as handle:
        handle.write("ok\n")


def steps(count: int, resources) -> list[ExecutorStep]:
    return [
        ExecutorStep(
            name=f"d/step-{i:05d}",
            fn=write_marker,
            config=MarkConfig(index=versioned(i), output_path=this_output_path()),
            resources=resources,
        )
        for i in range(count)
    ]


def timed_run(prefix: str, step_list: list[ExecutorStep], backend) -> float:
    start = time.perf_counter()
    Executor(prefix, console=False, backend=backend).run(step_list)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray backend")
    args = parser.parse_args()
    measured = commit(("executor", "bench"))
    root = tempfile.mkdtemp(prefix="dispatch-bench-")
    rows = []
    try:
        driver = timed_run(f"{root}/driver", steps(args.steps, None), "local")
        rows.append(("driver thread (no resources)", driver))
        print(f"driver: {driver:.2f} s", file=sys.stderr)
        local = timed_run(f"{root}/local", steps(args.steps, ResourceConfig.with_cpu(cpu=1)), "local")
        rows.append(("local subprocess", local))
        print(f"local: {local:.2f} s", file=sys.stderr)
        if not args.no_ray:
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep the cluster on 127.0.0.1
            import ray
            from ray._private import ray_constants
            from ray.cluster_utils import Cluster

            from executor.backends.ray_cluster import RayBackend

            ray_constants.ENABLE_RAY_CLUSTER = False
            started = time.perf_counter()
            cluster = Cluster(
                initialize_head=True,
                head_node_args={"num_cpus": 1, "include_dashboard": False, "node_ip_address": "127.0.0.1"},
            )
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, log_to_driver=False)
            startup = time.perf_counter() - started
            try:
                remote = timed_run(
                    f"{root}/ray",
                    steps(args.steps, ResourceConfig.with_cpu(cpu=1)),
                    RayBackend(cluster.address),
                )
            finally:
                ray.shutdown()
                cluster.shutdown()
            rows.append(("ray detached actor", remote))
            print(f"ray: {remote:.2f} s (cluster start {startup:.1f} s, not counted)", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"dispatch overhead at commit {measured} ({os.cpu_count()} cores, Python {platform.python_version()})"
    )
    print()
    print("| where a step runs | steps | wall s | s per step |")
    print("|---|---|---|---|")
    for label, seconds in rows:
        print(f"| {label} | {args.steps:,} | {seconds:.2f} | {seconds / args.steps:.3f} |")
    print()
    names = {
        "driver thread (no resources)": "driver",
        "local subprocess": "local",
        "ray detached actor": "ray",
    }
    for label, seconds in rows:
        print(f"{names[label]}_s_per_step={seconds / args.steps:.4f}")
    print(f"commit={measured}")


if __name__ == "__main__":
    main()
