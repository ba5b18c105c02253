"""The Ray backend: a step with `resources` runs as a Ray task on a node that has them.

    python experiments/my_study.py --backend ray                          # $RAY_ADDRESS, or a local Ray
    python experiments/my_study.py --backend ray --ray_address HOST:6379  # a running cluster

Ray is imported, and the driver connects, when a run has steps to run: a dry run and a fully
cached re-run never touch it. While connected, data operations running in the driver
(`operations.shards`, tokenize) send their work to the cluster too. The address is
`--ray_address`, else `$RAY_ADDRESS`, else Ray starts a local cluster for this process.

Dispatch of one heavy step:

1. `prepare`: among the step's acceptable devices (`ResourceConfig.devices()`: the device,
   then `device_alternatives`, in order) the first that some live node of the cluster has
   in full (CPUs, memory, GPUs, custom resources: Ray's own resource names for TPUs and GPU
   types) is chosen; the choice and the Ray options are recorded in `.executor_info` under
   `dispatch`. If no node has any of them the step fails at once with a message naming the
   step and what it asked for -- Ray itself would keep the task pending forever. (An
   autoscaling cluster may add such a node later; set `$MARIN_RAY_WAIT_FOR_NODES=1` to
   submit anyway.) A plain-dict `resources` asks for one CPU.
2. `call_hosted`: a detached Ray actor with those options (`StepHost`) runs the step
   through `executor.backends.host`: it takes the lease over from the driver, heartbeats
   it from a separate process, runs the function and records SUCCESS or FAILED itself. So
   the step goes on if the driver dies (Ray kills a plain task with its driver; a detached
   actor outlives it), and a driver started again waits for it. The function and config
   travel pickled with cloudpickle, with the driver's `sys.path`, so functions from an
   experiment script resolve on the worker. The step's stdout, stderr and logging go to its
   `.executor_log` in the output tree (the tree must be reachable from the workers: a
   bucket, or a local path on a one-machine cluster; on a bucket the log is uploaded when
   the step ends) and to Ray's worker log. A worker or node lost without a result is
   re-submitted by the runner (`--max_retries`).
3. `cancel`: the actor is killed (and its heartbeat with it).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from executor.backends import Backend, StepCancelled, StepFunctionError, UnsatisfiableError, is_heavy

if TYPE_CHECKING:
    from executor.graph import ResolvedStep

WAIT_FOR_NODES_ENV = "MARIN_RAY_WAIT_FOR_NODES"

ACTOR_NAMESPACE = "marin-executor"

ACTOR_LINGER_S = 30.0
"""A finished step host exits this long after returning its result, if no driver killed it."""


class RayBackend(Backend):
    name = "ray"

    def __init__(self, address: str | None = None):
        self.address = address
        self._actors: dict[str, Any] = {}
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._connected = False

    # -- connection ---------------------------------------------------------------
    def _ray(self):
        import ray

        with self._lock:
            if not self._connected:
                if not ray.is_initialized():
                    address = self.address or os.environ.get("RAY_ADDRESS") or None
                    ray.init(address=address, ignore_reinit_error=True, log_to_driver=True)
                self._connected = True
        return ray

    # -- the interface ------------------------------------------------------------
    def start(self) -> None:
        self._ray()  # connected for the whole run: data operations in the driver use the cluster

    def prepare(self, step: ResolvedStep) -> dict[str, Any]:
        if not is_heavy(step):
            return super().prepare(step)
        ray = self._ray()
        choices = _choices(step.step.resources)
        nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
        for description, options in choices:
            if any(_fits(options, capacity) for capacity in nodes):
                return self._dispatch_record(description, options)
        if os.environ.get(WAIT_FOR_NODES_ENV, "").strip() in ("1", "true", "yes"):
            return self._dispatch_record(*choices[0])
        asked = "; or ".join(
            f"{description} ({_describe_options(options)})" for description, options in choices
        )
        largest = ", ".join(_describe_capacity(capacity) for capacity in nodes) or "no live nodes"
        raise UnsatisfiableError(
            f"step {step.name!r} asks for {asked}, and no node of the Ray cluster has that "
            f"(nodes: {largest}). Add such a node, change the step's resources, or set "
            f"${WAIT_FOR_NODES_ENV}=1 if an autoscaler will add one"
        )

    def _dispatch_record(self, description: str, options: dict[str, Any]) -> dict[str, Any]:
        return {
            "backend": self.name,
            "where": "ray",
            "hosted": True,
            "device": description,
            "ray_options": options,
        }

    def call_hosted(self, step: ResolvedStep, dispatch: dict[str, Any], spec: Any) -> dict[str, Any]:
        """The step in a detached Ray actor (`StepHost`) that holds the lease and records the
        result itself: it finishes even if this driver dies (Ray would kill a plain task
        with its driver). The actor is killed once its result is read, or exits by itself
        shortly after finishing when nobody is left to read it."""
        ray = self._ray()
        import cloudpickle

        try:
            blob = cloudpickle.dumps((step.step.fn, step.config))
        except Exception as error:
            raise StepFunctionError(
                f"step {step.name!r}: its function and config cannot be sent to a Ray worker "
                f"({type(error).__name__}: {error}); make them picklable"
            ) from None
        options = dict(dispatch["ray_options"])
        options.setdefault("num_cpus", 1)
        actor = (
            ray.remote(StepHost)
            .options(
                name=f"marin-step:{step.name}:{os.urandom(4).hex()}",
                namespace=ACTOR_NAMESPACE,
                lifetime="detached",
                max_restarts=0,
                **options,
            )
            .remote()
        )
        path = step.output_path
        with self._lock:
            self._actors[path] = actor
            cancelled = path in self._cancelled
        if cancelled:
            ray.kill(actor, no_restart=True)
        try:
            return ray.get(actor.run.remote(blob, [entry for entry in sys.path if entry], spec))
        except ray.exceptions.RayError as error:
            with self._lock:
                cancelled = path in self._cancelled
            if cancelled:
                raise StepCancelled("stopped: its Ray actor was killed (Backend.cancel)") from None
            raise StepFunctionError(f"the Ray worker running it was lost: {type(error).__name__}") from None
        finally:
            with self._lock:
                self._actors.pop(path, None)
                self._cancelled.discard(path)
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)

    def cancel(self, output_path: str) -> None:
        with self._lock:
            self._cancelled.add(output_path)
            actor = self._actors.get(output_path)
        if actor is not None:
            import ray

            ray.kill(actor, no_restart=True)

    def close(self) -> None:
        with self._lock:
            paths = list(self._actors)
        for path in paths:
            self.cancel(path)


def _prefix_of(step: ResolvedStep) -> str:
    return step.output_path.rsplit("/", 1)[0]


def _choices(resources: Any) -> list[tuple[str, dict[str, Any]]]:
    """(description, Ray options) per acceptable device, in order of preference."""
    if isinstance(resources, dict):
        return [("CPU", {"num_cpus": 1})]
    return [(device.describe(), resources.ray_options(device)) for device in resources.devices()]


def _fits(options: dict[str, Any], capacity: dict[str, float]) -> bool:
    wanted = {"CPU": options.get("num_cpus", 1) or 0, "GPU": options.get("num_gpus", 0) or 0}
    if options.get("memory"):
        wanted["memory"] = options["memory"]
    wanted.update(options.get("resources") or {})
    return all(capacity.get(name, 0) >= amount for name, amount in wanted.items() if amount)


def _describe_options(options: dict[str, Any]) -> str:
    parts = [f"{options.get('num_cpus', 1)} CPU"]
    if options.get("num_gpus"):
        parts.append(f"{options['num_gpus']} GPU")
    if options.get("memory"):
        parts.append(f"{options['memory'] / 2**30:.1f} GiB memory")
    parts.extend(f"{amount:g} {name}" for name, amount in (options.get("resources") or {}).items())
    return ", ".join(parts)


def _describe_capacity(capacity: dict[str, float]) -> str:
    shown = [
        f"{amount:g} {name}"
        for name, amount in sorted(capacity.items())
        if not name.startswith("node:") and name not in ("memory", "object_store_memory")
    ]
    return "{" + ", ".join(shown) + "}"


class StepHost:
    """A Ray actor that runs one heavy step (`executor.backends.host.run_hosted`) with its
    output captured into the step's log in the tree."""

    def run(self, blob: bytes, sys_path: list[str], spec: Any) -> dict[str, Any]:
        from executor.backends import extend_sys_path

        extend_sys_path(sys_path)
        import cloudpickle
        import ray

        from executor.backends.host import run_hosted
        from executor.logs import capture_step_log
        from executor.store import open_store

        fn, config = cloudpickle.loads(blob)
        try:
            with capture_step_log(open_store(spec.prefix), spec.output_path):
                node = ray.get_runtime_context().get_node_id()
                print(f"[executor] {spec.name}: on Ray node {node}, process {os.getpid()}", flush=True)
                return run_hosted(spec, fn, config)
        finally:
            # Detached, so it outlives a dead driver; nobody may be left to kill it.
            timer = threading.Timer(ACTOR_LINGER_S, os._exit, (0,))
            timer.daemon = True
            timer.start()
