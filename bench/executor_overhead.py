"""Executor overhead on large DAGs: build+hash, dry-run plan, cold run and warm re-run, each
against a floor that does the least any executor must do.

    .venv/bin/python bench/executor_overhead.py                       # 1,000 and 10,000 steps
    .venv/bin/python bench/executor_overhead.py --sizes 1000 --out /tmp/bench-results

Two DAG shapes, each at every size N:

- chain:  step i takes step i-1's output as its input (N steps, depth N);
- fan-in: N-1 independent leaves, each with a versioned field, and one final step whose
  config holds a list of all N-1 leaf outputs as inputs.

Step functions are trivial (each makes its output directory and writes one tiny file
there), so every figure is executor overhead. Times are medians of --repeats rounds;
within a round the executor and its floor run one after the other (order alternating
between rounds), and each ratio is the median of the per-round ratios, so drift and
bursts of outside load on a shared machine hit both sides of a ratio alike. Every timed cold run starts after
`os.sync()`, and a DAG's prefixes are deleted only after its last measurement (on a disk
mounted with `discard`, deleting a prefix slows the runs that follow).

In-process (the executor's own work, interpreter start-up and imports excluded):

- build+hash: construct the ExecutorStep objects and `executor.graph.resolve` them;
- plan (dry run): `Executor(prefix, console=False).run(steps, dry_run=True)`, empty prefix;
- cold run: `Executor(prefix, console=False).run(steps)` on a fresh local prefix, the
  steps built before the timer starts;
- cold floor: on a fresh local prefix, `resolve(steps, prefix)`, then per step in
  topological order: the step function itself (makedirs + one 3-byte file) and one
  status file (`os.open(O_CREAT|O_EXCL)`, one `os.write` of a JSON line, `os.close`);
- warm re-run: in a fresh process, build the steps and `Executor(prefix,
  console=False).run(steps)` when every step has succeeded, timed from before building
  the steps to the end of `run`;
- warm floor: in a fresh process, timed the same way: build and resolve the steps, then
  read each step's `.executor_status` once with `os.open`/`os.read`/`os.close` (how the
  executor's local store reads) and check that its last line says SUCCESS.

Whole process (what a user waits for; at sizes up to --whole-max, wall time of the
subprocess, from spawn to exit; stdout to /dev/null):

- `python experiment.py`: a generated experiment script (one file, like
  `experiments/tutorials/hello_world.py`: config dataclasses, the step function, the DAG,
  `executor_main(steps)`, prefix from $MARIN_PREFIX), cold on a fresh prefix and warm on
  the prefix its cold run left; also warm with `Executor(prefix).run(steps)` in place of
  `executor_main` (no flag parsing, no draccus);
- whole-process floor: a generated script importing only `hashlib`, `json` and `os`: it
  builds the same DAG as plain dicts, hashes each step (SHA-256 of the canonical JSON of
  its name, versioned field and upstream hashes) into `<prefix>/<name>-<hash>`, then
  cold: makes each step's directory and writes its 3-byte file and status file as the
  cold floor does; warm: reads each status file once as the warm floor does.

Targets (1,000 steps, worse shape): build+hash of 10,000 steps < 1 s; warm re-run <= 1.5x
the warm floor; whole-process warm re-run (`executor_main`) <= 2.0x the whole-process
floor; cold run <= 3x the cold floor. On a disk, every cold round also runs the cold floor
in /dev/shm: when the disk's floor is more than 3x that (writeback, or deletions on a disk
mounted with `discard`), the disk was slow, a ratio under 3x says more about the disk than
about the executor, and the cold target is reported NOT JUDGED. The last lines are
machine-readable `key=value` (`warm_vs_floor_1000`, `whole_warm_vs_floor_1000`,
`cold_vs_floor_1000`, `cold_floor_disk_vs_memory_1000`, `build_hash_10000_s`, `commit`).
Temporary prefixes are deleted on exit.

To profile one measurement, run a child mode directly under cProfile, e.g. after a run
left outputs under PREFIX (`--keep` keeps them):

    .venv/bin/python -m cProfile -s cumulative bench/executor_overhead.py \\
        --child warm --shape chain --size 1000 --prefix PREFIX
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_T_IMPORT = time.perf_counter()
from executor import Executor, ExecutorStep, output_path_of, this_output_path, versioned  # noqa: E402
from executor.events import StepFailed, StepSkipped, StepSucceeded  # noqa: E402
from executor.graph import resolve  # noqa: E402
from executor.plan import Action  # noqa: E402

IMPORT_EXECUTOR_S = time.perf_counter() - _T_IMPORT

SHAPES = ("chain", "fanin")
BUILD_HASH_TARGET_S = 1.0
"""10,000 steps built and hashed in under this many seconds."""
WARM_VS_FLOOR_TARGET = 1.5
"""Warm re-run of 1,000 steps at most this many times the warm floor (in-process)."""
WHOLE_VS_FLOOR_TARGET = 2.0
"""`python experiment.py` re-run of 1,000 cached steps at most this many times the whole-process floor."""
COLD_VS_FLOOR_TARGET = 3.0
"""Cold run of 1,000 steps at most this many times the cold floor (in-process)."""

MEMORY_DIR = "/dev/shm"
"""Where the cold floor also runs, in memory, in every cold round: the yardstick for the disk's state."""

SLOW_DISK_FACTOR = 3.0
"""A cold floor on disk more than this many times the same floor in memory means the disk was
slow (writeback, or deletions on a disk mounted with `discard`): the floor then takes most of the
time, every ratio to it shrinks, and the cold target is not judged. On this machine's quiet disk
the factor was 1.6-2.4; right after deleting 1,000-step prefixes, 10-14."""


# -- the DAGs ------------------------------------------------------------------


@dataclass(frozen=True)
class ChainConfig:
    index: int
    """Position in the chain (versioned)."""

    input_path: str | None
    """The previous step's output (None for the first step)."""

    output_path: str


@dataclass(frozen=True)
class LeafConfig:
    index: int
    """Which leaf (versioned, so every leaf has its own version)."""

    output_path: str


@dataclass(frozen=True)
class FanInConfig:
    inputs: list[str]
    """The outputs of every leaf."""

    output_path: str


def write_marker(config: Any) -> None:
    """The trivial step function: one tiny file under the step's output path."""
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "done"), "w") as handle:
        handle.write("ok\n")


def build_chain(size: int) -> list[ExecutorStep]:
    steps: list[ExecutorStep] = []
    previous = None
    for i in range(size):
        step = ExecutorStep(
            name=f"chain/step-{i:05d}",
            fn=write_marker,
            config=ChainConfig(
                index=versioned(i),
                input_path=None if previous is None else output_path_of(previous),
                output_path=this_output_path(),
            ),
        )
        steps.append(step)
        previous = step
    return steps


def build_fanin(size: int) -> list[ExecutorStep]:
    leaves = [
        ExecutorStep(
            name=f"fanin/leaf-{i:05d}",
            fn=write_marker,
            config=LeafConfig(index=versioned(i), output_path=this_output_path()),
        )
        for i in range(size - 1)
    ]
    final = ExecutorStep(
        name="fanin/final",
        fn=write_marker,
        config=FanInConfig(inputs=[output_path_of(leaf) for leaf in leaves], output_path=this_output_path()),
    )
    return [*leaves, final]


BUILDERS: dict[str, Callable[[int], list[ExecutorStep]]] = {"chain": build_chain, "fanin": build_fanin}


def build_steps(shape: str, size: int) -> list[ExecutorStep]:
    """Every step of the DAG (passing only the sink would do; passing all is what scripts do)."""
    return BUILDERS[shape](size)


# -- floors and child processes -------------------------------------------------

STATUS_LINE = json.dumps({"status": "SUCCESS"}).encode() + b"\n"


def write_status(output_path: str) -> None:
    """The cold floor's bookkeeping: one status file, one write."""
    fd = os.open(f"{output_path}/.executor_status", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        os.write(fd, STATUS_LINE)
    finally:
        os.close(fd)


def read_status_bytes(path: str) -> bytes:
    """How `executor.store.LocalStore.read_bytes` reads: raw os.read, no buffered file object."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def floor_cold(steps: list[ExecutorStep], prefix: str) -> float:
    start = time.perf_counter()
    graph = resolve(steps, prefix)
    for step in graph.steps:
        step.step.fn(step.config)
        write_status(step.output_path)
    return time.perf_counter() - start


def child_warm(shape: str, size: int, prefix: str) -> dict[str, Any]:
    start = time.perf_counter()
    steps = build_steps(shape, size)
    built = time.perf_counter()
    plan = Executor(prefix, console=False).run(steps)
    end = time.perf_counter()
    actions = {row.action for row in plan.rows}
    if actions != {Action.SKIP} or len(plan.rows) != size:
        raise SystemExit(f"warm re-run was not all skips: {len(plan.rows)} rows, actions {actions}")
    return {"seconds": end - start, "build_s": built - start, "import_s": IMPORT_EXECUTOR_S}


def child_floor(shape: str, size: int, prefix: str) -> dict[str, Any]:
    start = time.perf_counter()
    steps = build_steps(shape, size)
    graph = resolve(steps, prefix)
    done = 0
    for step in graph.steps:
        data = read_status_bytes(f"{step.output_path}/.executor_status")
        done += b'"SUCCESS"' in data[data.rstrip().rfind(b"\n") + 1 :]
    end = time.perf_counter()
    if done != size:
        raise SystemExit(f"floor: only {done} of {size} steps have succeeded under {prefix}")
    return {"seconds": end - start, "import_s": IMPORT_EXECUTOR_S}


CHILDREN = {"warm": child_warm, "floor": child_floor}


def run_child(mode: str, shape: str, size: int, prefix: str) -> dict[str, Any]:
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        mode,
        "--shape",
        shape,
        "--size",
        str(size),
        "--prefix",
        prefix,
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=CHILD_ENV, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{mode} child failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- whole-process scripts ------------------------------------------------------------

EXPERIMENT_SCRIPT = '''"""A 1,000-step experiment, written the way experiments/ are (generated by the bench)."""

import os
from dataclasses import dataclass

from executor import Executor, ExecutorStep, executor_main, output_path_of, this_output_path, versioned


@dataclass(frozen=True)
class ChainConfig:
    index: int
    input_path: str | None
    output_path: str


@dataclass(frozen=True)
class LeafConfig:
    index: int
    output_path: str


@dataclass(frozen=True)
class FanInConfig:
    inputs: list[str]
    output_path: str


def write_marker(config) -> None:
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "done"), "w") as handle:
        handle.write("ok\\n")


def build(shape: str, size: int) -> list[ExecutorStep]:
    if shape == "chain":
        steps, previous = [], None
        for i in range(size):
            previous = ExecutorStep(
                name=f"chain/step-{i:05d}",
                fn=write_marker,
                config=ChainConfig(
                    index=versioned(i),
                    input_path=None if previous is None else output_path_of(previous),
                    output_path=this_output_path(),
                ),
            )
            steps.append(previous)
        return steps
    leaves = [
        ExecutorStep(name=f"fanin/leaf-{i:05d}", fn=write_marker,
                     config=LeafConfig(index=versioned(i), output_path=this_output_path()))
        for i in range(size - 1)
    ]
    final = ExecutorStep(
        name="fanin/final",
        fn=write_marker,
        config=FanInConfig(inputs=[output_path_of(leaf) for leaf in leaves], output_path=this_output_path()),
    )
    return [*leaves, final]


if __name__ == "__main__":
    steps = build(os.environ["BENCH_SHAPE"], int(os.environ["BENCH_SIZE"]))
    if os.environ.get("BENCH_ENTRY") == "run":
        Executor(os.environ["MARIN_PREFIX"]).run(steps)
    else:
        executor_main(steps)
'''

FLOOR_SCRIPT = '''"""Whole-process floor: the least a content-hashed step cache does (generated by the bench)."""

import hashlib
import json
import os
import sys


def version_hash(name, config, dependencies):
    text = json.dumps({"config": config, "dependencies": dependencies, "name": name},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def dag(shape, size, prefix):
    """(output path) of every step in topological order."""
    paths = []
    if shape == "chain":
        previous = None
        for i in range(size):
            name = f"chain/step-{i:05d}"
            version = version_hash(name, {"index": i}, [previous] if previous else [])
            paths.append(f"{prefix}/{name}-{version[:8]}")
            previous = version
        return paths
    versions = []
    for i in range(size - 1):
        name = f"fanin/leaf-{i:05d}"
        versions.append(version_hash(name, {"index": i}, []))
        paths.append(f"{prefix}/{name}-{versions[-1][:8]}")
    paths.append(f"{prefix}/fanin/final-{version_hash('fanin/final', {}, versions)[:8]}")
    return paths


def main():
    mode, shape, size, prefix = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    paths = dag(shape, size, prefix)
    if mode == "cold":
        line = json.dumps({"status": "SUCCESS"}).encode() + b"\\n"
        for path in paths:
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "done"), "w") as handle:
                handle.write("ok\\n")
            fd = os.open(f"{path}/.executor_status", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            os.write(fd, line)
            os.close(fd)
        return
    done = 0
    for path in paths:
        fd = os.open(f"{path}/.executor_status", os.O_RDONLY)
        data = os.read(fd, 1 << 16)
        os.close(fd)
        done += b'"SUCCESS"' in data[data.rstrip().rfind(b"\\n") + 1 :]
    if done != size:
        raise SystemExit(f"only {done} of {size} steps succeeded")


if __name__ == "__main__":
    main()
'''


LUIGI_SCRIPT = '''"""Luigi baseline (generated by the bench): the same DAG as luigi tasks with LocalTargets."""

import os

import luigi

PREFIX, SHAPE, SIZE = os.environ["MARIN_PREFIX"], os.environ["BENCH_SHAPE"], int(os.environ["BENCH_SIZE"])


def write(target):
    with target.open("w") as handle:
        handle.write("ok\\n")


class Chain(luigi.Task):
    index = luigi.IntParameter()

    def requires(self):
        return [Chain(index=self.index - 1)] if self.index > 0 else []

    def output(self):
        return luigi.LocalTarget(f"{PREFIX}/chain/step-{self.index:05d}/done")

    def run(self):
        write(self.output())


class Leaf(luigi.Task):
    index = luigi.IntParameter()

    def output(self):
        return luigi.LocalTarget(f"{PREFIX}/fanin/leaf-{self.index:05d}/done")

    def run(self):
        write(self.output())


class Final(luigi.Task):
    def requires(self):
        return [Leaf(index=i) for i in range(SIZE - 1)]

    def output(self):
        return luigi.LocalTarget(f"{PREFIX}/fanin/final/done")

    def run(self):
        write(self.output())


if __name__ == "__main__":
    root = Chain(index=SIZE - 1) if SHAPE == "chain" else Final()
    if not luigi.build([root], local_scheduler=True, workers=1, log_level="ERROR"):
        raise SystemExit("luigi run failed")
'''

JOBLIB_SCRIPT = '''"""joblib baseline (generated by the bench): the same DAG as calls cached by joblib.Memory."""

import os

from joblib import Memory

PREFIX, SHAPE, SIZE = os.environ["MARIN_PREFIX"], os.environ["BENCH_SHAPE"], int(os.environ["BENCH_SIZE"])
memory = Memory(PREFIX, verbose=0)


@memory.cache
def step(name, index, inputs):
    return f"{name}-{index}"


if __name__ == "__main__":
    if SHAPE == "chain":
        previous = None
        for i in range(SIZE):
            previous = step("chain/step", i, previous)
    else:
        leaves = [step("fanin/leaf", i, None) for i in range(SIZE - 1)]
        step("fanin/final", 0, leaves)
'''

BASELINES = {"luigi": LUIGI_SCRIPT, "joblib": JOBLIB_SCRIPT}
"""Other tools run on the same DAGs with --baselines (whole process, when installed)."""


CHILD_ENV = dict(os.environ)
"""Environment of every child process: bytecode caching on, as on a user's machine."""


def write_scripts(directory: str) -> tuple[str, str]:
    """Write the two scripts and warm the bytecode cache the children share.

    Imported modules are compiled once into a cache under `directory` and loaded from it
    afterwards, as they are for a user (this machine sets PYTHONDONTWRITEBYTECODE, under
    which every child would compile the executor from source: ~0.2 s of each run).
    """
    CHILD_ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    CHILD_ENV["PYTHONPYCACHEPREFIX"] = os.path.join(directory, "pycache")
    experiment, floor = os.path.join(directory, "experiment.py"), os.path.join(directory, "floor.py")
    with open(experiment, "w") as handle:
        handle.write(EXPERIMENT_SCRIPT)
    with open(floor, "w") as handle:
        handle.write(FLOOR_SCRIPT)
    warm_up = (
        "import executor, executor.main, draccus, hashlib, json; import "
        + os.path.splitext(os.path.basename(__file__))[0]
    )
    subprocess.run(
        [sys.executable, "-c", warm_up],
        cwd=os.path.dirname(os.path.abspath(__file__)),
        env=CHILD_ENV,
        check=True,
    )
    return experiment, floor


def write_baselines(directory: str, wanted: bool) -> dict[str, str]:
    """The baseline scripts whose tool is installed (none unless `wanted`)."""
    import importlib.util

    scripts = {}
    for tool, text in BASELINES.items() if wanted else ():
        if importlib.util.find_spec(tool) is None:
            log(f"baseline {tool}: not installed, skipped")
            continue
        scripts[tool] = os.path.join(directory, f"{tool}_baseline.py")
        with open(scripts[tool], "w") as handle:
            handle.write(text)
    return scripts


def wall(command: list[str], env: dict[str, str] | None = None, sync: bool = False) -> float:
    """Wall time of one process, spawn to exit (stdout discarded); after os.sync() if `sync`."""
    if sync:
        os.sync()
    start = time.perf_counter()
    result = subprocess.run(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env or CHILD_ENV,
        check=False,
    )
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{command} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return seconds


def experiment_env(shape: str, size: int, prefix: str, entry: str = "main") -> dict[str, str]:
    return {
        **CHILD_ENV,
        "MARIN_PREFIX": prefix,
        "BENCH_SHAPE": shape,
        "BENCH_SIZE": str(size),
        "BENCH_ENTRY": entry,
    }


# -- the parent ------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Progress:
    """Executor listener: a line on stderr every tenth of the steps."""

    def __init__(self, label: str, total: int):
        self.label = label
        self.total = total
        self.every = max(1, total // 10)
        self.done = 0
        self.start = time.perf_counter()

    def __call__(self, event: Any) -> None:
        if isinstance(event, (StepSucceeded, StepSkipped, StepFailed)):
            self.done += 1
            if self.done % self.every == 0 or self.done == self.total:
                elapsed = time.perf_counter() - self.start
                log(f"  {self.label}: {self.done}/{self.total} steps finished, {elapsed:.1f}s")


@dataclass
class Row:
    shape: str
    size: int
    build_hash: list[float]
    plan: list[float]
    cold: list[float]
    cold_floor: list[float]
    warm: list[float]
    floor: list[float]
    warm_import: list[float]
    whole_cold: list[float] = field(default_factory=list)
    whole_cold_floor: list[float] = field(default_factory=list)
    whole_warm: list[float] = field(default_factory=list)
    whole_warm_run: list[float] = field(default_factory=list)
    whole_floor: list[float] = field(default_factory=list)
    tools: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """Other tools (--baselines), whole process: {tool: {"cold": [...], "warm": [...]}}."""
    cold_floor_memory: list[float] = field(default_factory=list)
    """The cold floor in MEMORY_DIR, in the same rounds (empty: --tmp-dir is already in memory,
    or there is no MEMORY_DIR)."""

    # Ratios are the median over rounds of ours/floor within a round: the two ran side by
    # side, so a burst of outside load that slows one round slows both of its runs.
    @property
    def ratio(self) -> float:
        return paired_ratio(self.warm, self.floor)

    @property
    def cold_ratio(self) -> float:
        return paired_ratio(self.cold, self.cold_floor)

    @property
    def disk_slowness(self) -> float | None:
        """The cold floor on the disk over the same floor in memory (None: not measured)."""
        return paired_ratio(self.cold_floor, self.cold_floor_memory) if self.cold_floor_memory else None

    @property
    def whole_ratio(self) -> float | None:
        return paired_ratio(self.whole_warm, self.whole_floor) if self.whole_warm else None

    @property
    def whole_run_ratio(self) -> float | None:
        return paired_ratio(self.whole_warm_run, self.whole_floor) if self.whole_warm_run else None

    @property
    def whole_cold_ratio(self) -> float | None:
        return paired_ratio(self.whole_cold, self.whole_cold_floor) if self.whole_cold else None


def paired_ratio(ours: list[float], floor: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(ours, floor, strict=True))


def median(values: list[float]) -> float:
    return statistics.median(values)


def new_prefix(tmp_root: str | None, label: str, made: list[str]) -> str:
    if tmp_root is not None:
        os.makedirs(tmp_root, exist_ok=True)  # --tmp-dir may name a folder not made yet
    path = tempfile.mkdtemp(prefix=f"executor-bench-{label}-", dir=tmp_root)
    made.append(path)
    return path


def remove(path: str | None, made: list[str]) -> None:
    if path is None:
        return
    shutil.rmtree(path, ignore_errors=True)
    if path in made:
        made.remove(path)


def measure(
    shape: str,
    size: int,
    args: argparse.Namespace,
    made: list[str],
    scripts: tuple[str, str],
    baselines: dict[str, str],
) -> Row:
    label = f"{shape} x {size}"
    repeats = args.repeats
    whole = size <= args.whole_max
    experiment, floor_script = scripts

    build_hash = []
    for _ in range(repeats):
        start = time.perf_counter()
        steps = build_steps(shape, size)
        resolve(steps, "/nonexistent/executor-bench")
        build_hash.append(time.perf_counter() - start)
    log(f"{label}: build+hash {fmt_list(build_hash)}")

    steps = build_steps(shape, size)
    plan = []
    empty = new_prefix(args.tmp_dir, "empty", made)
    for _ in range(repeats):
        start = time.perf_counter()
        result = Executor(empty, console=False).run(steps, dry_run=True)
        plan.append(time.perf_counter() - start)
        assert len(result.rows) == size and os.listdir(empty) == []
    remove(empty, made)
    log(f"{label}: plan (dry run) {fmt_list(plan)}")

    # Cold runs on a disk are at the mercy of the previous run's writeback and, on a disk
    # mounted with `discard`, of deletions: every timed cold run starts after os.sync(), and
    # the prefixes are deleted only after the last measurement of this DAG.
    cold, cold_floor, whole_cold, whole_cold_floor, cold_floor_memory = [], [], [], [], []
    prefix = floor_prefix = whole_prefix = whole_floor_prefix = None
    memory = MEMORY_DIR if on_disk(args.tmp_dir) else None
    rounds: list[str] = []
    tools: dict[str, dict[str, list[float]]] = {}
    tool_prefixes: dict[str, str] = {}
    for attempt in range(1 if size >= args.cold_once_from else repeats):
        prefix = new_prefix(args.tmp_dir, f"{shape}-{size}", made)
        floor_prefix = new_prefix(args.tmp_dir, f"floor-{shape}-{size}", made)
        rounds += [prefix, floor_prefix]

        def ours(prefix=prefix):
            executor = Executor(prefix, console=False, listeners=[Progress(f"{label} cold", size)])
            os.sync()
            start = time.perf_counter()
            executor.run(steps)
            cold.append(time.perf_counter() - start)

        def floor(floor_prefix=floor_prefix):
            os.sync()
            cold_floor.append(floor_cold(steps, floor_prefix))

        for run in (ours, floor) if attempt % 2 == 0 else (floor, ours):
            run()
        if memory is not None:  # (the disk's yardstick: see SLOW_DISK_FACTOR)
            memory_prefix = new_prefix(memory, f"floor-{shape}-{size}", made)
            cold_floor_memory.append(floor_cold(steps, memory_prefix))
            remove(memory_prefix, made)
        if whole:
            whole_prefix = new_prefix(args.tmp_dir, f"whole-{shape}-{size}", made)
            whole_floor_prefix = new_prefix(args.tmp_dir, f"whole-floor-{shape}-{size}", made)
            rounds += [whole_prefix, whole_floor_prefix]
            pair = [
                lambda p=whole_prefix: whole_cold.append(
                    wall([sys.executable, experiment], experiment_env(shape, size, p), sync=True)
                ),
                lambda p=whole_floor_prefix: whole_cold_floor.append(
                    wall([sys.executable, floor_script, "cold", shape, str(size), p], sync=True)
                ),
            ]
            for tool, script in baselines.items():
                tool_prefix = new_prefix(args.tmp_dir, f"{tool}-{shape}-{size}", made)
                rounds.append(tool_prefix)
                tool_prefixes[tool] = tool_prefix
                pair.append(
                    lambda t=tool, s=script, p=tool_prefix: (
                        tools.setdefault(t, {})
                        .setdefault("cold", [])
                        .append(wall([sys.executable, s], experiment_env(shape, size, p), sync=True))
                    )
                )
            for run in pair if attempt % 2 == 0 else pair[::-1]:
                run()
        log(f"{label}: cold round {attempt + 1}: ours {cold[-1]:.3f} s, floor {cold_floor[-1]:.3f} s")
    log(
        f"{label}: cold run {fmt_list(cold)}; floor {fmt_list(cold_floor)}"
        + (f"; floor in {memory} {fmt_list(cold_floor_memory)}" if memory else "")
    )
    if whole:
        log(f"{label}: whole-process cold {fmt_list(whole_cold)}; floor {fmt_list(whole_cold_floor)}")

    warm, warm_import, floor_times = [], [], []
    whole_warm, whole_warm_run, whole_floor = [], [], []
    for attempt in range(repeats):  # interleaved, so drift on a noisy machine hits both alike
        runs = [
            lambda: warm.append(run_child("warm", shape, size, prefix)),
            lambda: floor_times.append(run_child("floor", shape, size, prefix)["seconds"]),
        ]
        if whole:
            runs += [
                lambda: whole_warm.append(
                    wall([sys.executable, experiment], experiment_env(shape, size, whole_prefix))
                ),
                lambda: whole_warm_run.append(
                    wall([sys.executable, experiment], experiment_env(shape, size, whole_prefix, entry="run"))
                ),
                lambda: whole_floor.append(
                    wall([sys.executable, floor_script, "warm", shape, str(size), whole_floor_prefix])
                ),
            ]
            runs += [
                lambda t=tool, s=script: (
                    tools[t]
                    .setdefault("warm", [])
                    .append(wall([sys.executable, s], experiment_env(shape, size, tool_prefixes[t])))
                )
                for tool, script in baselines.items()
            ]
        for run in runs if attempt % 2 == 0 else runs[::-1]:
            run()
    warm_import = [result["import_s"] for result in warm]
    warm = [result["seconds"] for result in warm]
    log(f"{label}: warm re-run {fmt_list(warm)}; floor {fmt_list(floor_times)}")
    if whole:
        log(
            f"{label}: whole-process warm {fmt_list(whole_warm)}; with Executor.run {fmt_list(whole_warm_run)}; "
            f"floor {fmt_list(whole_floor)}"
        )
    if args.keep:
        log(f"{label}: keeping {prefix}")
        made.remove(prefix)
    for path in rounds:
        if path in made:
            remove(path, made)
    return Row(
        shape,
        size,
        build_hash,
        plan,
        cold,
        cold_floor,
        warm,
        floor_times,
        warm_import,
        whole_cold,
        whole_cold_floor,
        whole_warm,
        whole_warm_run,
        whole_floor,
        tools,
        cold_floor_memory,
    )


def on_disk(tmp_dir: str | None) -> bool:
    """`tmp_dir` (None: the system's temporary directory) is not on MEMORY_DIR's file system,
    and MEMORY_DIR exists."""
    target = tmp_dir or tempfile.gettempdir()
    try:
        return os.stat(target).st_dev != os.stat(MEMORY_DIR).st_dev
    except OSError:
        return False


def fmt_list(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "] s"


def fmt_s(value: float) -> str:
    return f"{value:.3f}" if value < 100 else f"{value:.1f}"


def table(rows: list[Row]) -> str:
    lines = [
        "In-process (seconds):",
        "",
        "| shape | steps | build+hash | plan, dry run | cold run | cold floor | cold/floor "
        "| warm re-run | warm floor | warm/floor | import executor |",
        "|" + "---|" * 11,
    ]
    for row in rows:
        once = "" if len(row.cold) > 1 else " (1 run)"
        lines.append(
            f"| {row.shape} | {row.size:,} | {fmt_s(median(row.build_hash))} | {fmt_s(median(row.plan))} "
            f"| {fmt_s(median(row.cold))}{once} | {fmt_s(median(row.cold_floor))}{once} | {row.cold_ratio:.2f} "
            f"| {fmt_s(median(row.warm))} | {fmt_s(median(row.floor))} | {row.ratio:.2f} "
            f"| {fmt_s(median(row.warm_import))} |"
        )
    whole = [row for row in rows if row.whole_warm]
    if whole:
        lines += [
            "",
            "Whole process, `python experiment.py` wall time (seconds):",
            "",
            "| shape | steps | cold | cold floor | cold/floor | warm, executor_main | warm, Executor.run "
            "| warm floor | warm/floor (executor_main) | warm/floor (Executor.run) |",
            "|" + "---|" * 10,
        ]
        for row in whole:
            lines.append(
                f"| {row.shape} | {row.size:,} | {fmt_s(median(row.whole_cold))} "
                f"| {fmt_s(median(row.whole_cold_floor))} | {row.whole_cold_ratio:.2f} "
                f"| {fmt_s(median(row.whole_warm))} | {fmt_s(median(row.whole_warm_run))} "
                f"| {fmt_s(median(row.whole_floor))} | {row.whole_ratio:.2f} | {row.whole_run_ratio:.2f} |"
            )
    tooled = [row for row in rows if row.tools]
    if tooled:
        lines += [
            "",
            "Other tools on the same DAGs, whole process (seconds; ratios to the whole-process floors of the same rounds):",
            "",
            "| tool | shape | steps | cold | cold/floor | warm | warm/floor |",
            "|" + "---|" * 7,
        ]
        for row in tooled:
            entries = [
                ("ours (executor_main)", {"cold": row.whole_cold, "warm": row.whole_warm}),
                *row.tools.items(),
            ]
            for tool, times in entries:
                lines.append(
                    f"| {tool} | {row.shape} | {row.size:,} | {fmt_s(median(times['cold']))} "
                    f"| {paired_ratio(times['cold'], row.whole_cold_floor):.2f} | {fmt_s(median(times['warm']))} "
                    f"| {paired_ratio(times['warm'], row.whole_floor):.2f} |"
                )
    return "\n".join(lines)


def verdict(value: float, limit: float) -> str:
    return "MET" if value <= limit else "NOT MET"


def targets(rows: list[Row]) -> tuple[list[str], dict[str, float]]:
    lines, values = [], {}
    big = [row for row in rows if row.size == 10_000]
    if big:
        worst = max(big, key=lambda row: median(row.build_hash))
        seconds = median(worst.build_hash)
        lines.append(
            f"target: 10,000 steps built+hashed in < {BUILD_HASH_TARGET_S:g} s: {seconds:.3f} s "
            f"(worst shape: {worst.shape}) {verdict(seconds, BUILD_HASH_TARGET_S)}"
        )
        values["build_hash_10000_s"] = seconds
    small = [row for row in rows if row.size == 1_000]
    checks = [
        ("warm re-run", "warm_vs_floor_1000", WARM_VS_FLOOR_TARGET, lambda row: row.ratio),
        (
            "whole-process warm re-run",
            "whole_warm_vs_floor_1000",
            WHOLE_VS_FLOOR_TARGET,
            lambda row: row.whole_ratio,
        ),
        ("cold run", "cold_vs_floor_1000", COLD_VS_FLOOR_TARGET, lambda row: row.cold_ratio),
    ]
    for what, key, limit, ratio in checks:
        measured = [row for row in small if ratio(row) is not None]
        if measured:
            worst = max(measured, key=ratio)
            judged = verdict(ratio(worst), limit)
            if key == "cold_vs_floor_1000":
                judged = cold_verdict(measured, ratio(worst), limit)
            lines.append(
                f"target: {what} of 1,000 steps <= {limit:g}x its floor: {ratio(worst):.2f}x "
                f"(worst shape: {worst.shape}) {judged}"
            )
            values[key] = ratio(worst)
    slowness = [row.disk_slowness for row in small if row.disk_slowness is not None]
    if slowness:
        values["cold_floor_disk_vs_memory_1000"] = max(slowness)
    return lines, values


def cold_verdict(rows: list[Row], worst_ratio: float, limit: float) -> str:
    """MET or NOT MET, unless the disk was slow in some shape's rounds (SLOW_DISK_FACTOR): then
    a ratio under the limit says more about the disk than about the executor."""
    slow = [row for row in rows if row.disk_slowness is not None and row.disk_slowness > SLOW_DISK_FACTOR]
    if not slow or worst_ratio > limit:
        return verdict(worst_ratio, limit)
    shapes = ", ".join(
        f"{row.shape}: {median(row.cold_floor) * 1e6 / row.size:.0f} us a step on disk, "
        f"{median(row.cold_floor_memory) * 1e6 / row.size:.0f} in memory"
        for row in slow
    )
    return (
        f"NOT JUDGED: the disk was slow ({shapes}; more than {SLOW_DISK_FACTOR:g}x apart), and a slow "
        "floor makes every ratio to it small; run again when the disk is quiet"
    )


def git_commit(root: str | None = None) -> str:
    """The short commit of the checkout at `root` (default: this one), `+dirty` when its
    executor/ or bench/ has uncommitted changes."""
    from revision import commit  # (bench/ is on sys.path: this script's directory, or its importer's)

    return commit(("executor", "bench"), root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000], help="DAG sizes (steps)")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; the median is reported")
    parser.add_argument(
        "--cold-once-from", type=int, default=10_000, help="sizes from this one up get a single cold run"
    )
    parser.add_argument("--out", help="also write results.json and results.md into this directory")
    parser.add_argument("--tmp-dir", help="where the temporary prefixes go (default: the system temp dir)")
    parser.add_argument(
        "--whole-max",
        type=int,
        default=1_000,
        help="whole-process runs (python experiment.py) up to this size",
    )
    parser.add_argument(
        "--baselines",
        action="store_true",
        help="also run luigi and joblib (if installed) on the same DAGs, whole process",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep each DAG's completed prefix (for profiling)"
    )
    # Hidden: one measurement in a fresh process (warm re-run or floor).
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=SHAPES, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        print(json.dumps(CHILDREN[args.child](args.shape, args.size, args.prefix)), flush=True)
        return

    commit = git_commit()  # before measuring: others may commit while it runs
    made: list[str] = []
    rows: list[Row] = []
    try:
        scripts_dir = new_prefix(args.tmp_dir, "scripts", made)
        scripts = write_scripts(scripts_dir)
        baselines = write_baselines(scripts_dir, args.baselines)
        for size in args.sizes:
            for shape in args.shapes:
                rows.append(measure(shape, size, args, made, scripts, baselines))
    finally:
        for path in list(made):
            remove(path, made)

    machine = f"{os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}"
    target_lines, values = targets(rows)
    report = [
        f"executor overhead at commit {commit} ({machine}); times: medians of {args.repeats} rounds; "
        "ratios: medians of the per-round ratios",
        "",
        table(rows),
        "",
        *target_lines,
        *(f"{key}={value:.3f}" for key, value in values.items()),
        f"commit={commit}",
    ]
    print("\n".join(report), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.md"), "w") as handle:
            handle.write("\n".join(report) + "\n")
        raw = [
            {
                **row.__dict__,
                "ratio": row.ratio,
                "cold_ratio": row.cold_ratio,
                "whole_run_ratio": row.whole_run_ratio,
                "whole_cold_ratio": row.whole_cold_ratio,
                "whole_ratio": row.whole_ratio,
                "medians": {k: median(v) for k, v in row.__dict__.items() if isinstance(v, list) and v},
            }
            for row in rows
        ]
        with open(os.path.join(args.out, "results.json"), "w") as handle:
            json.dump(
                {"machine": machine, "commit": commit, "rows": raw, "targets": values}, handle, indent=2
            )


if __name__ == "__main__":
    main()
