"""The cold path's bookkeeping: the least a crash-safe, exactly-once step writes (executor.runner).

Status lines are appended (one O_APPEND write on local disk), a lease is created with
O_CREAT|O_EXCL under the directory flock and not rewritten before SUCCESS for a short
step, a quiet step leaves no log file, and a cached re-run writes nothing. A killed
driver leaves only whole lines and whole files, and drivers racing in separate
processes still run each step once.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from executor import Executor, ExecutorStep, LeaseConfig, this_output_path, versioned
from executor.lease import LeaseManager
from executor.store import LocalStore, open_store
from executor.tree import (
    INFO_FILE,
    LEASE_FILE,
    LOG_FILE,
    STATUS_FILE,
    LeaseRecord,
    Status,
    append_status,
    lease_path,
    read_status,
    status_path,
)
from tests.executor.steps_for_tests import WriteConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def quiet(config: WriteConfig) -> None:
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "done"), "w") as handle:
        handle.write("ok")


def chatty(config: WriteConfig) -> None:
    quiet(config)
    print("hello from the step")


def wait_for(predicate, timeout=30.0, interval=0.02):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


# -- what one step writes ------------------------------------------------------------


def test_a_quiet_step_leaves_its_output_info_and_two_status_lines_only(tmp_path):
    step = ExecutorStep("quiet", quiet, WriteConfig(output_path=this_output_path(), value=versioned(1)))
    executor = Executor(str(tmp_path), console=False)
    executor.run([step])
    output = executor.output_paths[step]
    assert sorted(os.listdir(output)) == sorted(["done", INFO_FILE, STATUS_FILE])  # no log, lease, temp
    assert [e.status for e in read_status(executor.store, output)] == [Status.RUNNING, Status.SUCCESS]
    assert json.loads((tmp_path / output / INFO_FILE).read_text())["name"] == "quiet"


def test_a_step_that_prints_gets_its_log_file(tmp_path):
    step = ExecutorStep("chatty", chatty, WriteConfig(output_path=this_output_path(), value=versioned(1)))
    executor = Executor(str(tmp_path), console=False)
    executor.run([step])
    log = executor.store.read_text(f"{executor.output_paths[step]}/{LOG_FILE}")
    assert log == "hello from the step\n"


def test_a_cached_rerun_writes_nothing(tmp_path):
    prefix = tmp_path / "prefix"
    step = ExecutorStep("quiet", quiet, WriteConfig(output_path=this_output_path(), value=versioned(1)))
    Executor(str(prefix), console=False).run([step])

    def snapshot():
        return {
            os.path.join(root, name): os.stat(os.path.join(root, name)).st_mtime_ns
            for root, dirs, files in os.walk(prefix)
            for name in [*dirs, *files, "."]
        }

    before = snapshot()
    time.sleep(0.01)  # a write now would show as a newer mtime
    plan = Executor(str(prefix), console=False).run([step])
    assert [row.action.value for row in plan.rows] == ["skip"]
    assert snapshot() == before  # not even the prefix's write probe


# -- status lines ----------------------------------------------------------------------


def test_status_lines_are_appended_to_the_same_file_on_local_disk(tmp_path):
    store, output = LocalStore(), str(tmp_path / "out")
    append_status(store, output, Status.RUNNING, worker="w")
    first = (tmp_path / "out" / STATUS_FILE).read_bytes()
    inode = os.stat(tmp_path / "out" / STATUS_FILE).st_ino
    append_status(store, output, Status.SUCCESS, worker="w", version_hash="abc")
    data = (tmp_path / "out" / STATUS_FILE).read_bytes()
    assert os.stat(tmp_path / "out" / STATUS_FILE).st_ino == inode  # not replaced by a rename
    assert data.startswith(first) and data.count(b"\n") == 2 and data.endswith(b"\n")
    assert [e.status for e in read_status(store, output)] == [Status.RUNNING, Status.SUCCESS]


def test_append_line_adds_whole_lines_on_every_store(store_and_root):
    store, root = store_and_root
    path = f"{root}/a/{STATUS_FILE}"
    store.append_line(path, '{"n": 1}')
    store.append_line(path, b'{"n": 2}')
    assert store.read_bytes(path) == b'{"n": 1}\n{"n": 2}\n'


def test_a_status_file_without_a_final_newline_gets_the_new_event_on_its_own_line(store_and_root):
    store, root = store_and_root
    output = f"{root}/old"
    store.write_atomic(status_path(output), "SUCCESS")  # Marin's one-word format, no newline
    append_status(store, output, Status.FAILED, "again", worker="w")
    assert [e.status for e in read_status(store, output)] == [Status.SUCCESS, Status.FAILED]


@pytest.mark.parametrize("failure", ["short write", "disk full"])
def test_a_failed_append_leaves_no_half_line(tmp_path, monkeypatch, failure):
    store, output = LocalStore(), str(tmp_path / "out")
    append_status(store, output, Status.RUNNING, worker="w")
    before = (tmp_path / "out" / STATUS_FILE).read_bytes()
    real_write = os.write

    def broken_write(fd, data):
        if failure == "disk full":
            real_write(fd, bytes(data)[:10])  # some bytes land, then the disk fills up
            raise OSError(28, "No space left on device")
        return real_write(fd, bytes(data)[: len(data) // 2])

    monkeypatch.setattr(os, "write", broken_write)
    with pytest.raises(OSError):
        append_status(store, output, Status.SUCCESS, worker="w")
    monkeypatch.setattr(os, "write", real_write)
    assert (tmp_path / "out" / STATUS_FILE).read_bytes() == before
    assert [e.status for e in read_status(store, output)] == [Status.RUNNING]


# -- leases --------------------------------------------------------------------------------


def test_creating_a_lease_never_replaces_an_existing_file(tmp_path):
    store, path = LocalStore(), str(tmp_path / "out" / LEASE_FILE)
    assert store.compare_and_swap(path, None, b"first")
    assert not store.compare_and_swap(path, None, b"second")
    assert store.read_bytes(path) == b"first"
    assert sorted(os.listdir(tmp_path / "out")) == [LEASE_FILE]  # created in place, no temporary file


def test_an_empty_lease_left_by_a_driver_killed_while_creating_it_is_taken_over(any_prefix, fast_leases):
    store = open_store(any_prefix)
    store.write_atomic(lease_path(f"{any_prefix}/s"), b"")
    manager = LeaseManager(store, fast_leases, "w2")
    try:
        assert manager.try_acquire(f"{any_prefix}/s").acquired
        assert LeaseRecord.parse(store.read_bytes(lease_path(f"{any_prefix}/s"))).worker == "w2"
    finally:
        manager.close()


def test_confirm_neither_reads_nor_rewrites_a_young_lease(any_prefix):
    config = LeaseConfig(heartbeat_interval=30, timeout=60, poll_interval=1)
    store = open_store(any_prefix)
    manager = LeaseManager(store, config, "w1")
    try:
        assert manager.try_acquire(f"{any_prefix}/s").acquired
        written = store.read_bytes(lease_path(f"{any_prefix}/s"))
        reads, writes = [], []
        store.read_bytes = lambda path: reads.append(path)
        store.compare_and_swap = lambda *args: writes.append(args)
        assert manager.confirm(f"{any_prefix}/s")
        assert reads == [] and writes == []
        del store.read_bytes, store.compare_and_swap
        assert store.read_bytes(lease_path(f"{any_prefix}/s")) == written
    finally:
        manager.close()


def test_confirm_refreshes_a_lease_older_than_the_heartbeat_interval(any_prefix):
    config = LeaseConfig(heartbeat_interval=30, timeout=60, poll_interval=1)
    store = open_store(any_prefix)
    manager = LeaseManager(store, config, "w1")
    try:
        assert manager.try_acquire(f"{any_prefix}/s").acquired
        before = LeaseRecord.parse(store.read_bytes(lease_path(f"{any_prefix}/s")))
        manager._written[f"{any_prefix}/s"] -= 31  # as if the step had run 31 s without a heartbeat
        assert manager.confirm(f"{any_prefix}/s")
        after = LeaseRecord.parse(store.read_bytes(lease_path(f"{any_prefix}/s")))
        assert after.worker == "w1" and after.heartbeat > before.heartbeat
    finally:
        manager.close()


def test_confirm_fails_when_the_lease_was_taken_over(any_prefix):
    config = LeaseConfig(heartbeat_interval=30, timeout=60, poll_interval=1)
    store = open_store(any_prefix)
    lost = []
    manager = LeaseManager(store, config, "w1", on_lost=lost.append)
    try:
        assert manager.try_acquire(f"{any_prefix}/s").acquired
        thief = LeaseRecord(worker="thief", heartbeat=time.time())
        store.write_atomic(lease_path(f"{any_prefix}/s"), thief.to_bytes())
        manager._written[f"{any_prefix}/s"] -= 31  # our last write is older than the heartbeat interval
        assert not manager.confirm(f"{any_prefix}/s")
        assert manager.was_lost(f"{any_prefix}/s") and lost == [f"{any_prefix}/s"]
    finally:
        manager.close()


# -- crashes and races across processes -------------------------------------------------------

DRIVER = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {repo!r})
    from dataclasses import dataclass
    from executor import Executor, ExecutorStep, LeaseConfig, this_output_path, versioned

    @dataclass(frozen=True)
    class Config:
        index: int
        counts: str
        output_path: str

    def step(config):
        with open(os.path.join(config.counts, str(config.index)), "a") as handle:
            handle.write("ran\\n")
        os.makedirs(config.output_path, exist_ok=True)
        with open(os.path.join(config.output_path, "done"), "w") as handle:
            handle.write("ok")
        if config.index % 5 == 0:
            print("step", config.index, "says hello")

    prefix, counts, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    steps = [
        ExecutorStep(f"s/{{i:03d}}", step, Config(index=versioned(i), counts=counts, output_path=this_output_path()))
        for i in range(size)
    ]
    leases = LeaseConfig(heartbeat_interval=0.1, timeout=1.0, poll_interval=0.05)
    Executor(prefix, console=False, lease_config=leases).run(steps, max_concurrent=4)
    """
)


def driver(tmp_path, prefix, counts, size) -> list[str]:
    script = tmp_path / "driver.py"
    if not script.exists():
        script.write_text(DRIVER.format(repo=REPO))
    return [sys.executable, str(script), str(prefix), str(counts), str(size)]


def runs_per_step(counts, size) -> list[int]:
    return [
        len((counts / str(i)).read_text().splitlines()) if (counts / str(i)).exists() else 0
        for i in range(size)
    ]


def step_outputs(prefix) -> list[str]:
    parent = prefix / "s"
    return sorted(str(parent / name) for name in os.listdir(parent)) if parent.exists() else []


@pytest.mark.parametrize("kill_after", [3, 25])
def test_a_driver_killed_mid_run_leaves_whole_lines_and_files_and_finished_steps_never_rerun(
    tmp_path, kill_after
):
    prefix, counts, size = tmp_path / "prefix", tmp_path / "counts", 60
    counts.mkdir()
    victim = subprocess.Popen(driver(tmp_path, prefix, counts, size))
    try:
        wait_for(lambda: sum(runs_per_step(counts, size)) >= kill_after or victim.poll() is not None)
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
    store = LocalStore()
    finished = set()
    for output in step_outputs(prefix):
        events = read_status(store, output)  # raises on a torn line
        if events and events[-1].status == Status.SUCCESS:
            finished.add(output)
        info = store.read_bytes(f"{output}/{INFO_FILE}")
        assert info is None or isinstance(json.loads(info), dict)
        lease = store.read_bytes(lease_path(output))
        assert lease is None or lease == b"" or LeaseRecord.parse(lease) is not None
    before = runs_per_step(counts, size)
    time.sleep(1.2)  # the killed driver's leases expire
    subprocess.run(driver(tmp_path, prefix, counts, size), check=True)
    after = runs_per_step(counts, size)
    outputs = step_outputs(prefix)
    assert len(outputs) == size
    for output in outputs:
        assert read_status(store, output)[-1].status == Status.SUCCESS
        lease = store.read_bytes(lease_path(output))  # only the killed driver's may be left behind:
        assert (
            lease in (None, b"") or LeaseRecord.parse(lease).pid == victim.pid
        )  # SUCCESS, killed before release
    ran_again = [i for i in range(size) if after[i] != before[i]]
    finished_indexes = {
        int(json.loads(store.read_bytes(f"{p}/{INFO_FILE}"))["config"]["index"]) for p in finished
    }
    assert not finished_indexes & set(ran_again)
    assert all(after[i] == before[i] + 1 for i in ran_again)


def test_drivers_in_separate_processes_racing_for_the_same_steps_run_each_once(tmp_path):
    prefix, counts, size = tmp_path / "prefix", tmp_path / "counts", 40
    counts.mkdir()
    drivers = [subprocess.Popen(driver(tmp_path, prefix, counts, size)) for _ in range(3)]
    try:
        for process in drivers:
            assert process.wait(timeout=300) == 0
    finally:  # a failed or timed-out wait must not leave the other drivers running
        for process in drivers:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert runs_per_step(counts, size) == [1] * size
    store = LocalStore()
    for output in step_outputs(prefix):
        assert [e.status for e in read_status(store, output)] == [Status.RUNNING, Status.SUCCESS]


# -- imports ---------------------------------------------------------------------------------


def test_import_executor_loads_neither_fsspec_nor_draccus():
    code = (
        "import sys, executor\n"
        "heavy = sorted(m for m in ('fsspec', 'draccus', 'executor.main') if m in sys.modules)\n"
        "main = executor.executor_main\n"
        "print(heavy, main.__module__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert result.stdout.strip() == "[] executor.main"


def test_a_local_run_works_with_fsspec_unavailable(tmp_path):
    code = textwrap.dedent(
        f"""
        import os, sys
        sys.modules["fsspec"] = None  # any import of fsspec now fails
        sys.path.insert(0, {REPO!r})
        from dataclasses import dataclass
        from executor import Executor, ExecutorStep, this_output_path, versioned

        @dataclass(frozen=True)
        class Config:
            value: int
            output_path: str

        def quiet(config):
            os.makedirs(config.output_path, exist_ok=True)

        step = ExecutorStep("quiet", quiet, Config(value=versioned(1), output_path=this_output_path()))
        Executor({str(tmp_path)!r}, console=False).run([step])
        print(Executor({str(tmp_path)!r}, console=False).run([step]).rows[0].action.value)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "skip"
