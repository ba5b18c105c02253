"""Leases: at most one driver runs a step at a time, and a dead driver's step is taken over.

A lease is the file `<output>/.executor_status.lock` holding the holder's worker id
and the time of its last heartbeat. Every change to it is a compare-and-swap through
the store, so two drivers can never both believe they hold it:

- acquire: create the file if absent (on local disk one `O_CREAT|O_EXCL` open and one
  write, under the directory's flock), or replace it if its heartbeat is older than
  `timeout` (the holder died: SIGKILL, lost machine, preemption);
- heartbeat: a background thread rewrites the holder's lease every
  `heartbeat_interval`, swapping from the exact bytes it wrote last time. If the
  swap fails, someone else took the lease over: the lease is *lost*, and the driver
  is told so (it must not mark the step successful -- Marin #8107);
- confirm, before a step's final status: if our last write to the lease is younger than
  `heartbeat_interval`, nothing to do: another driver takes a lease over only once its
  heartbeat is `timeout` old, so a lease we wrote less than `heartbeat_interval` ago
  (by this process's monotonic clock) cannot have been taken over by anyone following
  this protocol, and cannot be for another `timeout - heartbeat_interval` seconds, far
  longer than writing one status line takes. An older lease (a step that outlived a
  heartbeat, or a driver that was paused) is swapped from our exact bytes first: if
  someone took it over, the swap fails and the lease is lost;
- release: delete the file -- directly while our last write is that young (no one else
  can hold it), otherwise only if it still holds our bytes (compare-and-swap).

A step shorter than the heartbeat interval thus creates its lease once, deletes it once,
and never reads it. What the timing rule does not defend against is someone outside the
protocol rewriting a young lease by hand; a lease older than the heartbeat interval is
always checked against our bytes.

Timing is wall-clock time of the drivers (the lease's `timestamp` is Unix time), so
drivers on different machines need clocks within a fraction of `timeout`.

Where the heartbeats run. By default a thread of the driver refreshes its leases. Given a
`keeper_prefix` (the executor passes its prefix for trees on local disk, S3 and GCS), they are
refreshed by a process of their own (`executor.lease_keeper`): light steps run in the
driver's threads, and a step that holds the GIL past the timeout would otherwise starve its
own heartbeat and be taken over while it still runs. The keeper kills the driver if one of
its leases is taken over anyway (the driver was paused past the timeout), so that the step
cannot write into an output another driver owns. Confirming and releasing a young lease
stay local (the keeper refreshes a lease only once it is a heartbeat interval old); for an
older one the driver asks the keeper, which holds the lease's current bytes. "Young" is
judged just before the delete, so the keeper's first refresh can begin in between; the
delete therefore waits for a swap in progress (`Store.delete_between_swaps`), or the swap's
rename would make the file again in an output the run has finished with.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from _thread import RLock, allocate_lock  # (`threading` loads with the heartbeat thread)
from collections.abc import Callable, Mapping

from executor.lazy_logging import LazyLogger
from executor.records import dataclass
from executor.store import NotRegularFileError, Store
from executor.tree import LeaseRecord, lease_path

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    import threading

logger = LazyLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class LeaseConfig:
    """Timing of leases. Tests use intervals of a fraction of a second."""

    heartbeat_interval: float = 10.0
    """Seconds between refreshes of every lease this driver holds."""

    timeout: float = 60.0
    """A lease whose last heartbeat is older than this many seconds is taken over."""

    poll_interval: float = 5.0
    """Seconds between checks while waiting for a step another driver is running."""

    heartbeat_process: bool = True
    """Refresh leases from a keeper process of their own (`executor.lease_keeper`), which
    kills the driver if one of its leases is taken over while a step runs in it. False: from
    a thread of the driver, which a step holding the GIL can starve, and which can only mark
    such a step lost, not stop it (tests that stage a takeover inside their own process)."""

    # (Not annotated: a class variable, not a field, without `typing.ClassVar` -- and `typing`.)
    ENV_VARS = {
        "timeout": "MARIN_LEASE_TIMEOUT",
        "heartbeat_interval": "MARIN_LEASE_HEARTBEAT",
        "poll_interval": "MARIN_LEASE_POLL",
    }
    """The environment variables `from_env` reads, by field."""

    def __post_init__(self):
        if not isinstance(self.heartbeat_process, bool):
            raise ValueError(f"heartbeat_process must be True or False, got {self.heartbeat_process!r}")
        _check_timing(
            {name: getattr(self, name) for name in self.ENV_VARS}, {name: name for name in self.ENV_VARS}
        )

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        sources: Mapping[str, str] | None = None,
        **given: float | None,
    ) -> LeaseConfig:
        """Timing from `given` values (None: not given), else `$MARIN_LEASE_*`, else the defaults.

        `sources` names where each given value came from (e.g. `{"timeout": "--lease_timeout"}`),
        so that a ValueError names the flag or the variable to fix.
        """
        environ = os.environ if environ is None else environ
        defaults = {field.name: field.default for field in dataclasses.fields(cls)}
        values: dict[str, float] = {}
        names: dict[str, str] = {}
        for name, variable in cls.ENV_VARS.items():
            if given.get(name) is not None:
                values[name], names[name] = given[name], (sources or {}).get(name, name)
            elif environ.get(variable, "").strip():
                raw = environ[variable]
                # float() also reads "5_0" as 50 and digits of other scripts: plain decimals only.
                if not re.fullmatch(_PLAIN_NUMBER, raw.strip()):
                    raise ValueError(f"{variable}={raw!r} is not a number of seconds") from None
                values[name] = float(raw)
                names[name] = variable
            else:
                values[name] = defaults[name]
                names[name] = f"the default {(sources or {}).get(name, name)}"
        unknown = set(given) - set(cls.ENV_VARS)
        if unknown:
            raise TypeError(f"LeaseConfig.from_env: unknown settings {sorted(unknown)}")
        _check_timing(values, names)
        return cls(**values)


MIN_SECONDS = 0.001
"""The least a lease timing may be (tests run with heartbeats of 10 ms and polls of 1 ms)."""

MAX_SECONDS = 30 * 86400
"""The longest lease timing accepted (30 days)."""

_PLAIN_NUMBER = r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
"""A number of seconds as `MARIN_LEASE_*` may spell it, in ASCII: 60, 0.5, .5, 1e3 (a regular
expression, compiled only when such a variable is set)."""


def _check_timing(values: Mapping[str, object], names: Mapping[str, str]) -> None:
    """ValueError naming the setting (`names`: field -> flag, variable or field name) to fix."""
    for name, value in values.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ValueError(f"{names[name]} must be a positive number of seconds, got {value!r}")
        if value < MIN_SECONDS:  # 1e-300 s between heartbeats is a busy loop, not a setting
            raise ValueError(f"{names[name]} must be at least {MIN_SECONDS:g} seconds, got {value!r}")
        if value > MAX_SECONDS:  # 1e300 s overflowed the clock while a run waited
            raise ValueError(
                f"{names[name]} must be at most {MAX_SECONDS:,} seconds (30 days), got {value!r}"
            )
    if values["heartbeat_interval"] >= values["timeout"]:
        raise ValueError(
            f"{names['heartbeat_interval']} ({values['heartbeat_interval']:g}s) must be smaller than "
            f"{names['timeout']} ({values['timeout']:g}s): the lease is refreshed every heartbeat and "
            "taken over by another driver once the timeout passes without one"
        )


def _hostname() -> str:
    return os.uname().nodename  # what socket.gethostname() returns, without importing socket


def new_worker_id() -> str:
    """Unique per driver (per Executor run): host, pid and a random suffix."""
    return f"{_hostname()}:{os.getpid()}:{os.urandom(4).hex()}"


@dataclass(frozen=True)
class AcquireResult:
    acquired: bool
    holder: LeaseRecord | None = None
    """When not acquired: the current holder. When acquired: the stale lease taken over, if any."""


_KEEPER_MODULE: list = []  # executor.lease_keeper, once a run has used a keeper


def _keeper_module():
    """`executor.lease_keeper`, imported at first use: a cached re-run takes no lease, and
    looked up once, not by an import statement on each of a step's two messages."""
    if not _KEEPER_MODULE:
        import executor.lease_keeper

        _KEEPER_MODULE.append(executor.lease_keeper)
    return _KEEPER_MODULE[0]


MAX_LEASE_BYTES = 64 * 1024
"""The most of a lease file read (a lease is ~100 bytes): a bigger one is not a lease."""


def read_lease(store: Store, output_path: str) -> LeaseRecord | None:
    """The lease of a step output, or None when there is none (or it cannot be read as one).

    A directory in the lease's place, or a file too big to be a lease, raises
    NotRegularFileError: no lease could ever be written there, and waiting for one hung the
    run; the plan makes it this step's error instead."""
    path = lease_path(output_path)
    try:
        data, whole = store.read_tail(path, MAX_LEASE_BYTES)
    except IsADirectoryError:
        raise NotRegularFileError(path, "it is a directory, not a regular file") from None
    if not whole:
        raise NotRegularFileError(path, f"it is over {MAX_LEASE_BYTES:,} bytes long, which no lease is")
    return LeaseRecord.parse(data)


MAX_CLOCK_AHEAD_S = 86400.0
"""How far in the future a lease's heartbeat may be and still be believed (a day: clocks of
machines sharing a bucket differ by seconds). A lease dated later -- written by a broken clock
or edited by hand -- would otherwise look live forever and block its step for good."""


def lease_is_stale(record: LeaseRecord | None, timeout: float, now: float | None = None) -> bool:
    """True when nobody holds the lease: absent, no heartbeat for more than `timeout` seconds,
    or a heartbeat more than `MAX_CLOCK_AHEAD_S` in the future."""
    if record is None:
        return True
    age = (time.time() if now is None else now) - record.heartbeat
    return age > timeout or age < -MAX_CLOCK_AHEAD_S


class LeaseManager:
    """The leases one driver holds, and the heartbeat thread that keeps them alive."""

    def __init__(
        self,
        store: Store,
        config: LeaseConfig,
        worker_id: str,
        on_lost: Callable[[str], None] = lambda output_path: None,
        keeper_prefix: str | None = None,
    ):
        """`keeper_prefix`: refresh leases from a keeper process that opens this prefix's
        store (see the module docstring), not from a thread of this process."""
        self.store = store
        self.keeper_prefix = keeper_prefix
        self.config = config
        self.worker_id = worker_id
        self.on_lost = on_lost
        self._held: dict[str, bytes] = {}  # output path -> the bytes we last wrote
        # Output path -> when the heartbeat we last wrote was taken, by time.monotonic()
        # sampled with it (before the write, so the age is never underestimated): a
        # wall-clock jump must not make an old lease look young.
        self._written: dict[str, float] = {}
        self._lost: set[str] = set()
        self._lock = allocate_lock()
        # One lock per lease serialises each read-of-our-bytes + swap: without it the heartbeat
        # thread and a worker refreshing (or releasing) at the same moment would each swap from
        # the same old bytes, and the loser would wrongly conclude the lease was taken over.
        # Per lease, not one for all: 32 workers confirming and releasing their own leases
        # through one lock queued behind each other's file I/O (a third of a cold fan-in run).
        self._swap_locks: dict[str, RLock] = {}
        # Output path -> (the bytes of someone else's live-looking lease, when this driver first
        # saw exactly those bytes, by time.monotonic()): see `_unchanged_too_long`.
        self._seen: dict[str, tuple[bytes, float]] = {}
        self._stop: threading.Event | None = None  # made with the heartbeat thread
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- public ---------------------------------------------------------------
    def read(self, output_path: str) -> LeaseRecord | None:
        return read_lease(self.store, output_path)

    def is_stale(self, record: LeaseRecord | None, now: float | None = None) -> bool:
        return lease_is_stale(record, self.config.timeout, now)

    def try_acquire(self, output_path: str, expect_absent: bool = False) -> AcquireResult:
        """Take the lease if nobody holds it (absent, or stale).

        `expect_absent`: the caller just saw no lease (a cold step), so first try to create
        it without reading it (the create is exclusive either way; one read fewer).
        """
        path = lease_path(output_path)
        attempts = 6 if expect_absent else 5  # retries when another driver changes the file meanwhile
        for attempt in range(attempts):
            current = None if expect_absent and attempt == 0 else self.store.read_bytes(path)
            record = LeaseRecord.parse(current)
            now, sampled = time.time(), time.monotonic()
            unchanged = False
            if current is not None and not self.is_stale(record, now):
                unchanged = self._unchanged_too_long(output_path, current, sampled)
                if not unchanged:
                    return AcquireResult(acquired=False, holder=record)
            mine = self._record(now)
            if self.store.compare_and_swap(path, current, mine):
                with self._lock:
                    self._held[output_path] = mine
                    self._written[output_path] = sampled
                    self._lost.discard(output_path)
                    self._seen.pop(output_path, None)
                self._keep(output_path, mine)
                if unchanged:
                    logger.warning(
                        "took over the lease on %s from %s: unchanged for more than %.0fs by this "
                        "machine's clock, although its heartbeat is dated %s (a clock ahead, or a lease "
                        "edited by hand)",
                        output_path,
                        record.worker,
                        self.config.timeout,
                        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.heartbeat)),
                    )
                elif record is not None:
                    logger.warning(
                        "took over the stale lease on %s from %s (last heartbeat %.0fs ago)",
                        output_path,
                        record.worker,
                        now - record.heartbeat,
                    )
                return AcquireResult(acquired=True, holder=record)
        return AcquireResult(acquired=False, holder=self.read(output_path))

    def _unchanged_too_long(self, output_path: str, current: bytes, now: float) -> bool:
        """Whether someone else's lease has held exactly these bytes for more than `timeout`
        seconds of this driver's own clock. A live holder rewrites its lease (a new timestamp)
        every `heartbeat_interval`: one that has not for `timeout` seconds is dead or paused past
        the timeout, whatever time the lease says -- a lease dated in the future (a clock ahead,
        a hand edit) looked live for up to `MAX_CLOCK_AHEAD_S`, a day, and blocked its step."""
        with self._lock:
            seen = self._seen.get(output_path)
            if seen is None or seen[0] != current:
                self._seen[output_path] = (current, now)
                return False
            return now - seen[1] > self.config.timeout

    def refresh(self, output_path: str) -> bool:
        """Renew our lease now; False (and the lease is lost) if someone took it."""
        with self._swap_lock(output_path):
            with self._lock:
                previous = self._held.get(output_path)
            if previous is None:
                return False
            sampled = time.monotonic()
            if self.keeper_prefix is not None:
                mine = self._ask_keeper("refresh", output_path)
            else:
                mine = self._record(time.time())
                if not self.store.compare_and_swap(lease_path(output_path), previous, mine):
                    mine = None
            if mine is not None:
                with self._lock:
                    self._held[output_path] = mine
                    self._written[output_path] = sampled
                return True
            self._mark_lost(output_path)
            return False

    def confirm(self, output_path: str) -> bool:
        """True if the lease is still ours, checked just before a step's final status is written.

        Nothing to read while our last write is younger than `heartbeat_interval`; an older
        lease is refreshed from our exact bytes (see the module docstring). False (and the
        lease is lost) if that swap fails.
        """
        with self._swap_lock(output_path):  # no heartbeat swap between reading `mine` and the file
            with self._lock:
                mine = self._held.get(output_path)
                written = self._written.get(output_path, -math.inf)
            if mine is None:
                return False
            if self._young(written):
                return True
            return self.refresh(output_path)

    def hand_over(self, output_path: str) -> bytes | None:
        """Stop heartbeating our lease on `output_path` and return its exact bytes, for the
        process that will run the step to take over (`executor.backends.host`). None if we
        do not hold it (any more)."""
        with self._swap_lock(output_path):
            with self._lock:
                self._written.pop(output_path, None)
                mine = self._held.pop(output_path, None)
            if mine is None or self.keeper_prefix is None:
                return mine
            return self._ask_keeper("hand_over", output_path)  # its bytes are the current ones

    def reclaim(self, output_path: str) -> bool:
        """Take the lease back from a step host of ours that is gone (its process or node was
        lost), or take it if there is none. False if another driver holds it."""
        path = lease_path(output_path)
        current = self.store.read_bytes(path)
        record = LeaseRecord.parse(current)
        if record is not None and not (
            record.worker == self.worker_id or record.worker.startswith(self.worker_id + "/")
        ):
            return False
        now, sampled = time.time(), time.monotonic()
        mine = self._record(now)
        if not self.store.compare_and_swap(path, current, mine):
            return False
        with self._lock:
            self._held[output_path] = mine
            self._written[output_path] = sampled
            self._lost.discard(output_path)
        self._keep(output_path, mine)
        return True

    def holds(self, output_path: str) -> bool:
        with self._lock:
            return output_path in self._held

    def was_lost(self, output_path: str) -> bool:
        with self._lock:
            return output_path in self._lost

    def release(self, output_path: str) -> None:
        with self._swap_lock(output_path):
            with self._lock:
                mine = self._held.pop(output_path, None)
                written = self._written.pop(output_path, -math.inf)
            if mine is None:
                return
            path = lease_path(output_path)
            if self._young(written):
                if self.keeper_prefix is not None:
                    self._tell_keeper("drop", path)  # before the delete: see executor.lease_keeper
                # Nobody else can hold it (module docstring), but the keeper may be swapping
                # in a fresh heartbeat right now; its swap must not bring the file back.
                self.store.delete_between_swaps(path)
                return
            if self.keeper_prefix is not None:
                released = self._ask_keeper("release", output_path) is not None
            else:
                released = self.store.compare_and_swap(path, mine, None)
            if not released:
                logger.warning("lease on %s was no longer ours at release", output_path)

    def start(self) -> None:
        """Start the keeper process now, if it is not running yet (so that it is up before the
        first lease is taken; it is up in under 0.1 s -- 68-88 ms measured on this project's
        2-core machine -- and is shared by every run in this process)."""
        if self.keeper_prefix is not None:
            self._keeper_client()

    def wait_ready(self) -> None:
        """Wait until the keeper process `start` began is up, so that the first step does not
        wait for it inside its worker thread (where the wait made the runner start a thread
        for each step queued behind it: a ~80 ms start-up is 16 times its 5 ms delay). A
        keeper that failed to start is replaced, or given up for a thread, at the first lease
        (`_tell_keeper`), as before."""
        if self.keeper_prefix is None:
            return
        from executor.lease_keeper import KeeperGone

        try:
            self._keeper_client().wait_ready()
        except KeeperGone as error:
            logger.debug("the lease keeper did not start: %s", error)

    def close(self) -> None:
        """Stop heartbeating. Leases still held (a failed or interrupted run) are left to go
        stale, as if this driver had died."""
        with self._lock:
            self._closed = True
            stop = self._stop
        if stop is not None:
            stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.config.heartbeat_interval + 5)
        if self.keeper_prefix is not None:
            with self._lock:
                held = list(self._held)
            for output_path in held:
                self._tell_keeper("forget", lease_path(output_path))

    # -- internals ------------------------------------------------------------
    def _keep(self, output_path: str, mine: bytes) -> None:
        """Start heartbeating a lease just written: in our thread, or in the keeper."""
        if self.keeper_prefix is None or not self._tell_keeper("hold", lease_path(output_path), mine):
            self._ensure_thread()  # (no keeper: its failure is logged) heartbeats from our thread

    def _keeper_client(self):
        return _keeper_module().shared_keeper(self.keeper_prefix)

    def _tell_keeper(self, op: str, path: str, data: bytes | None = None) -> bool:
        keepers = _keeper_module()
        interval = self.config.heartbeat_interval if op == "hold" else None
        try:
            try:
                keepers.shared_keeper(self.keeper_prefix).send(op, path, data, interval, self.worker_id)
            except keepers.KeeperGone:  # it died since it was last seen running: start another, once
                keepers.shared_keeper(self.keeper_prefix).send(op, path, data, interval, self.worker_id)
            return True
        except keepers.KeeperGone as error:
            logger.error("could not reach the lease keeper: %s", error)
            return False

    def _ask_keeper(self, op: str, output_path: str) -> bytes | None:
        """The keeper's answer to `op` on our lease: its current bytes, or None (not ours)."""
        from executor.lease_keeper import KeeperGone

        try:
            ok, data = self._keeper_client().ask(op, lease_path(output_path), self.worker_id)
        except KeeperGone as error:
            logger.error("the lease keeper is gone: %s; treating the lease on %s as lost", error, output_path)
            return None
        return (data or b"") if ok else None

    def _young(self, written: float) -> bool:
        """Our last write (monotonic time) is too recent for anyone to have taken the lease over."""
        return time.monotonic() - written < self.config.heartbeat_interval

    def _swap_lock(self, output_path: str) -> RLock:
        """The lease's own swap lock (kept for the manager's life: a lock handed out must stay the one)."""
        with self._lock:
            lock = self._swap_locks.get(output_path)
            if lock is None:
                lock = self._swap_locks[output_path] = RLock()
            return lock

    def _record(self, now: float) -> bytes:
        return LeaseRecord(worker=self.worker_id, heartbeat=now).to_bytes()

    def _mark_lost(self, output_path: str) -> None:
        with self._lock:
            if self._held.pop(output_path, None) is None:
                return
            self._lost.add(output_path)
        if self.keeper_prefix is not None:  # (the keeper forgets it by itself too, after a failed refresh)
            self._tell_keeper("forget", lease_path(output_path))
        logger.error("lost the lease on %s: another driver took it over", output_path)
        self.on_lost(output_path)

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None:
                import threading

                self._stop = threading.Event()
                if self._closed:  # (closed first: the thread ends at once, as it did before)
                    self._stop.set()
                self._thread = threading.Thread(
                    target=self._heartbeat_loop, name="lease-heartbeat", daemon=True
                )
                self._thread.start()

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.config.heartbeat_interval):
            with self._lock:
                paths = list(self._held)
            for output_path in paths:
                try:
                    self.refresh(output_path)
                except Exception:  # storage hiccup: keep trying until the lease times out
                    logger.exception("heartbeat for %s failed", output_path)
