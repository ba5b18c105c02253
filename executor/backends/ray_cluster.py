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
  While it waits, the cluster is checked again every few seconds: if its live nodes can no
  longer hold the gang the step fails (`StepRefused`, not re-submitted) with the message
  `prepare` gives; `$MARIN_RAY_PLACEMENT_TIMEOUT` (seconds) bounds the wait, after which the
  attempt counts as lost (re-submitted, `--max_retries`). Otherwise it waits, as Ray does
  for a single actor whose resources are busy.
- TPU slices are reserved first, by Levanter (`_reserve_slices`): one detached
  `levanter.infra.ray_tpu.SliceActor` per slice holds its head (`TPU-<variant>-head`, on
  worker 0; for slices of several hosts only of a slice whose hosts are all live, by Ray's
  node labels), reads the slice's name and address from the TPU host and starts a
  `TPUHostActor` on each of its hosts, which reports the host's TPU worker id and Ray node.
  Of the step's TPU choices (`ResourceConfig.with_tpu([...])`: the one `prepare` chose and
  the later ones the cluster can hold) the first whose heads are all free is taken, else
  the first. The bundles are then pinned to those nodes (`ray.io/node-id`) in worker order:
  process i is worker i % hosts of slice i // hosts. Levanter's `run_on_pod`, which also
  launches the processes, is not used: see docs/cluster.md ("Why not Levanter's run_on_pod").
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
- when no driver is left, process 0 kills the SliceActors and removes the placement group
  (and with it every process of the gang) `ACTOR_LINGER_S` after it finished; a driver that
  submits the step again first removes a gang's group and SliceActors left by an earlier
  attempt (found by their names).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
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

NODE_ID_LABEL = "ray.io/node-id"
"""Ray's label of every node with its id: pins a TPU gang's processes to the hosts reserved."""

SLICE_RESERVER = "levanter.infra.ray_tpu.SliceActor"
"""What reserves a TPU gang's slices (recorded in `.executor_info`)."""

PROCESS_LOG_DIR = "logs"
"""Process i > 0 of a gang writes its output to `<output>/logs/process-<i>.log`."""


def process_log_path(output_path: str, process_id: int) -> str:
    return f"{output_path.rstrip('/')}/{PROCESS_LOG_DIR}/process-{process_id}.log"


@dataclass
class _Gang:
    """A gang running in the driver's view: what `cancel` and the cleanup stop."""

    groups: list[Any]
    actors: list[Any]
    reservations: list[Any] = field(default_factory=list)
    """For TPU slices: Levanter's `SliceActor`s that hold them (`_reserve_slices`)."""


@dataclass(frozen=True)
class _Slice:
    """A TPU slice reserved for a gang by Levanter's `SliceActor` (`_reserve_slices`)."""

    name: str
    """Its name (`TPU_NAME` / the TPU VM's instance id), as Levanter's `SliceActor` read it."""
    ip: str
    """Its worker 0's address, as Levanter's `SliceActor` read it (Megascale's coordinator)."""
    nodes: tuple[str, ...]
    """The Ray node of each host, in the order of their TPU worker ids."""

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "ip": self.ip, "nodes": list(self.nodes)}


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
            deadline = _placement_deadline()
            slices: list[_Slice] = []
            if choice.tpu is not None:
                candidates = _slice_candidates(step, choice, _live_nodes(ray))
                choice, slices = _reserve_slices(ray, step, candidates, gang, self._is_cancelled, deadline)
            _place(ray, step, choice, gang, self._is_cancelled, deadline, slices)
            return self._run_gang(ray, step, choice, gang, spec, blob, slices)
        finally:
            with self._lock:
                self._gangs.pop(path, None)
                self._cancelled.discard(path)
            _stop_gang(ray, gang)

    def _is_cancelled(self, path: str) -> bool:
        with self._lock:
            return path in self._cancelled

    def _run_gang(
        self,
        ray: Any,
        step: ResolvedStep,
        choice: _Choice,
        gang: _Gang,
        spec: Any,
        blob: bytes,
        slices: list[_Slice],
    ) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        path = step.output_path
        (group,) = gang.groups  # the hosts' group
        bundles = _host_bundles(choice, slices)
        nodes = {node["NodeID"]: node for node in ray.nodes()}
        table = ray.util.placement_group_table(group)
        on_node = [table["bundles_to_node_id"][index] for index in range(choice.processes)]
        tag = os.urandom(4).hex()

        def actor(cls: type, index: int) -> Any:
            bundle = bundles[index]
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
        # Several TPU slices talk through Megascale, its coordinator on slice 0's worker 0 (the
        # address Levanter's SliceActor found there, as Levanter's run_on_pod uses it).
        coordinator_ip = slices[0].ip if slices else records[0]["ip"]
        environments = [
            choice.environment(index, coordinator, coordinator_ip) for index in range(choice.processes)
        ]
        members = [actor(GangMember, index) for index in range(1, choice.processes)]
        member_results = [
            member.run.remote(blob, _sys_path(), spec, index, choice.processes, environments[index])
            for index, member in enumerate(members, start=1)
        ]
        gang_record: dict[str, Any] = {
            **choice.gang_record(),
            "bundles": [dict(bundle) for bundle in bundles],
            "coordinator": coordinator if choice.tpu is None else None,
            "processes_on": records,
        }
        if slices:
            gang_record["slices"] = [piece.record() for piece in slices]
            gang_record["slices_reserved_by"] = SLICE_RESERVER
        start = {
            # what process 0 writes into `.executor_info`'s dispatch: the device is the one
            # whose slices were reserved, which may be an alternative to the one `prepare` chose
            "record": {"device": choice.description, "ray_options": choice.options, "gang": gang_record},
            "env": environments[0],
            "peers": members,
            "peer_results": member_results,
            "groups": list(gang.groups),
            "reservations": list(gang.reservations),
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
    for actor in ray.util.list_named_actors(all_namespaces=True):  # TPU slices' SliceActors
        if actor["name"].startswith(name) and actor.get("namespace") == ACTOR_NAMESPACE:
            with contextlib.suppress(Exception):
                ray.kill(ray.get_actor(actor["name"], namespace=ACTOR_NAMESPACE), no_restart=True)


def _slice_candidates(step: ResolvedStep, chosen: _Choice, nodes: list[dict[str, Any]]) -> list[_Choice]:
    """The TPU slices a gang may take, in the step's order of preference: the one `prepare`
    chose (the first the cluster can hold), then the later alternatives of
    `ResourceConfig.with_tpu([...])` that are TPU gangs too and that the live nodes can hold."""
    choices = [c for c in _choices(step.step.resources) if c.tpu is not None and c.processes > 1]
    later = False
    candidates = [chosen]
    for choice in choices:
        if later and choice.placeable(nodes):
            candidates.append(choice)
        later = later or choice.description == chosen.description
    return candidates


def _reserve_slices(
    ray: Any,
    step: ResolvedStep,
    candidates: list[_Choice],
    gang: _Gang,
    cancelled: Any,
    deadline: float | None,
) -> tuple[_Choice, list[_Slice]]:
    """Reserve a TPU gang's slices with Levanter's `SliceActor`s: the first candidate whose
    slice heads are all free now, else the first (preferred) one, for which it waits. Each
    `SliceActor` holds `TPU-<variant>-head` (worker 0 of a slice), reads the slice's name, type
    and address from the TPU host (`TPU_NAME`, `TPU_ACCELERATOR_TYPE`: GKE's variables, or the
    GCE metadata server) and starts one `TPUHostActor` on each host of the slice (holding
    the slice's own resource, `{<slice name>: 1}`), which reports its worker id and Ray node."""
    from levanter.infra.ray_tpu import SliceActor, get_tpu_config

    free = ray.available_resources()
    choice = next(
        (c for c in candidates if free.get(f"TPU-{c.tpu}-head", 0) >= c.replicas),
        candidates[0],
    )
    try:
        vm_count = get_tpu_config(choice.tpu).vm_count
    except ValueError:
        raise StepRefused(
            f"step {step.name!r} asks for {choice.description}, which Levanter's TPU table "
            "(levanter.infra.ray_tpu.TPU_CONFIGS) does not know: it cannot reserve such a slice"
        ) from None
    if vm_count != choice.hosts_per_replica:
        raise StepRefused(
            f"step {step.name!r} asks for {choice.description}: Levanter counts {vm_count} hosts in such a "
            f"slice, this executor {choice.hosts_per_replica}; one of the two TPU tables is wrong"
        )
    selector: dict[str, str] = {}
    if choice.hosts_per_replica > 1:
        # Only the head of a slice whose hosts are all there: an incomplete slice's head,
        # once reserved, would keep the gang waiting for hosts that do not exist.
        selector = {TPU_WORKER_LABEL: "0", TPU_POD_TYPE_LABEL: choice.tpu}
        whole = choice._whole_slices(_live_nodes(ray))
        if whole:
            selector[TPU_SLICE_LABEL] = f"in({','.join(sorted(whole))})"
    name, tag = _group_name(step), os.urandom(4).hex()
    actors = []
    for index in range(choice.replicas):
        options: dict[str, Any] = {
            "resources": {f"TPU-{choice.tpu}-head": 1},
            "num_cpus": 0,  # Ray's default for an actor would hold one of the host's CPUs
            "name": f"{name}:slice-{index}:{tag}",
            "namespace": ACTOR_NAMESPACE,
            "lifetime": "detached",  # outlives the driver, as the gang does
            "max_restarts": 0,
        }
        if selector:
            options["label_selector"] = selector
        actor = SliceActor.options(**options).remote()
        gang.reservations.append(actor)
        actors.append(actor)
    infos = _wait_ready(ray, step, choice, [actor.get_info.remote() for actor in actors], deadline, cancelled)
    slices = []
    for actor, info in zip(actors, infos, strict=True):
        try:
            members = ray.get(actor.get_all_pool_members.remote())
        except ray.exceptions.RayError as error:
            raise StepFunctionError(
                f"TPU slice {info.slice_name}: its hosts could not be listed ({type(error).__name__})"
            ) from None
        hosts = sorted((member.actor_info for member in members), key=lambda host: host.worker_index)
        if [host.worker_index for host in hosts] != list(range(choice.hosts_per_replica)):
            raise StepFunctionError(
                f"TPU slice {info.slice_name}: Levanter reserved hosts with worker ids "
                f"{[host.worker_index for host in hosts]}, not 0..{choice.hosts_per_replica - 1}"
            )
        slices.append(_Slice(info.slice_name, info.ip_address, tuple(host.node_id for host in hosts)))
    return choice, slices


def _host_bundles(choice: _Choice, slices: list[_Slice]) -> tuple[dict[str, float], ...]:
    """The bundles of a gang's hosts: a TPU slice's head is held by Levanter's SliceActor."""
    if not slices:
        return choice.bundles
    return tuple(
        {
            name: amount
            for name, amount in bundle.items()
            if not (name.startswith("TPU-") and name.endswith("-head"))
        }
        for bundle in choice.bundles
    )


def _place(
    ray: Any,
    step: ResolvedStep,
    choice: _Choice,
    gang: _Gang,
    cancelled: Any,
    deadline: float | None,
    slices: list[_Slice],
) -> None:
    """Reserve the gang's hosts, all or none (module docstring); the group goes into `gang`.
    On TPU slices (`slices`, reserved first) process i is pinned to worker i % hosts of
    slice i // hosts: process 0 is slice 0's worker 0, where the coordinators run."""
    from ray.util.placement_group import placement_group

    selectors = None
    if slices:
        selectors = [
            {NODE_ID_LABEL: slices[index // choice.hosts_per_replica].nodes[index % choice.hosts_per_replica]}
            for index in range(choice.processes)
        ]
    hosts = placement_group(
        [dict(bundle) for bundle in _host_bundles(choice, slices)],
        strategy=GANG_STRATEGY,
        name=_group_name(step),
        lifetime="detached",
        **({"bundle_label_selector": selectors} if selectors else {}),
    )
    gang.groups.append(hosts)
    _wait_ready(ray, step, choice, [hosts.ready()], deadline, cancelled)


def _placement_deadline() -> float | None:
    timeout = _placement_timeout()
    return None if timeout is None else time.monotonic() + timeout


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


def _wait_ready(
    ray: Any, step: ResolvedStep, choice: _Choice, refs: list[Any], deadline: float | None, cancelled: Any
) -> list[Any]:
    """The values of `refs` (a placement group ready, slices reserved) once all are there.
    Meanwhile the cluster is checked every `PLACEMENT_POLL_S`: cancelled, no longer able to
    hold the gang (`StepRefused`), past the deadline (a lost attempt)."""
    while True:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=PLACEMENT_POLL_S)
        try:
            ray.get(ready)  # one that failed (a SliceActor that could not start): at once
        except ray.exceptions.RayError as error:
            lines = str(error).strip().splitlines()
            raise StepFunctionError(
                f"its gang ({_describe_choice(choice)}) could not be reserved: {type(error).__name__}"
                + (f": {lines[-1]}" if lines else "")
            ) from None
        if len(ready) == len(refs):
            return ray.get(refs)
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


def _stop_gang(ray: Any, gang: _Gang) -> None:
    """Kill the gang's actors and remove its placement groups (which also kills what runs there)."""
    from ray.util.placement_group import remove_placement_group

    for actor in list(gang.actors) + list(gang.reservations):
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)  # a SliceActor's TPUHostActors die with it
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
        reservations = [] if gang is None else gang.get("reservations", [])
        try:
            with capture_step_log(open_store(spec.prefix), spec.output_path):
                node = ray.get_runtime_context().get_node_id()
                if gang is None:
                    print(f"[executor] {spec.name}: on Ray node {node}, process {os.getpid()}", flush=True)
                    return run_hosted(spec, fn, config)
                count = len(gang["peers"]) + 1
                print(
                    f"[executor] {spec.name}: process 0 of {count} on Ray node {node}, process {os.getpid()}, "
                    f"coordinator {gang['record']['gang']['coordinator']}",
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
            timer = threading.Timer(ACTOR_LINGER_S, _exit, (groups, reservations))
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
    dispatch = info["dispatch"]
    for key in ("device", "ray_options"):
        if key in record:
            dispatch[key] = record[key]
    dispatch.setdefault("gang", {}).update(record.get("gang", {}))
    write_info(store, info)


def _exit(groups: list[Any], reservations: list[Any]) -> None:
    import ray

    # Frees the TPU slices (SliceActors) and removes the groups, which kills the gang's
    # processes, this one too.
    _stop_gang(ray, _Gang(groups=groups, actors=[], reservations=reservations))
    os._exit(0)
