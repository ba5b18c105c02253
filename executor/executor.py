"""`Executor`: resolve, plan and run a list of steps under a prefix.

A thin facade over the pipeline, one module per stop:

    steps --graph.resolve--> StepGraph --plan.make_plan--> Plan --runner.Runner--> outputs

The Executor object keeps only the results of the last run, under Marin's attribute
names (`steps`, `output_paths`, `configs`, `versions`, `executor_info_path`), plus the
`plan` and the list of `events` that were emitted.
"""

from __future__ import annotations

import _signal as signal  # (the C module: `signal`'s enum wrappers cost every start ~0.6 ms)
import contextlib
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from executor.backends import Backend, backend_name, open_backend
from executor.collector import CollectorPause, skip_gc_at_exit
from executor.console import ConsoleProgress, write_or_drop
from executor.events import planned_event
from executor.graph import StepDefinitionError, StepGraph, enclosing_output, resolve, storage_of
from executor.lazy_logging import LazyLogger, apply_pending_config
from executor.lease import LeaseConfig, LeaseManager, new_worker_id
from executor.outcomes import DEFAULT_MAX_RETRIES, ExecutorRunError, Outcome, skip_all
from executor.plan import Action, Plan, make_plan
from executor.provenance import (
    caller_script,
    collect_provenance,
    experiment_info_path,
    write_experiment_info,
)
from executor.steps import MAX_DESCRIPTION_CHARS, ExecutorStep, InputName, description_fits
from executor.store import normalize_prefix, open_store

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

logger = LazyLogger(__name__)


class Executor:
    """Runs experiments: every step's output under `<prefix>/<name>-<hash>`."""

    def __init__(
        self,
        prefix: str,
        executor_info_base_path: str | None = None,
        *,
        description: str | None = None,
        lease_config: LeaseConfig | None = None,
        listeners: Sequence[Callable[[Any], None]] = (),
        console: bool = True,
        backend: str | Backend | None = None,
        ray_address: str | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
    ):
        """`backend`: where steps with `resources` run -- "local" (the default: a subprocess
        each), "ray" (Ray tasks; `ray_address`, else $RAY_ADDRESS, else a local Ray), or a
        `Backend`. (`executor_main` also reads $MARIN_BACKEND.) See `executor.backends`.
        `max_retries`: how often a heavy step whose process or node was lost is submitted again."""
        if max_retries < 0:
            raise ValueError(f"max_retries must be at least 0, got {max_retries}")
        self.max_retries = max_retries
        if not prefix:
            raise ValueError("Executor: prefix is empty; pass --prefix or set MARIN_PREFIX")
        self.prefix = normalize_prefix(prefix)
        self.executor_info_base_path = normalize_prefix(
            executor_info_base_path or f"{self.prefix}/experiments"
        )
        if storage_of(self.executor_info_base_path) != storage_of(self.prefix):
            # Manifests are written with the prefix's store: foo://y became a local "foo:" directory.
            raise ValueError(
                f"Executor: executor_info_base_path {executor_info_base_path!r} is on "
                f"{storage_of(self.executor_info_base_path)}://, not on the prefix's storage ({self.prefix})"
            )
        if not description_fits(description):
            # Recorded in every manifest: a set or an object failed the run at its first manifest
            # write, with a traceback, after the plan (steps' own descriptions are checked likewise).
            raise StepDefinitionError(
                "the experiment's description must be a string or None of at most "
                f"{MAX_DESCRIPTION_CHARS:,} characters, got "
                + (
                    f"{len(description):,} characters"
                    if isinstance(description, str)
                    else type(description).__name__
                )
            )
        self.description = description
        self.lease_config = lease_config or LeaseConfig()
        self.listeners = list(listeners)
        self.console = console
        if not isinstance(backend, Backend):
            backend = backend_name(backend, "backend", environ=False)  # a bad name fails here
        self.backend = backend
        self.ray_address = ray_address
        self.store = open_store(self.prefix)
        self._reset()

    def _reset(self) -> None:
        self.steps: list[ExecutorStep] = []
        self.output_paths: dict[ExecutorStep, str] = {}
        self.configs: Mapping[ExecutorStep, Any] = {}
        """Each declaration's concrete config (what its function gets), built when first read."""
        self.versions: dict[ExecutorStep, dict] = {}
        self.executor_info_path: str | None = None
        self.graph: StepGraph | None = None
        self.plan: Plan | None = None
        self.events: list[Any] = []

    def _emit(self, event: Any) -> None:
        self.events.append(event)
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("event listener %r failed on %r", listener, event)

    def run(
        self,
        steps: Sequence[ExecutorStep | InputName],
        dry_run: bool = False,
        run_only: Sequence[str] | None = None,
        force_run_failed: bool = True,
        max_concurrent: int | None = None,
    ) -> Plan:
        """Plan `steps` (and everything they need); unless `dry_run`, run what the plan says.

        Raises ValueError/StepDefinitionError for bad declarations before anything runs,
        and ExecutorRunError listing every failed step (with its log path) after the run.
        """
        # (promote: the plan lives as long as this Executor; see executor.collector)
        with CollectorPause(promote=True) as collector:
            return self._run(steps, dry_run, run_only, force_run_failed, max_concurrent, collector)

    def _run(
        self,
        steps: Sequence[ExecutorStep | InputName],
        dry_run: bool,
        run_only: Sequence[str] | None,
        force_run_failed: bool,
        max_concurrent: int | None,
        collector: CollectorPause,
    ) -> Plan:
        self._reset()
        skip_gc_at_exit()  # (see executor.collector: ~8 ms of a cached re-run's exit)
        started = time.time()
        steps = _declared_steps(steps)
        if max_concurrent is not None and max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        script = caller_script()
        graph = resolve(steps, self.prefix)
        _refuse_manifests_inside_an_output(graph, self.executor_info_base_path)
        self._record_graph(graph)
        # A wrong endpoint or bucket fails here in one line, before hundreds of status reads
        # each wait out the client's retries.
        self.store.check_reachable(self.prefix)
        if dry_run:
            self.store.check_readable(self.prefix)
        self.executor_info_path = experiment_info_path(self.executor_info_base_path, script, graph)
        worker_id = new_worker_id()
        runner_ref: list = []  # the Runner, once made (the lease keeper reports lost leases to it)
        backend: Backend | None = None
        leases = LeaseManager(
            self.store,
            self.lease_config,
            worker_id,
            on_lost=lambda path: runner_ref[0].lease_lost(path),
            # Heartbeats from a process of their own (no GIL shared with the steps), for trees
            # on local disk, S3 and GCS (see executor.lease_keeper).
            keeper_prefix=self.prefix
            if self.lease_config.heartbeat_process and self.store.protocol in KEEPER_PROTOCOLS
            else None,
        )
        # SIGTERM (timeout, docker stop, Slurm, Kubernetes) and SIGHUP (the terminal closed)
        # end the run as Ctrl-C does.
        with sigterm_interrupts():
            try:
                plan = self.plan = make_plan(graph, steps, self.store, leases, run_only, force_run_failed)
                for row in plan.rows:
                    self._emit(planned_event(row))
                if self.console:
                    write_or_drop(sys.stdout, plan.format() + "\n")  # (a closed console stops no run)
                for row in plan.rows:
                    if row.unversioned_changes:
                        logger.warning(
                            "step %s: reusing %s, made with other unversioned settings: %s",
                            row.name,
                            row.output_path,
                            "; ".join(row.unversioned_changes),
                        )
                if dry_run:
                    return plan
                # A step that failed before stops the whole run (without force_run_failed); one whose
                # status file cannot be read fails alone in the runner, and the rest runs (issue 9).
                errors = [row for row in plan.rows if row.action == Action.ERROR and row.status_error is None]
                if errors:
                    raise ValueError(
                        "steps failed previously and force_run_failed is off:\n"
                        + "\n".join(f"  - {row.name}: {row.reason}" for row in errors)
                    )
                will_run = any(row.action != Action.SKIP for row in plan.rows)
                if will_run or not self.store.exists(self.executor_info_path):
                    # Something will be written (steps, or this run's manifest): fail now, naming the
                    # prefix, if it cannot be. A cached re-run with a manifest writes nothing.
                    self.store.check_writable(self.prefix)
                listeners = [self._emit]
                # A run with nothing to run needs no backend: the base one (the local backend's
                # module alone costs a cached re-run ~10 ms of imports).
                backend = self._open_backend() if will_run or isinstance(self.backend, Backend) else Backend()
                if will_run:
                    apply_pending_config()  # steps log through `logging` itself
                    backend.start()
                    leases.start()
                emit = self._dispatch(listeners, plan)
                # Provenance (git, packages) is gathered only when a manifest is written: a fully
                # cached re-run of an experiment that has one finishes without spawning git.
                info: dict[str, Any] = {}
                steps_json = None  # the manifest's step entries, encoded once for both writes
                if will_run:
                    # Loaded only here: a cached re-run reports without the runner's modules.
                    from executor.runner import Runner

                    runner = Runner(plan, self.store, leases, emit, max_concurrent, backend, self.max_retries)
                    runner_ref.append(runner)
                    info = collect_provenance(script)  # recorded for in-progress runs too
                    steps_json = write_experiment_info(
                        self.store, self.executor_info_path, graph, info, self.description, started
                    )
                    runner.run_record = {
                        "experiment": self.executor_info_path,
                        "script": script,
                        "cwd": info["cwd"],
                        "git": info["git"],
                        "python": info["python"],
                    }
                    leases.wait_ready()  # (the keeper started above, meanwhile)
                    collector.resume()  # the steps' own code runs with the collector as usual
                    summary = runner.run()
                else:
                    summary = skip_all(plan.rows, emit)
                # (`skip_all` skipped every step, or raised)
                nothing_ran = not will_run or all(
                    outcome == Outcome.SKIPPED for outcome in summary.outcomes.values()
                )
                if not (nothing_ran and self.store.exists(self.executor_info_path)):
                    outcomes = {path: outcome.value for path, outcome in summary.outcomes.items()}
                    write_experiment_info(
                        self.store,
                        self.executor_info_path,
                        graph,
                        info or collect_provenance(script),
                        self.description,
                        started,
                        outcomes,
                        steps_json,
                    )
            finally:
                if backend is not None and backend is not self.backend:
                    backend.close()
                leases.close()
        if summary.failures:
            raise ExecutorRunError(summary.failures)
        return plan

    def _open_backend(self) -> Backend:
        """The backend for this run (opening one starts nothing; Ray connects at its first heavy step)."""
        if isinstance(self.backend, Backend):
            return self.backend
        return open_backend(self.backend, self.ray_address)

    def _dispatch(self, listeners: list, plan: Plan) -> Callable[[Any], None]:
        if self.console:
            skips = [row.output_path for row in plan.rows if row.action == Action.SKIP]
            listeners.append(ConsoleProgress(total=len(plan.rows), planned_skips=skips))

        def emit(event: Any) -> None:
            for listener in listeners:
                try:
                    listener(event)
                except Exception:  # one listener failing must not keep the event from the others
                    logger.exception("event listener %r failed on %r", listener, event)

        return emit

    def _record_graph(self, graph: StepGraph) -> None:
        self.graph = graph
        self.configs = ConfigsByDeclaration(graph)
        self.steps = [step.step for step in graph.steps]
        for declaration in graph.declarations:
            resolved = graph.resolved(declaration)
            self.output_paths[declaration] = resolved.output_path
            self.versions[declaration] = resolved.version


class ConfigsByDeclaration(Mapping):
    """`Executor.configs` after a run: declaration -> its concrete config, as Marin's dict has
    it, but each built only when read (`ResolvedStep.config`): a cached re-run needs none."""

    def __init__(self, graph: StepGraph):
        self._graph = graph

    def __getitem__(self, declaration: ExecutorStep) -> Any:
        # (by id: the graph keeps every declaration alive, so an id names only that one)
        resolved = self._graph.by_declaration.get(id(declaration))
        if resolved is None or not isinstance(declaration, ExecutorStep):
            raise KeyError(declaration)
        return resolved.config

    def __iter__(self) -> Iterator[ExecutorStep]:
        return iter(self._graph.declarations)

    def __len__(self) -> int:
        return len(self._graph.declarations)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} declarations)"


def _declared_steps(steps: Sequence[ExecutorStep | InputName]) -> list[ExecutorStep]:
    """The steps to run; an `InputName` (`step.as_input_name()`, `step / "sub"`) stands for
    its step, as in Marin. A hard-coded path names no step: nothing to run (warned)."""
    if (
        isinstance(steps, (ExecutorStep, InputName))
        or not isinstance(steps, Iterable)
        or isinstance(steps, str)
    ):
        raise StepDefinitionError(
            f"steps must be a list of steps, got {type(steps).__name__}"
            + (f" {steps.name!r}: pass [step]" if isinstance(steps, ExecutorStep) else "")
        )
    declared = []
    for step in steps:
        if isinstance(step, InputName):
            if step.step is None:
                logger.warning("steps: %r is a hard-coded path, not a step; nothing to run for it", step)
                continue
            step = step.step
        declared.append(step)
    return declared


def _refuse_manifests_inside_an_output(graph: StepGraph, base: str) -> None:
    """The manifests directory may not be inside a step's output: they would mix with its files,
    and removing the output (`marin gc`, `rm -r` of a failed step) would take them along. (A
    directory holding outputs is fine: manifests are `<script>-<hash>.json` files.)"""
    step = enclosing_output(graph.by_path, base)
    if step is not None:
        raise ValueError(
            f"executor_info_base_path {base} is inside the output of step {step.name!r} "
            f"({step.output_path}); put the manifests outside every step's output"
        )


KEEPER_PROTOCOLS = ("file", "s3", "s3a", "gs", "gcs")
"""Trees whose leases the keeper process can open by itself (from the environment's settings);
`memory://` lives in this process only, and a filesystem registered at run time exists here only."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) arrived while `Executor.run` ran.

    A KeyboardInterrupt, so that it takes Ctrl-C's path: the runner marks its running steps
    FAILED "interrupted", stops heavy steps' processes and releases their leases, and
    `executor_main` ends with `error: interrupted` (exit 130). Left to the default action,
    the signal killed the driver at once, leaving steps RUNNING and leases that the next run
    had to wait out (a minute, with the default timeout).
    """


ENDING_SIGNALS = ("SIGTERM", "SIGHUP")
"""Signals that end a run cleanly, as Ctrl-C does: SIGTERM (a timeout, `docker stop`, Slurm,
Kubernetes, `kill`) and SIGHUP (the terminal or the SSH connection the run was started from
closed: the commonest way a researcher's run ends without Ctrl-C)."""


def _raise_terminated(signum: int, frame: Any) -> None:
    # A second signal (Slurm signals every process; a user may send it twice; a closing
    # terminal sends SIGHUP, then SIGTERM) must not cut the first one's cleanup short:
    # ignored until the run restores the previous handlers.
    for name in ENDING_SIGNALS:
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) is _raise_terminated:
            signal.signal(number, signal.SIG_IGN)
    names = {getattr(signal, name, None): name for name in ENDING_SIGNALS}
    raise Terminated(f"signal {signum} ({names.get(signum, 'SIGTERM')})")


@contextlib.contextmanager
def sigterm_interrupts():
    """SIGTERM and SIGHUP raise `Terminated` in the main thread for the duration of the block.

    Only where Python may install handlers (the main thread) and only over the default
    action: a handler the program installed itself (or SIGHUP ignored, as under `nohup`) is
    its own business and is left alone. The previous handlers are back when the block ends.
    """
    installed: dict[int, Any] = {}
    for name in ENDING_SIGNALS:
        number = getattr(signal, name, None)  # (no SIGHUP on Windows)
        if number is None or signal.getsignal(number) != signal.SIG_DFL:
            continue
        try:
            installed[number] = signal.signal(number, _raise_terminated)
        except ValueError:  # not the main thread: only it may install handlers
            break
    try:
        yield
    finally:
        for number, previous in installed.items():
            signal.signal(number, previous)
