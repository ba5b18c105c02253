"""The lease keeper: light steps' heartbeats in a process of their own (issue 10, fencing).

Two faults from a red-team run, reproduced with real driver processes on local disk:

- a step that holds the GIL longer than the lease timeout starved the heartbeat thread of
  its own driver, a second driver took the lease, and the step ran twice;
- a driver paused past the timeout, then resumed, went on writing into an output another
  driver had already marked SUCCESS.

With the keeper, the first cannot happen (the heartbeat shares no GIL with the step), and in
the second the resumed driver is killed. The same scenarios with heartbeats from a thread
(`heartbeat_process=False`) show the faults, so the tests would catch the keeper's loss.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from executor import Executor, ExecutorStep, LeaseConfig, lease_keeper, this_output_path, versioned
from executor.lease_keeper import LeaseKeeper, shared_keeper
from executor.store import LocalStore, open_store
from executor.tree import LeaseRecord, Status, lease_path, read_status
from tests.executor.steps_for_tests import WriteConfig, write_value
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]

DRIVER = """
import os, sys, time
from dataclasses import dataclass
from executor import Executor, ExecutorStep, LeaseConfig, this_output_path, versioned

@dataclass(frozen=True)
class Config:
    output_path: str
    work: str = versioned("w")

def step_body(config):
    scratch = os.environ["SCRATCH"]
    with open(os.path.join(scratch, "calls"), "a") as handle:
        handle.write(os.environ["ROLE"] + "\\n")
    open(os.path.join(scratch, "started-" + os.environ["ROLE"]), "w").close()
    mode = os.environ["MODE"]
    if mode == "hold_gil":
        sum(range(int(os.environ["GIL_LOOPS"])))  # one C call: holds the GIL throughout
    elif mode == "keep_writing":
        deadline = time.time() + 20
        while time.time() < deadline:
            with open(os.path.join(scratch, "writes"), "a") as handle:
                handle.write(f"{os.environ['ROLE']} {time.time()}\\n")
            time.sleep(0.02)

config = LeaseConfig(heartbeat_interval=0.1, timeout=0.8, poll_interval=0.05,
                     heartbeat_process=os.environ["KEEPER"] == "1")
step = ExecutorStep(name="guarded", fn=step_body, config=Config(output_path=this_output_path()))
Executor(os.environ["PREFIX"], console=False, lease_config=config).run([step])
"""


def start_driver(tmp_path: Path, role: str, mode: str, keeper: bool, **env: str) -> subprocess.Popen:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "PREFIX": str(tmp_path / "out"),
        "SCRATCH": str(tmp_path),
        "ROLE": role,
        "MODE": mode,
        "KEEPER": "1" if keeper else "0",
        **env,
    }
    return subprocess.Popen(
        [sys.executable, str(script)],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the driver and its keeper
    )


def stop(*drivers: subprocess.Popen | None) -> None:
    """Kill what is left of these drivers and their keepers (each driver leads its own group)."""
    for driver in drivers:
        if driver is not None and driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()


def wait_started(driver: subprocess.Popen, tmp_path: Path, role: str) -> None:
    def started() -> bool:
        if driver.poll() is not None:
            raise AssertionError(f"driver {role} exited ({driver.returncode}):\n{driver.stderr.read()}")
        return (tmp_path / f"started-{role}").exists()

    wait_for(started, timeout=60)


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().split() if path.exists() else []


def output_dir(tmp_path: Path) -> str:
    (directory,) = [p for p in (tmp_path / "out").iterdir() if p.name.startswith("guarded-")]
    return str(directory)


def gil_loops_for(seconds: float) -> int:
    """How many `sum(range(n))` iterations take about `seconds` here."""
    start = time.perf_counter()
    sum(range(2_000_000))
    per_loop = (time.perf_counter() - start) / 2_000_000
    return int(seconds / per_loop)


@pytest.mark.slow
@pytest.mark.parametrize(("keeper", "runs"), [(True, ["a"]), (False, ["a", "b"])])
def test_a_step_holding_the_gil_past_the_timeout_runs_once_only_with_the_keeper(tmp_path, keeper, runs):
    loops = str(gil_loops_for(3.0))  # well past the 0.8 s timeout
    first = start_driver(tmp_path, "a", "hold_gil", keeper, GIL_LOOPS=loops)
    second = None
    try:
        wait_started(first, tmp_path, "a")
        second = start_driver(tmp_path, "b", "none", keeper)
        _, second_err = second.communicate(timeout=120)
        _, first_err = first.communicate(timeout=120)
    finally:
        stop(first, second)
    assert second.returncode == 0, second_err
    # With heartbeats from a thread, the GIL-holding step starved them, the second driver took
    # the stale lease over and ran the step again (the first then found its lease lost): the
    # fault the keeper removes.
    assert calls(tmp_path) == runs
    if keeper:
        assert first.returncode == 0, first_err
    else:
        assert first.returncode == 1 and "lease_lost" in first_err
    statuses = [event.status for event in read_status(LocalStore(), output_dir(tmp_path))]
    assert statuses[-1] == Status.SUCCESS


@pytest.mark.slow
def test_a_driver_paused_past_the_timeout_is_killed_when_it_resumes(tmp_path):
    first = start_driver(tmp_path, "a", "keep_writing", keeper=True)
    second = None
    try:
        wait_started(first, tmp_path, "a")
        wait_for(lambda: (tmp_path / "writes").exists(), timeout=10)
        os.killpg(first.pid, signal.SIGSTOP)  # the driver and its keeper, as Ctrl-Z would
        time.sleep(1.5)  # past the 0.8 s timeout
        second = start_driver(tmp_path, "b", "none", keeper=True)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 0, err
        output = output_dir(tmp_path)
        after_takeover = read_status(LocalStore(), output)
        assert after_takeover[-1].status == Status.SUCCESS
        os.killpg(first.pid, signal.SIGCONT)
        _, err = first.communicate(timeout=30)
    finally:
        stop(first, second)
    assert first.returncode == -signal.SIGKILL
    assert "was taken over by another driver while this driver held it" in err
    # The paused driver never wrote its status over the one that took the step over.
    assert read_status(LocalStore(), output) == after_takeover
    assert calls(tmp_path) == ["a", "b"]


@pytest.mark.slow
def test_a_driver_paused_alone_keeps_its_lease_through_its_keeper(tmp_path):
    first = start_driver(tmp_path, "a", "keep_writing", keeper=True)
    second = None
    try:
        wait_started(first, tmp_path, "a")
        os.kill(first.pid, signal.SIGSTOP)  # the driver only: its keeper goes on
        second = start_driver(tmp_path, "b", "none", keeper=True)
        time.sleep(2.0)  # more than twice the timeout: the lease stays alive all along
        assert calls(tmp_path) == ["a"]
        record = LeaseRecord.parse(LocalStore().read_bytes(lease_path(output_dir(tmp_path))))
        assert record is not None and time.time() - record.heartbeat < 0.8
    finally:
        stop(first, second)  # (the first's step would write for 20 s; the second waits on it)


# -- the keeper process itself ----------------------------------------------------------------


def lease(worker: str = "w") -> bytes:
    now = time.time()
    return LeaseRecord(worker=worker, heartbeat=now).to_bytes()


def hold_a_lease(keeper: LeaseKeeper, root, interval: float, worker: str = "w"):
    """A lease of `worker` written at `<root>/s` and handed to `keeper`: (store, path, bytes)."""
    store = LocalStore()
    path = f"{root}/s/.executor_status.lock"
    mine = lease(worker)
    store.write_atomic(path, mine)
    keeper.send("hold", path, mine, interval=interval)
    return store, path, mine


@pytest.fixture
def keeper_and_root(tmp_path):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    keeper = LeaseKeeper(str(tmp_path), kill_pid=victim.pid)
    yield keeper, tmp_path, victim
    keeper.close()
    victim.kill()
    victim.wait()


@pytest.mark.parametrize("directory", ["s", 'a "b"\\c\né/s'], ids=["plain", "needing-escapes"])
def test_the_keeper_refreshes_a_held_lease_keeping_who_holds_it(keeper_and_root, directory):
    keeper, root, _ = keeper_and_root
    store = LocalStore()
    path = f"{root}/{directory}/.executor_status.lock"  # (the messages quote the path: see below)
    first = lease()
    store.write_atomic(path, first)
    keeper.send("hold", path, first, interval=0.05)
    wait_for(lambda: store.read_bytes(path) != first, timeout=10)
    # One read: the keeper refreshes every 50 ms, so a second read may see a newer heartbeat
    # (it did, once, in a full run on a loaded machine).
    refreshed = store.read_bytes(path)
    before, after = LeaseRecord.parse(first), LeaseRecord.parse(refreshed)
    assert after.heartbeat > before.heartbeat
    assert after.worker == before.worker
    assert json.loads(refreshed) == json.loads(after.to_bytes())
    keeper.send("drop", path, worker="w")
    assert keeper.ask("refresh", path, "w") == (False, None)  # dropped: no longer kept


@pytest.mark.parametrize(
    ("op", "path", "worker", "data", "interval"),
    [
        ("hold", '/t/a "b"\\c\né\u2028/s/.executor_status.lock', "h:1:ab", b'{"x": 1}\xff\x00', 10.0),
        ("hold", "/t/s/.executor_status.lock", "w", b"", 0.001),
        ("drop", "/t/s/.executor_status.lock", None, None, None),
        ("forget", "/t/\x7f/.executor_status.lock", "w/step:h:2:cd", None, None),
    ],
)
def test_a_message_line_is_the_json_the_keeper_reads(op, path, worker, data, interval):
    # The lines are built without json.dumps (two a step): they must say exactly what it would.
    line = lease_keeper._message_line(op, path, worker, data, interval)
    expected = {"op": op, "path": path, "worker": worker}
    if data is not None:
        expected["bytes"] = data.decode("latin-1")
    if interval is not None:
        expected["interval"] = interval
    assert line == json.dumps(expected).encode() + b"\n"
    assert line.count(b"\n") == 1 and line.isascii()  # one message a line, whatever the path holds


def test_refresh_release_and_hand_over_answer_with_the_current_bytes(keeper_and_root):
    keeper, root, _ = keeper_and_root
    store = LocalStore()
    path = f"{root}/s/.executor_status.lock"
    store.write_atomic(path, lease())
    keeper.send("hold", path, store.read_bytes(path), interval=30)
    ok, data = keeper.ask("refresh", path, "w")
    assert ok and data == store.read_bytes(path)
    ok, handed = keeper.ask("hand_over", path, "w")
    assert ok and handed == data and store.read_bytes(path) == data  # handed over, not deleted
    assert keeper.ask("refresh", path, "w") == (False, None)  # not kept any more
    keeper.send("hold", path, data, interval=30)
    assert keeper.ask("release", path, "w") == (True, None)
    assert store.read_bytes(path) is None
    assert keeper.ask("release", path, "w") == (False, None)


def test_a_dropped_lease_is_no_longer_refreshed(keeper_and_root):
    keeper, root, victim = keeper_and_root
    store, path, mine = hold_a_lease(keeper, root, interval=0.2)
    keeper.send("drop", path, worker="w")  # the driver then deletes the file itself
    store.delete(path)
    time.sleep(0.5)
    assert store.read_bytes(path) is None  # the keeper did not bring it back...
    assert victim.poll() is None and keeper.alive()  # ...nor take the missing file for a takeover


def test_a_dropped_lease_the_keeper_had_refreshed_is_deleted_by_the_keeper(keeper_and_root):
    keeper, root, _ = keeper_and_root
    store, path, mine = hold_a_lease(keeper, root, interval=0.05)
    wait_for(lambda: store.read_bytes(path) != mine, timeout=10)
    keeper.send("drop", path, worker="w")
    wait_for(lambda: store.read_bytes(path) is None, timeout=10)


def test_a_lease_taken_over_makes_the_keeper_kill_its_driver(keeper_and_root):
    keeper, root, victim = keeper_and_root
    store, path, mine = hold_a_lease(keeper, root, interval=0.05)
    store.write_atomic(path, lease("thief"))
    assert victim.wait(timeout=10) == -signal.SIGKILL
    assert keeper.wait(timeout=10) == 3
    assert LeaseRecord.parse(store.read_bytes(path)).worker == "thief"


def test_the_keeper_exits_when_its_driver_closes_the_pipe(tmp_path):
    keeper = LeaseKeeper(str(tmp_path))
    keeper.send("hold", f"{tmp_path}/x/.executor_status.lock", lease(), interval=30)
    keeper.close()
    assert keeper.wait(timeout=10) == 0


def test_runs_in_one_process_share_one_keeper_and_a_tree_in_memory_uses_none(tmp_path):
    steps = [
        ExecutorStep(
            name=f"s{i}",
            fn=write_value,
            config=WriteConfig(output_path=this_output_path(), value=versioned(i)),
        )
        for i in range(2)
    ]
    Executor(str(tmp_path / "a"), console=False).run(steps[:1])
    keeper = shared_keeper(str(tmp_path))
    Executor(str(tmp_path / "b"), console=False).run(steps[1:])
    assert shared_keeper(str(tmp_path / "b")) is keeper and keeper.alive()
    Executor("memory://keeper-test", console=False).run(steps)
    assert "memory" not in lease_keeper._KEEPERS  # none for a tree only this process can see
    assert shared_keeper(str(tmp_path)) is keeper


def test_a_keeper_that_fell_behind_reads_every_queued_message_before_refreshing(keeper_and_root):
    """The driver dropped and deleted its lease and a second driver took the step, while the
    keeper was not running (a loaded machine), with many messages queued in front of the
    drop: no takeover, the driver lives."""
    keeper, root, victim = keeper_and_root
    store, path, mine = hold_a_lease(keeper, root, interval=0.05, worker="first")
    os.kill(keeper.pid, signal.SIGSTOP)
    try:
        for i in range(60):  # ~33 KB of other leases' messages (a pipe holds 64 KB)
            other = f"{root}/other-{i:04d}/.executor_status.lock"
            keeper.send("hold", other, lease("first"), interval=60)
            keeper.send("drop", other, worker="first")
        keeper.send("drop", path, worker="first")
        store.delete(path)
        store.write_atomic(path, lease("second"))  # another driver's lease now
        time.sleep(1.2)  # past the interval, and long enough to count as a pause
    finally:
        os.kill(keeper.pid, signal.SIGCONT)
    time.sleep(1.0)
    assert victim.poll() is None and keeper.alive()
    assert LeaseRecord.parse(store.read_bytes(path)).worker == "second"


def test_a_lease_deleted_by_a_driver_that_finished_the_step_counts_as_taken_over(keeper_and_root):
    """Our driver announces every deletion of a lease it holds before it makes it; a lease
    that disappears without one, from a step whose status another worker wrote, was taken
    over and the step finished elsewhere: the driver must stop."""
    keeper, root, victim = keeper_and_root
    store, path, mine = hold_a_lease(keeper, root, interval=0.05)
    store.append_line(f"{root}/s/.executor_status", json.dumps({"status": "SUCCESS", "worker": "other"}))
    store.delete(path)
    assert victim.wait(timeout=10) == -signal.SIGKILL


def test_a_lease_removed_with_its_whole_output_is_forgotten(keeper_and_root):
    keeper, root, victim = keeper_and_root
    store, path, mine = hold_a_lease(keeper, root, interval=0.05)
    store.delete_tree(f"{root}/s")  # e.g. a test cleaning up, or `rm -r` of the tree
    time.sleep(0.5)
    assert victim.poll() is None and keeper.alive()
    assert keeper.ask("refresh", path, "w") == (False, None)  # not kept any more


def test_a_forgotten_lease_is_left_alone_to_go_stale(keeper_and_root):
    keeper, root, victim = keeper_and_root
    store, path, mine = hold_a_lease(keeper, root, interval=0.05)
    keeper.send("forget", path, worker="w")
    time.sleep(0.3)
    assert store.read_bytes(path) == mine  # not refreshed, not deleted
    store.delete(path)
    time.sleep(0.3)
    assert victim.poll() is None and keeper.alive()


def test_a_message_from_a_run_that_no_longer_holds_the_lease_is_ignored(keeper_and_root):
    """Two runs in one driver process share the keeper: once the second took the lease over,
    the first's messages about it change nothing."""
    keeper, root, victim = keeper_and_root
    store = LocalStore()
    path = f"{root}/s/.executor_status.lock"
    store.write_atomic(path, lease("second"))
    keeper.send("hold", path, store.read_bytes(path), interval=30)
    assert keeper.ask("release", path, "first") == (False, None)
    keeper.send("drop", path, worker="first")
    assert LeaseRecord.parse(store.read_bytes(path)).worker == "second"
    ok, data = keeper.ask("refresh", path, "second")
    assert ok and LeaseRecord.parse(data).worker == "second"


def test_closing_a_lease_manager_makes_the_keeper_forget_its_leases(tmp_path):
    from executor import LeaseConfig
    from executor.lease import LeaseManager

    store = LocalStore()
    manager = LeaseManager(
        store, LeaseConfig(heartbeat_interval=0.05, timeout=5), "w1", keeper_prefix=str(tmp_path)
    )
    output = f"{tmp_path}/step"
    assert manager.try_acquire(output).acquired
    wait_for(
        lambda: LeaseRecord.parse(store.read_bytes(lease_path(output))).heartbeat > time.time() - 0.04,
        timeout=10,
    )
    manager.close()  # a run that ended holding the lease
    time.sleep(0.1)
    left = store.read_bytes(lease_path(output))
    time.sleep(0.3)
    assert store.read_bytes(lease_path(output)) == left  # no longer refreshed: it will go stale
    store.delete(lease_path(output))  # e.g. a test removing its tree: no takeover, no kill
    time.sleep(0.3)
    assert shared_keeper(str(tmp_path)).alive()


def test_a_lease_whose_refresh_found_it_taken_is_no_longer_kept(keeper_and_root):
    """The driver asked for a refresh (a step outlived the heartbeat interval) and the keeper
    found the lease taken: the driver reports the step lost; the keeper must not go on and
    find the same takeover at its next heartbeat (it killed the whole test suite once)."""
    keeper, root, victim = keeper_and_root
    store, path, mine = hold_a_lease(keeper, root, interval=0.3)
    store.write_atomic(path, lease("thief"))
    assert keeper.ask("refresh", path, "w") == (False, None)
    time.sleep(0.8)  # past the next heartbeat
    assert victim.poll() is None and keeper.alive()


@dataclass(frozen=True)
class GilConfig:
    output_path: str
    loops: int
    """`sum(range(loops))`: one C call that holds the GIL throughout."""

    tag: str = versioned("gil")


def hold_the_gil_then_read_the_lease(config: GilConfig) -> None:
    store = open_store(config.output_path)
    sum(range(config.loops))
    record = LeaseRecord.parse(store.read_bytes(lease_path(config.output_path)))
    store.write_atomic(f"{config.output_path}/heartbeat_age", str(time.time() - record.heartbeat))


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["s3", "gcs"])
def test_on_object_storage_the_keeper_refreshes_the_lease_while_a_step_holds_the_gil(
    request, storage, monkeypatch
):
    """The lease of a light step on s3:// and gs:// is refreshed by the keeper process while
    the step holds the GIL for about 2 s (heartbeat every 0.2 s): its heartbeat is fresh when
    the step looks. A heartbeat thread would have been starved for the whole 2 s."""
    request.getfixturevalue(f"{storage}_env")  # endpoint and credentials in the environment
    prefix = request.getfixturevalue(f"{storage}_prefix")
    # A keeper of this test's own, started with this environment: the process's shared one for
    # the storage may have been started by an earlier test with another endpoint (mutmut runs
    # the tests in another order, where it failed: docs/testing.md, fifteenth session).
    monkeypatch.setattr(lease_keeper, "_KEEPERS", {})
    config = LeaseConfig(heartbeat_interval=0.2, timeout=10, poll_interval=0.1)
    step = ExecutorStep(
        name="gil",
        fn=hold_the_gil_then_read_the_lease,
        config=GilConfig(output_path=this_output_path(), loops=gil_loops_for(2.0)),
    )
    try:
        executor = Executor(prefix, console=False, lease_config=config)
        executor.run([step])
        age = float(executor.store.read_text(f"{executor.output_paths[step]}/heartbeat_age"))
        assert age < 1.0, f"the lease's last heartbeat was {age:.2f} s old when the step looked"
        assert shared_keeper(prefix).alive()
    finally:
        for keeper in lease_keeper._KEEPERS.values():
            keeper.close()


def test_a_keeper_whose_driver_is_gone_before_it_is_ready_exits_without_a_traceback(tmp_path):
    """A run that ends within milliseconds may exit before its keeper says it is up: the
    keeper's first write meets a closed pipe. That is no error to show the user."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the driver is gone before the keeper writes its first line
    spec = json.dumps({"prefix": str(tmp_path), "kill_pid": os.getpid()})
    entry = "import sys; from executor.lease_keeper import main; sys.exit(main(sys.argv[1]))"
    try:
        keeper = subprocess.run(
            [sys.executable, "-c", entry, spec],
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert (keeper.returncode, keeper.stderr) == (0, "")
