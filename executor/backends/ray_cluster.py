"""The Ray backend: a step with `resources` runs as a Ray task on a node that has them.

    python experiments/my_study.py --backend ray                          # $RAY_ADDRESS, or a local Ray
    python experiments/my_study.py --backend ray --ray_address HOST:6379  # a running cluster

Ray is imported, and the driver connects, only when the first heavy step is dispatched: a
dry run, a fully cached re-run and a run of light steps never touch it. The address is
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
2. `call`: a Ray task with those options runs the function. The function and config travel
   pickled with cloudpickle, with the driver's `sys.path`, so functions from an experiment
   script resolve on the worker. On the worker, the task's stdout, stderr and logging go to
   the step's `.executor_log` in the output tree while it runs (the tree must be reachable
   from the workers: a bucket, or a local path on a one-machine cluster) and to Ray's own
   worker log. `ray.get` waits; the task's exception becomes the step's failure message.
3. `cancel`: `ray.cancel(force=True)` kills the worker process.

The lease stays with the driver (see `executor.lease`): if the driver dies, its tasks are
orphaned and the lease goes stale; the next driver takes the step over.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from executor.backends import Backend, StepFunctionError, UnsatisfiableError, is_heavy

if TYPE_CHECKING:
    from executor.graph import ResolvedStep

WAIT_FOR_NODES_ENV = "MARIN_RAY_WAIT_FOR_NODES"


class RayBackend(Backend):
    name = "ray"

    def __init__(self, address: str | None = None):
        self.address = address
        self._refs: dict[str, Any] = {}
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
    def prepare(self, step: ResolvedStep) -> dict[str, Any]:
        if not is_heavy(step):
            return super().prepare(step)
        ray = self._ray()
        choices = _choices(step.step.resources)
        nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
        for description, options in choices:
            if any(_fits(options, capacity) for capacity in nodes):
                return {"backend": self.name, "where": "ray", "device": description, "ray_options": options}
        if os.environ.get(WAIT_FOR_NODES_ENV, "").strip() in ("1", "true", "yes"):
            description, options = choices[0]
            return {"backend": self.name, "where": "ray", "device": description, "ray_options": options}
        asked = "; or ".join(
            f"{description} ({_describe_options(options)})" for description, options in choices
        )
        largest = ", ".join(_describe_capacity(capacity) for capacity in nodes) or "no live nodes"
        raise UnsatisfiableError(
            f"step {step.name!r} asks for {asked}, and no node of the Ray cluster has that "
            f"(nodes: {largest}). Add such a node, change the step's resources, or set "
            f"${WAIT_FOR_NODES_ENV}=1 if an autoscaler will add one"
        )

    def call(self, step: ResolvedStep, dispatch: dict[str, Any]) -> None:
        if dispatch.get("where") != "ray":
            return super().call(step, dispatch)
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
        task = ray.remote(_run_step_remotely).options(name=f"step:{step.name}", max_retries=0, **options)
        path = step.output_path
        ref = task.remote(blob, [entry for entry in sys.path if entry], _prefix_of(step), path)
        with self._lock:
            self._refs[path] = ref
            cancelled = path in self._cancelled
        if cancelled:
            ray.cancel(ref, force=True)
        try:
            ray.get(ref)
        except ray.exceptions.TaskCancelledError:
            raise StepFunctionError(
                "stopped: its Ray task was cancelled (lease lost or run interrupted)"
            ) from None
        except ray.exceptions.RayTaskError as error:
            cause = error.cause if getattr(error, "cause", None) is not None else error
            raise StepFunctionError(f"{type(cause).__name__}: {cause}") from None
        except ray.exceptions.RayError as error:  # worker or node died
            raise StepFunctionError(f"the Ray task was lost: {type(error).__name__}: {error}") from None
        finally:
            with self._lock:
                self._refs.pop(path, None)
                self._cancelled.discard(path)

    def cancel(self, output_path: str) -> None:
        with self._lock:
            self._cancelled.add(output_path)
            ref = self._refs.get(output_path)
        if ref is not None:
            import ray

            ray.cancel(ref, force=True)

    def close(self) -> None:
        with self._lock:
            paths = list(self._refs)
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


def _run_step_remotely(blob: bytes, sys_path: list[str], prefix: str, output_path: str) -> None:
    """On a Ray worker: the step function, with its output captured into the step's log."""
    for entry in reversed(sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    import cloudpickle

    from executor.logs import capture_step_log
    from executor.store import open_store

    fn, config = cloudpickle.loads(blob)
    with capture_step_log(open_store(prefix), output_path):
        fn(config)
