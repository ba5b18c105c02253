"""The Ray backend: a step with `resources` runs as a Ray task on a node that has them.

    python experiments/my_study.py --backend ray                          # $RAY_ADDRESS, or a local Ray
    python experiments/my_study.py --backend ray --ray_address HOST:6379  # a running cluster

Ray is imported, and the driver connects, when a run has steps to run: a dry run and a fully
cached re-run never touch it. While connected, data operations running in the driver
(`operations.shards`, tokenize) send their work to the cluster too. The address is
`--ray_address`, else `$RAY_ADDRESS`, else Ray starts a local cluster for this process.

Dispatch of one heavy step:

1. `prepare`: among the step's acceptable devices (`ResourceConfig.devices()`: the device,
   then `device_alternatives`, in order) the first that the live nodes of the cluster can
   hold in full (CPUs, memory, GPUs, custom resources: Ray's own resource names for TPUs and
   GPU types; for a gang, below, enough distinct such nodes) is chosen; the choice and the
   Ray options are recorded in `.executor_info` under `dispatch`. If the nodes can hold none
   of them the step fails at once with a message naming the step and what it asked for --
   Ray itself would keep the task pending forever. (An autoscaling cluster may add such
   nodes later; set `$MARIN_RAY_WAIT_FOR_NODES=1` to submit anyway.) A plain-dict
   `resources` asks for one CPU.
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

Gangs: a step that asks for several hosts -- `ResourceConfig.replicas` > 1, or a TPU slice
of several hosts (`TpuConfig.host_count`), N = replicas x hosts per slice -- runs as N
processes, one per host, that start together or not at all:

- a detached Ray placement group of N bundles, one host's resources each, strategy
  STRICT_SPREAD (each on a node of its own), is waited for (`_place`): all of it or none.
  For a TPU slice of several hosts, each slice's head (`TPU-<variant>-head`, on worker 0;
  only of a slice whose hosts are all live) is reserved first and the slice's hosts are then
  pinned to that slice by Ray's node label `ray.io/tpu-slice-name`, as Ray's own
  `ray.util.tpu.SlicePlacementGroup` does, and in the order of their `ray.io/tpu-worker-id`:
  process i is worker i % hosts of slice i // hosts. While it waits, the cluster is checked
  again every few seconds: if its live nodes can no longer hold the gang the step fails
  (`StepRefused`, not re-submitted) with the message `prepare` gives;
  `$MARIN_RAY_PLACEMENT_TIMEOUT` (seconds) bounds the wait, after which the attempt counts
  as lost (re-submitted, `--max_retries`). Otherwise it waits, as Ray does for a single
  actor whose resources are busy.
- process 0 is the `StepHost` above, in bundle 0: it picks the JAX coordinator's address
  (its node's IP, a free port) and reports it before the others start; then processes
  1..N-1 (`GangMember`, one per bundle) and process 0 run the function, each with its
  place in the gang in the environment (`executor.backends.DistributedProcess`:
  `$MARIN_COORDINATOR_ADDRESS`, `$MARIN_NUM_PROCESSES`, `$MARIN_PROCESS_ID`; read by
  `operations.train.initialize_distributed`). On TPUs JAX reads the slice's own metadata
  instead, and several slices get Megascale's variables (`MEGASCALE_COORDINATOR_ADDRESS`, ...).
- only process 0 keeps the books: the lease, the status, `.executor_info` (where it adds
  the gang to `dispatch`: the coordinator and each process's node). Process i > 0 writes
  its output to `<output>/logs/process-<i>.log`; process 0's goes to `.executor_log`.
- failure as a unit: the driver waits on all N. A process that dies (its actor or node
  lost), or raises while process 0 does not finish within `GANG_GRACE_S`, stops the gang:
  every actor is killed and the attempt is reported lost (`StepFunctionError`), so the
  runner takes the lease back and submits the whole gang again (`--max_retries`); a
  training step resumes from its last checkpoint. Process 0 itself, when its function
  raised, first waits up to `GANG_GRACE_S` for the others: if one of them died, the error
  was the lost peer's (a collective cut short) and it records nothing, leaving the retry
  to the driver; otherwise it records FAILED as a single process does.
- when no driver is left, process 0 removes the placement group (and with it every
  process of the gang) `ACTOR_LINGER_S` after it finished; a driver that submits the step
  again first removes a gang's group left by an earlier attempt (found by its name).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from executor.backends import (
    Backend,
    DistributedProcess,
    StepCancelled,
    StepFunctionError,
    StepRefused,
    UnsatisfiableError,
    is_heavy,
)

if TYPE_CHECKING:
    from executor.graph import ResolvedStep

WAIT_FOR_NODES_ENV = "MARIN_RAY_WAIT_FOR_NODES"

PLACEMENT_TIMEOUT_ENV = "MARIN_RAY_PLACEMENT_TIMEOUT"
"""Seconds a gang's placement group may take to be placed; unset: as long as the cluster
could place it."""

ACTOR_NAMESPACE = "marin-executor"

ACTOR_LINGER_S = 30.0
"""A finished step host exits this long after returning its result, if no driver killed it."""

GANG_STRATEGY = "STRICT_SPREAD"

GANG_GRACE_S = 60.0
"""How long process 0 of a gang, its function having raised, waits to learn whether another
process died (Ray notices a dead process at once, a lost node within its health check's
~30 s); and how long the driver, another process having raised, waits for process 0 to
finish and record the failure before it stops the gang."""

GANG_FINISH_S = 300.0
"""How long process 0, its function done, waits for the other processes to return."""

PLACEMENT_POLL_S = 2.0
"""How often a waiting gang's placement (and the cluster's capacity for it) is checked."""

TPU_SLICE_LABEL = "ray.io/tpu-slice-name"
TPU_WORKER_LABEL = "ray.io/tpu-worker-id"
TPU_POD_TYPE_LABEL = "ray.io/tpu-pod-type"
"""Ray's labels on TPU nodes (`ray._raylet.RAY_NODE_TPU_*_KEY`)."""

PROCESS_LOG_DIR = "logs"
"""Process i > 0 of a gang writes its output to `<output>/logs/process-<i>.log`."""


def process_log_path(output_path: str, process_id: int) -> str:
    return f"{output_path.rstrip('/')}/{PROCESS_LOG_DIR}/process-{process_id}.log"


@dataclass
class _Gang:
    """A gang running in the driver's view: what `cancel` and the cleanup stop."""

    groups: list[Any]
    actors: list[Any]


class RayBackend(Backend):
    name = "ray"

    def __init__(self, address: str | None = None):
        self.address = address
        self._actors: dict[str, Any] = {}
        self._gangs: dict[str, _Gang] = {}
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
        nodes = _live_nodes(ray)
        for choice in choices:
            if choice.placeable(nodes):
                return self._dispatch_record(choice)
        if os.environ.get(WAIT_FOR_NODES_ENV, "").strip() in ("1", "true", "yes"):
            return self._dispatch_record(choices[0])
        raise UnsatisfiableError(_unsatisfiable_message(step.name, choices, nodes))

    def _dispatch_record(self, choice: _Choice) -> dict[str, Any]:
        record = {
            "backend": self.name,
            "where": "ray",
            "hosted": True,
            "device": choice.description,
            "ray_options": choice.options,
        }
        if choice.processes > 1:
            record["gang"] = choice.gang_record()
        return record

    def call_hosted(self, step: ResolvedStep, dispatch: dict[str, Any], spec: Any) -> dict[str, Any]:
        """The step in a detached Ray actor (`StepHost`) that holds the lease and records the
        result itself: it finishes even if this driver dies (Ray would kill a plain task
        with its driver). The actor is killed once its result is read, or exits by itself
        shortly after finishing when nobody is left to read it. A gang (`dispatch["gang"]`)
        runs as one such actor and N - 1 `GangMember`s (see the module docstring)."""
        ray = self._ray()
        blob = _pickled(step)
        if dispatch.get("gang"):
            return self._call_gang(step, dispatch, spec, blob)
        options = dict(dispatch["ray_options"])
        options.setdefault("num_cpus", 1)
        actor = _detached_actor(ray, StepHost, f"marin-step:{step.name}:{os.urandom(4).hex()}", options)
        path = step.output_path
        with self._lock:
            self._actors[path] = actor
            cancelled = path in self._cancelled
        if cancelled:
            ray.kill(actor, no_restart=True)
        try:
            return ray.get(actor.run.remote(blob, _sys_path(), spec))
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

    # -- gangs ----------------------------------------------------------------------
    def _call_gang(
        self, step: ResolvedStep, dispatch: dict[str, Any], spec: Any, blob: bytes
    ) -> dict[str, Any]:
        ray = self._ray()
        path = step.output_path
        choice = _Choice.from_dispatch(dispatch)
        gang = _Gang(groups=[], actors=[])
        with self._lock:
            self._gangs[path] = gang
        try:
            _remove_groups_named(ray, _group_name(step))
            _place(ray, step, choice, gang, self._is_cancelled)
            return self._run_gang(ray, step, choice, gang, spec, blob)
        finally:
            with self._lock:
                self._gangs.pop(path, None)
                self._cancelled.discard(path)
            _stop_gang(ray, gang)

    def _is_cancelled(self, path: str) -> bool:
        with self._lock:
            return path in self._cancelled

    def _run_gang(
        self, ray: Any, step: ResolvedStep, choice: _Choice, gang: _Gang, spec: Any, blob: bytes
    ) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        path = step.output_path
        group = gang.groups[-1]  # the hosts' group (a TPU slice's head groups come first)
        nodes = {node["NodeID"]: node for node in ray.nodes()}
        table = ray.util.placement_group_table(group)
        on_node = [table["bundles_to_node_id"][index] for index in range(choice.processes)]
        tag = os.urandom(4).hex()

        def actor(cls: type, index: int) -> Any:
            bundle = choice.bundles[index]
            extra = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")}
            options: dict[str, Any] = {
                "num_cpus": bundle.get("CPU", 0),
                "num_gpus": bundle.get("GPU", 0),
                "resources": extra,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=index
                ),
            }
            if bundle.get("memory"):
                options["memory"] = bundle["memory"]
            handle = _detached_actor(ray, cls, f"marin-step:{step.name}:{tag}:process-{index}", options)
            gang.actors.append(handle)
            return handle

        host = actor(StepHost, 0)
        try:
            coordinator = ray.get(host.coordinator_address.remote())
        except ray.exceptions.RayError as error:
            raise self._lost(
                path, f"process 0 of {choice.processes} could not start: {type(error).__name__}"
            ) from None
        records = [
            {"process": index, "node": node, "ip": nodes.get(node, {}).get("NodeManagerAddress")}
            for index, node in enumerate(on_node)
        ]
        environments = [
            choice.environment(index, coordinator, records[0]["ip"]) for index in range(choice.processes)
        ]
        members = [actor(GangMember, index) for index in range(1, choice.processes)]
        member_results = [
            member.run.remote(blob, _sys_path(), spec, index, choice.processes, environments[index])
            for index, member in enumerate(members, start=1)
        ]
        start = {
            "record": {"coordinator": coordinator if choice.tpu is None else None, "processes_on": records},
            "env": environments[0],
            "peers": members,
            "peer_results": member_results,
            "groups": list(gang.groups),
        }
        if self._is_cancelled(path):
            raise StepCancelled("stopped: its Ray actors were killed (Backend.cancel)")
        results = [host.run.remote(blob, _sys_path(), spec, start), *member_results]
        return self._wait_gang(ray, path, choice, results, records)

    def _wait_gang(
        self, ray: Any, path: str, choice: _Choice, results: list[Any], records: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Process 0's result, once it has one; `StepFunctionError` as soon as any process is
        lost, or raised while process 0 does not finish within `GANG_GRACE_S`."""
        count = choice.processes
        pending = list(results)
        while True:
            ready, _ = ray.wait(pending, num_returns=1)
            (done,) = ready
            index = results.index(done)
            pending.remove(done)
            try:
                result = ray.get(done)
            except ray.exceptions.RayError as error:
                where = records[index]["node"]
                raise self._lost(
                    path, f"process {index} of {count} (Ray node {where}) was lost: {type(error).__name__}"
                ) from None
            if index == 0:
                if result["outcome"] == "gang_lost":
                    raise self._lost(path, result["error"])
                return result
            if result["outcome"] != "succeeded":
                finished, _ = ray.wait([results[0]], timeout=GANG_GRACE_S)
                if finished:
                    pending = [results[0]]
                    continue
                raise self._lost(
                    path,
                    f"process {index} of {count} failed ({result['error']}) and process 0 did not finish "
                    f"within {GANG_GRACE_S:g} s",
                )

    def _lost(self, path: str, message: str) -> StepFunctionError:
        if self._is_cancelled(path):
            return StepCancelled("stopped: its Ray actors were killed (Backend.cancel)")
        return StepFunctionError(message)

    # -- stopping -------------------------------------------------------------------
    def cancel(self, output_path: str) -> None:
        with self._lock:
            self._cancelled.add(output_path)
            actor = self._actors.get(output_path)
            gang = self._gangs.get(output_path)
        if actor is not None:
            import ray

            ray.kill(actor, no_restart=True)
        if gang is not None:
            import ray

            _stop_gang(ray, gang)

    def close(self) -> None:
        with self._lock:
            paths = list(self._actors) + list(self._gangs)
        for path in paths:
            self.cancel(path)


def _detached_actor(ray: Any, cls: type, name: str, options: dict[str, Any]) -> Any:
    """An actor of `cls` that outlives the driver (detached) and is never restarted by Ray:
    a lost step is re-submitted by the runner, which takes its lease back first."""
    return (
        ray.remote(cls)
        .options(name=name, namespace=ACTOR_NAMESPACE, lifetime="detached", max_restarts=0, **options)
        .remote()
    )


def _pickled(step: ResolvedStep) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps((step.step.fn, step.config))
    except Exception as error:
        raise StepFunctionError(
            f"step {step.name!r}: its function and config cannot be sent to a Ray worker "
            f"({type(error).__name__}: {error}); make them picklable"
        ) from None


def _sys_path() -> list[str]:
    return [entry for entry in sys.path if entry]


def _prefix_of(step: ResolvedStep) -> str:
    return step.output_path.rsplit("/", 1)[0]


# ---------------------------------------------------------------------------- what is asked


@dataclass(frozen=True)
class _Choice:
    """One acceptable device of a step: its description, the Ray options of one process, and
    the bundles of its gang (one per process, in process order; one bundle: no gang)."""

    description: str
    options: dict[str, Any]
    bundles: tuple[dict[str, float], ...]
    replicas: int = 1
    hosts_per_replica: int = 1
    tpu: str | None = None
    """The TPU variant, for a TPU slice (its head resource, its nodes' pod type label)."""

    @property
    def processes(self) -> int:
        return len(self.bundles)

    @property
    def multi_host_slices(self) -> bool:
        return self.tpu is not None and self.hosts_per_replica > 1

    def environment(self, index: int, coordinator: str, coordinator_ip: str | None) -> dict[str, str]:
        """What process `index` finds in its environment: its place in the gang; on TPUs JAX
        reads the slice's metadata itself, and several slices talk through Megascale."""
        if self.tpu is None:
            return DistributedProcess(coordinator, self.processes, index).env()
        if self.replicas == 1:
            return {}
        return {
            "MEGASCALE_COORDINATOR_ADDRESS": f"{coordinator_ip}:8081",
            "MEGASCALE_PORT": "8081",
            "MEGASCALE_NUM_SLICES": str(self.replicas),
            "MEGASCALE_SLICE_ID": str(index // self.hosts_per_replica),
        }

    def gang_record(self) -> dict[str, Any]:
        return {
            "processes": self.processes,
            "replicas": self.replicas,
            "hosts_per_replica": self.hosts_per_replica,
            "bundles": list(self.bundles),
            "strategy": GANG_STRATEGY,
        }

    @staticmethod
    def from_dispatch(dispatch: dict[str, Any]) -> _Choice:
        gang = dispatch["gang"]
        return _Choice(
            description=dispatch["device"],
            options=dispatch["ray_options"],
            bundles=tuple(gang["bundles"]),
            replicas=gang["replicas"],
            hosts_per_replica=gang["hosts_per_replica"],
            tpu=_tpu_variant(dispatch["ray_options"]),
        )

    # -- can the cluster hold it --------------------------------------------------------
    def placeable(self, nodes: list[dict[str, Any]]) -> bool:
        if self.processes == 1:
            return any(_fits(self.bundles[0], _capacity(node)) for node in nodes)
        if self.multi_host_slices:
            return len(self._whole_slices(nodes)) >= self.replicas
        # Every process asks for the same bundle, each on a node of its own (STRICT_SPREAD).
        return sum(_fits(self.bundles[0], _capacity(node)) for node in nodes) >= self.processes

    def _whole_slices(self, nodes: list[dict[str, Any]]) -> list[str]:
        """Slices (by Ray's slice-name label) of this TPU type whose worker 0 has the head
        resource and that have enough hosts with the chips of one host."""
        head = f"TPU-{self.tpu}-head"
        by_slice: dict[str, list[dict[str, Any]]] = {}
        for node in nodes:
            labels = node.get("Labels") or {}
            if labels.get(TPU_POD_TYPE_LABEL) == self.tpu and labels.get(TPU_SLICE_LABEL):
                by_slice.setdefault(labels[TPU_SLICE_LABEL], []).append(node)
        whole = []
        for name, members in by_slice.items():
            hosts = [node for node in members if _fits(self.bundles[0], _capacity(node))]
            if len(hosts) >= self.hosts_per_replica and any(
                _capacity(node).get(head, 0) >= 1 for node in members
            ):
                whole.append(name)
        return whole


def _choices(resources: Any) -> list[_Choice]:
    """The step's acceptable devices, in order of preference."""
    if isinstance(resources, dict):
        return [_Choice("CPU", {"num_cpus": 1}, ({"CPU": 1},))]
    choices = []
    for device in resources.devices():
        options = resources.ray_options(device)
        hosts = getattr(device, "host_count", 1) if device.kind == "tpu" else 1
        processes = resources.replicas * hosts
        description = device.describe()
        tpu = device.variant if device.kind == "tpu" else None
        if processes == 1:
            choices.append(_Choice(description, options, (_bundle(options),), tpu=tpu))
            continue
        if tpu is not None and hosts > 1:
            # The head is reserved apart (`_place`); every host of the slice asks for its chips.
            bundles = (_bundle({**options, "resources": {"TPU": options["resources"]["TPU"]}}),) * processes
        else:
            bundles = (_bundle(options),) * processes
        if resources.replicas > 1:
            description += f" x{resources.replicas} " + ("slices" if tpu is not None else "replicas")
        choices.append(
            _Choice(
                description, options, bundles, replicas=resources.replicas, hosts_per_replica=hosts, tpu=tpu
            )
        )
    return choices


def _tpu_variant(options: dict[str, Any]) -> str | None:
    for name in options.get("resources") or {}:
        if name.startswith("TPU-") and name.endswith("-head"):
            return name[len("TPU-") : -len("-head")]
    return None


def _bundle(options: dict[str, Any]) -> dict[str, float]:
    """One process's Ray options as a placement group bundle (no zero amounts)."""
    bundle = {"CPU": options.get("num_cpus", 1), "GPU": options.get("num_gpus", 0) or 0}
    if options.get("memory"):
        bundle["memory"] = options["memory"]
    bundle.update(options.get("resources") or {})
    return {name: amount for name, amount in bundle.items() if amount}


def _capacity(node: dict[str, Any]) -> dict[str, float]:
    return node.get("Resources", {})


def _live_nodes(ray: Any) -> list[dict[str, Any]]:
    return [node for node in ray.nodes() if node.get("Alive")]


def _fits(bundle: dict[str, float], capacity: dict[str, float]) -> bool:
    return all(capacity.get(name, 0) >= amount for name, amount in bundle.items() if amount)


def _describe_bundle(bundle: dict[str, float]) -> str:
    parts = [f"{bundle.get('CPU', 0):g} CPU"]
    if bundle.get("GPU"):
        parts.append(f"{bundle['GPU']:g} GPU")
    if bundle.get("memory"):
        parts.append(f"{bundle['memory'] / 2**30:.1f} GiB memory")
    parts.extend(
        f"{amount:g} {name}" for name, amount in bundle.items() if name not in ("CPU", "GPU", "memory")
    )
    return ", ".join(parts)


def _describe_choice(choice: _Choice) -> str:
    if choice.processes == 1:
        return f"{choice.description} ({_describe_bundle(choice.bundles[0])})"
    if choice.multi_host_slices:
        return (
            f"{choice.description}: {choice.replicas} whole slice(s) of {choice.hosts_per_replica} hosts "
            f"({_describe_bundle(choice.bundles[0])} each, TPU-{choice.tpu}-head on worker 0; nodes labelled "
            f"{TPU_SLICE_LABEL} and {TPU_POD_TYPE_LABEL}={choice.tpu})"
        )
    return (
        f"{choice.description}: {choice.processes} processes on {choice.processes} different nodes, "
        f"each with {_describe_bundle(choice.bundles[0])}"
    )


def _describe_capacity(capacity: dict[str, float]) -> str:
    shown = [
        f"{amount:g} {name}"
        for name, amount in sorted(capacity.items())
        if not name.startswith("node:") and name not in ("memory", "object_store_memory")
    ]
    return "{" + ", ".join(shown) + "}"


def _unsatisfiable_message(name: str, choices: list[_Choice], nodes: list[dict[str, Any]]) -> str:
    asked = "; or ".join(_describe_choice(choice) for choice in choices)
    largest = ", ".join(_describe_capacity(_capacity(node)) for node in nodes) or "no live nodes"
    if all(choice.processes == 1 for choice in choices):
        return (
            f"step {name!r} asks for {asked}, and no node of the Ray cluster has that (nodes: {largest}). "
            f"Add such a node, change the step's resources, or set ${WAIT_FOR_NODES_ENV}=1 if an "
            "autoscaler will add one"
        )
    return (
        f"step {name!r} asks for {asked}, and the live nodes of the Ray cluster cannot hold that "
        f"(nodes: {largest}). Add such nodes, lower ResourceConfig.replicas, change the step's "
        f"resources, or set ${WAIT_FOR_NODES_ENV}=1 if an autoscaler will add them"
    )


# ---------------------------------------------------------------------------- placement


def _group_name(step: ResolvedStep) -> str:
    """A gang's placement group name, the same for every attempt at one output."""
    digest = hashlib.sha256(step.output_path.encode()).hexdigest()[:16]
    return f"marin-gang:{step.name[:60]}:{digest}"


def _remove_groups_named(ray: Any, name: str) -> None:
    """Remove the placement groups (and so the processes) an earlier attempt at this output
    left: we hold its lease now, so whatever ran there lost it."""
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    for group_id, info in ray.util.placement_group_table().items():
        if info.get("name", "").startswith(name) and info.get("state") != "REMOVED":
            with contextlib.suppress(Exception):
                remove_placement_group(PlacementGroup(ray.PlacementGroupID.from_hex(group_id)))


def _place(ray: Any, step: ResolvedStep, choice: _Choice, gang: _Gang, cancelled: Any) -> None:
    """Reserve the gang's hosts, all or none (module docstring); the groups go into `gang`."""
    from ray.util.placement_group import placement_group

    name = _group_name(step)
    timeout = _placement_timeout()
    deadline = None if timeout is None else time.monotonic() + timeout
    selectors: list[dict[str, str]] | None = None
    if choice.multi_host_slices:
        slice_names: list[str] = []
        # Only the head of a slice whose hosts are all there: an incomplete slice's head,
        # once reserved, would keep the gang waiting for hosts that do not exist.
        whole = choice._whole_slices(_live_nodes(ray))
        for index in range(choice.replicas):
            selector = {TPU_WORKER_LABEL: "0", TPU_POD_TYPE_LABEL: choice.tpu}
            if whole:
                selector[TPU_SLICE_LABEL] = f"in({','.join(sorted(whole))})"
            head = placement_group(
                [{f"TPU-{choice.tpu}-head": 1}],
                name=f"{name}:head-{index}",
                lifetime="detached",
                bundle_label_selector=[selector],
            )
            gang.groups.append(head)
            _wait_placed(ray, step, choice, head, deadline, cancelled)
            slice_names.append(_slice_of(ray, head))
        # Process i is worker i % hosts of slice i // hosts: process 0 is slice 0's worker 0,
        # where the coordinators run (JAX's, from the slice metadata; Megascale's).
        selectors = [
            {
                TPU_SLICE_LABEL: slice_names[index // choice.hosts_per_replica],
                TPU_WORKER_LABEL: str(index % choice.hosts_per_replica),
            }
            for index in range(choice.processes)
        ]
    hosts = placement_group(
        [dict(bundle) for bundle in choice.bundles],
        strategy=GANG_STRATEGY,
        name=name,
        lifetime="detached",
        **({"bundle_label_selector": selectors} if selectors else {}),
    )
    gang.groups.append(hosts)
    _wait_placed(ray, step, choice, hosts, deadline, cancelled)


def _placement_timeout() -> float | None:
    text = os.environ.get(PLACEMENT_TIMEOUT_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1
    if not value > 0:
        raise StepRefused(f"${PLACEMENT_TIMEOUT_ENV}={text!r}: must be a positive number of seconds")
    return value


def _wait_placed(
    ray: Any, step: ResolvedStep, choice: _Choice, group: Any, deadline: float | None, cancelled: Any
) -> None:
    while True:
        ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_POLL_S)
        if ready:
            return
        if cancelled(step.output_path):
            raise StepCancelled("stopped while its gang waited for hosts (Backend.cancel)")
        nodes = _live_nodes(ray)
        if not choice.placeable(nodes) and os.environ.get(WAIT_FOR_NODES_ENV, "").strip() not in (
            "1",
            "true",
            "yes",
        ):
            raise StepRefused(_unsatisfiable_message(step.name, [choice], nodes))
        if deadline is not None and time.monotonic() > deadline:
            raise StepFunctionError(
                f"its gang ({_describe_choice(choice)}) was not placed within "
                f"{_placement_timeout():g} s (${PLACEMENT_TIMEOUT_ENV}); the hosts are busy"
            )


def _slice_of(ray: Any, head_group: Any) -> str:
    """The slice name label of the node a head group landed on."""
    node = ray.util.placement_group_table(head_group)["bundles_to_node_id"][0]
    for live in ray.nodes():
        if live["NodeID"] == node:
            name = (live.get("Labels") or {}).get(TPU_SLICE_LABEL)
            if name:
                return name
    raise StepFunctionError(
        f"the TPU head node {node} has no {TPU_SLICE_LABEL} label; cannot keep a slice together"
    )


def _stop_gang(ray: Any, gang: _Gang) -> None:
    """Kill the gang's actors and remove its placement groups (which also kills what runs there)."""
    from ray.util.placement_group import remove_placement_group

    for actor in list(gang.actors):
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
    for group in list(gang.groups):
        with contextlib.suppress(Exception):
            remove_placement_group(group)


# ---------------------------------------------------------------------------- the processes


class StepHost:
    """A Ray actor that runs one heavy step (`executor.backends.host.run_hosted`) with its
    output captured into the step's log in the tree; process 0 of a gang."""

    def coordinator_address(self) -> str:
        """`<this node's IP>:<a free port>` for JAX's coordination service (process 0 of a gang)."""
        import ray

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return f"{ray.util.get_node_ip_address()}:{port}"

    def run(
        self, blob: bytes, sys_path: list[str], spec: Any, gang: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        from executor.backends import CHILD_ENV_DROPPED, extend_sys_path

        extend_sys_path(sys_path)
        for name in CHILD_ENV_DROPPED:  # from the node's start-up environment: not this step's
            os.environ.pop(name, None)
        import cloudpickle
        import ray

        from executor.backends.host import run_hosted
        from executor.logs import capture_step_log
        from executor.store import open_store

        fn, config = cloudpickle.loads(blob)
        groups = [] if gang is None else gang["groups"]
        try:
            with capture_step_log(open_store(spec.prefix), spec.output_path):
                node = ray.get_runtime_context().get_node_id()
                if gang is None:
                    print(f"[executor] {spec.name}: on Ray node {node}, process {os.getpid()}", flush=True)
                    return run_hosted(spec, fn, config)
                count = len(gang["peers"]) + 1
                print(
                    f"[executor] {spec.name}: process 0 of {count} on Ray node {node}, process {os.getpid()}, "
                    f"coordinator {gang['record']['coordinator']}",
                    flush=True,
                )
                os.environ.update(gang["env"])
                peers = _Peers(gang["peers"], gang["peer_results"])
                return run_hosted(
                    spec,
                    fn,
                    config,
                    on_start=lambda: _record_gang(spec, gang["record"]),
                    peers_lost=peers.lost,
                )
        finally:
            # Detached, so it outlives a dead driver; nobody may be left to kill it (or its gang).
            timer = threading.Timer(ACTOR_LINGER_S, _exit, (groups,))
            timer.daemon = True
            timer.start()


class GangMember:
    """A Ray actor that runs process `index` > 0 of a gang: the step function only, with its
    output in `<output>/logs/process-<index>.log`; the books are process 0's."""

    def run(
        self, blob: bytes, sys_path: list[str], spec: Any, index: int, count: int, env: dict[str, str]
    ) -> dict[str, Any]:
        from executor.backends import CHILD_ENV_DROPPED, extend_sys_path

        extend_sys_path(sys_path)
        for name in CHILD_ENV_DROPPED:  # from the node's start-up environment: not this step's
            os.environ.pop(name, None)
        import traceback

        import cloudpickle
        import ray

        from executor.backends.host import capture_process_log
        from executor.store import open_store

        fn, config = cloudpickle.loads(blob)
        with capture_process_log(open_store(spec.prefix), process_log_path(spec.output_path, index)):
            node = ray.get_runtime_context().get_node_id()
            print(
                f"[executor] {spec.name}: process {index} of {count} on Ray node {node}, process {os.getpid()}",
                flush=True,
            )
            os.environ.update(env)
            try:
                fn(config)
            except BaseException as error:  # SystemExit too: the step failed in this process
                traceback.print_exc()
                return {"outcome": "failed", "error": f"{type(error).__name__}: {error}"}
            return {"outcome": "succeeded", "error": None}


class _Peers:
    """Process 0's view of the other processes of its gang (their actors and pending results)."""

    def __init__(self, actors: list[Any], results: list[Any]):
        self.actors, self.results = actors, results

    def lost(self, failed: bool) -> str | None:
        """Why the gang is lost (another process died, or failed after this one succeeded), or
        None. Waits for the others' results: `GANG_GRACE_S` when this process's function
        raised, `GANG_FINISH_S` when it returned. Those still running afterwards are killed."""
        import ray

        count = len(self.results) + 1
        ready, _ = ray.wait(
            self.results, num_returns=len(self.results), timeout=GANG_GRACE_S if failed else GANG_FINISH_S
        )
        why = None
        for index, result in enumerate(self.results, start=1):
            if result not in ready:
                continue
            try:
                outcome = ray.get(result)
            except ray.exceptions.RayError as error:
                why = why or f"process {index} of {count} was lost ({type(error).__name__})"
                continue
            if outcome["outcome"] != "succeeded" and not failed:
                why = why or f"process {index} of {count} failed after process 0 finished: {outcome['error']}"
        for actor, result in zip(self.actors, self.results, strict=True):
            if result not in ready:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
        if why:
            print(
                f"[executor] the gang is lost: {why}; recording nothing (the driver submits it again)",
                flush=True,
            )
        return why


def _record_gang(spec: Any, record: dict[str, Any]) -> None:
    """Add where the gang runs (coordinator, node per process) to `.executor_info`'s dispatch."""
    from executor.store import open_store
    from executor.tree import read_info, write_info

    store = open_store(spec.prefix)
    info = read_info(store, spec.output_path)
    if info is None or not isinstance(info.get("dispatch"), dict):
        return
    info["dispatch"].setdefault("gang", {}).update(record)
    write_info(store, info)


def _exit(groups: list[Any]) -> None:
    from ray.util.placement_group import remove_placement_group

    for group in groups:
        with contextlib.suppress(Exception):
            remove_placement_group(group)  # kills the gang's processes, this one too
    os._exit(0)
