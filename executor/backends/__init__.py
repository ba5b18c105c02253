"""Backends: where a step's function runs.

The runner keeps everything that makes a step exactly-once and cached -- the lease, the
status lines, `.executor_info`, the log file -- and asks a backend only to *call the step
function* somewhere and say whether it returned. So every backend shares one bookkeeping
path, and a new one (a cluster scheduler) is this small interface:

- `start()`: before a run that has steps to run (the Ray backend connects here, so that data
  operations in the driver see `ray.is_initialized()` and send their shards to the cluster);
- `admit(step, running)`: may the step start now, beside the steps already running? (The
  runner's `max_concurrent` bounds the driver threads on top of this.)
- `prepare(step)`: decide where it runs (which device alternative, which Ray options) and
  return a JSON-ready record of that choice, written into `.executor_info` as `dispatch`;
  raise `UnsatisfiableError` if nothing can ever run it;
- `call(step, dispatch)`: run a light step's `fn(config)` in the calling driver thread;
- `call_hosted(step, dispatch, spec)`: run a heavy step in a process of its own that takes
  the step's lease over from the driver, heartbeats it from a separate process, and records
  the result itself (`executor.backends.host`), so the step finishes even if the driver
  dies; raise `StepFunctionError` when that process or its node is lost without a result
  (the runner then re-submits it, up to `max_retries` times);
- `cancel(output_path)`: stop a step still running there (its lease was lost, or the run was
  interrupted), so it cannot write into its output any more;
- `close()`.

Two backends, chosen by `executor_main --backend local|ray` or `$MARIN_BACKEND`:

- `local` (`executor.backends.local`): light steps (no `resources`) in driver threads; a step
  with `resources` in a subprocess of its own, admitted by the machine's CPUs and GPUs;
- `ray` (`executor.backends.ray_cluster`): light steps in driver threads; a step with
  `resources` as a Ray task with the CPUs, memory, GPUs and custom resources its
  `ResourceConfig` asks for.

A light step always runs in the driver: starting a process for a step that lists a
directory would cost more than the step.

A step whose resources ask for several hosts (`ResourceConfig.replicas` > 1, or a TPU slice of
several hosts) runs as a *gang* of processes on the Ray backend, one per host, started together
(`executor.backends.ray_cluster`). Each process finds its place in the gang in its environment
(`DistributedProcess.from_env`): the coordinator's address, the number of processes and its own
index -- what `jax.distributed.initialize` needs (`operations.train.initialize_distributed`
reads it).
"""

from __future__ import annotations

import os

from executor.records import dataclass

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

    from executor.graph import ResolvedStep

BACKENDS = ("local", "ray")
"""Names accepted by `open_backend`, `--backend` and `$MARIN_BACKEND`."""

BACKEND_ENV = "MARIN_BACKEND"


class UnsatisfiableError(RuntimeError):
    """No node (or this machine) can ever provide what the step asks for."""


class StepFunctionError(RuntimeError):
    """The step function failed where the backend ran it (another process or node)."""


class StepCancelled(StepFunctionError):
    """The step's process was stopped on purpose (`Backend.cancel`): not re-submitted."""


class StepRefused(StepCancelled):
    """The backend will not start the step (e.g. its gang of hosts can no longer be placed):
    recorded as FAILED with this message, not re-submitted."""


COORDINATOR_ADDRESS_ENV = "MARIN_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "MARIN_NUM_PROCESSES"
PROCESS_ID_ENV = "MARIN_PROCESS_ID"


@dataclass(frozen=True)
class DistributedProcess:
    """This process's place in a gang of processes that run one step together.

    Set by the backend in each process's environment before the step function runs; JAX
    reads none of these variables itself (it reads only `JAX_COORDINATOR_ADDRESS`), so a
    step that trains calls `jax.distributed.initialize(coordinator_address, num_processes,
    process_id)` with them (`operations.train.initialize_distributed`, through Levanter's
    `DistributedConfig`).
    """

    coordinator_address: str
    """`host:port` of process 0's JAX coordination service (process 0's node, a free port)."""

    num_processes: int
    process_id: int
    """0 .. num_processes - 1; process 0 writes the step's bookkeeping."""

    def env(self) -> dict[str, str]:
        return {
            COORDINATOR_ADDRESS_ENV: self.coordinator_address,
            NUM_PROCESSES_ENV: str(self.num_processes),
            PROCESS_ID_ENV: str(self.process_id),
        }

    @staticmethod
    def from_env(environ: dict[str, str] | None = None) -> DistributedProcess | None:
        """The gang this process belongs to, or None when it runs alone (none of the variables
        set). ValueError naming the variable when they are set but incomplete or malformed."""
        environ = os.environ if environ is None else environ
        names = (COORDINATOR_ADDRESS_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV)
        values = {name: environ.get(name, "").strip() for name in names}
        if not any(values.values()):
            return None
        missing = [name for name, value in values.items() if not value]
        if missing:
            raise ValueError(
                f"${', $'.join(missing)} not set, but ${', $'.join(n for n in names if n not in missing)} "
                "is: a process of a gang needs all three (coordinator host:port, process count, its index)"
            )
        count, index = values[NUM_PROCESSES_ENV], values[PROCESS_ID_ENV]
        if not (count.isdigit() and index.isdigit() and int(index) < int(count)):
            raise ValueError(
                f"${NUM_PROCESSES_ENV}={count!r}, ${PROCESS_ID_ENV}={index!r}: expected integers with "
                "0 <= process id < process count"
            )
        return DistributedProcess(values[COORDINATOR_ADDRESS_ENV], int(count), int(index))


class Backend:
    """The interface (see the module docstring). Light steps run in the calling thread."""

    name = "driver"

    def start(self) -> None:
        """Called once before a run that has steps to run (never for a dry or fully cached run)."""

    def admit(self, step: ResolvedStep, running: list[ResolvedStep]) -> bool:
        return True

    def prepare(self, step: ResolvedStep) -> dict[str, Any]:
        return {"backend": self.name, "where": "driver"}

    def call(self, step: ResolvedStep, dispatch: dict[str, Any]) -> None:
        step.step.fn(step.config)

    def call_hosted(self, step: ResolvedStep, dispatch: dict[str, Any], spec: Any) -> dict[str, Any]:
        """Run a heavy step in a process of its own that takes its lease over and records its
        result (`executor.backends.host.run_hosted`); return that process's result. Raise
        `StepFunctionError` when the process (or its node) was lost without one."""
        raise NotImplementedError(f"the {self.name} backend runs no heavy steps")

    def cancel(self, output_path: str) -> None:
        """Nothing to stop in the driver: a driver thread cannot be killed (see the runner)."""

    def close(self) -> None:
        pass


CHILD_ENV_DROPPED = frozenset({"WANDB_SERVICE"})
"""Variables of the driver's environment that a step's process does not inherit (`child_env`)."""


def child_env() -> dict[str, str]:
    """The driver's environment for a process it starts, with the directory holding the
    `executor` package on PYTHONPATH (so `python -m executor.backends...` finds this code).

    Without `$WANDB_SERVICE`: W&B exports it in a process that used W&B so that its children
    attach to that process's service. A step's process starts its own instead -- the driver's
    service may be gone by then (a driver that trained in-process and tore W&B down), and a
    shared one holds a killed step's run "in use" so that its retry is refused."""
    env = {name: value for name, value in os.environ.items() if name not in CHILD_ENV_DROPPED}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def extend_sys_path(entries: list[str]) -> None:
    """Put the driver's import path (sent with a step) in front of this process's, once each,
    so the step's function and config unpickle here as they were defined there."""
    import sys

    for entry in reversed(entries):
        if entry not in sys.path:
            sys.path.insert(0, entry)


def is_heavy(step: ResolvedStep) -> bool:
    """A step that declares resources runs where the backend puts heavy work."""
    return step.step.resources is not None


def backend_name(name: str | None, flag: str = "--backend", environ: bool = True) -> str:
    """`name`, else `$MARIN_BACKEND` (when `environ`), else "local".

    ValueError naming where the bad name came from (`flag`, or the variable) and the choices.
    """
    from_env = os.environ.get(BACKEND_ENV, "").strip() if environ and not name else ""
    chosen = name or from_env or "local"
    if chosen not in BACKENDS:
        source = flag if name else f"${BACKEND_ENV}"
        raise ValueError(f"{source}={chosen!r}: unknown backend; use one of {', '.join(BACKENDS)}")
    return chosen


def open_backend(name: str | None = None, ray_address: str | None = None) -> Backend:
    """The backend called `name` (see `backend_name`). Opening one starts nothing: the Ray
    backend imports Ray and connects only when its first heavy step is dispatched."""
    chosen = backend_name(name)
    if chosen == "ray":
        from executor.backends.ray_cluster import RayBackend

        return RayBackend(address=ray_address)
    from executor.backends.local import LocalBackend

    return LocalBackend()
