"""The lease keeper: a driver's lease heartbeats, in a process of its own.

Started by `shared_keeper()`: one per driver process, kept for the process's life and
shared by every run in it, one per kind of storage (local disk, S3, GCS: see
`executor.executor.KEEPER_PROTOCOLS`). It opens the storage from the environment it inherits
(`AWS_*`, `STORAGE_EMULATOR_HOST`, ...); if it cannot, it exits before saying it is ready,
and the driver keeps its heartbeats in a thread.

Light steps run in the driver's threads. If their leases were refreshed by a thread of the
driver too, a step that holds Python's GIL longer than the lease timeout would starve its
own heartbeat, another driver would take the step over, and the step would run twice. So
the driver (`executor.lease.LeaseManager`, given a `keeper_prefix`) hands every lease it
takes to this process, which shares no GIL with the steps.

The driver talks to it over a pipe, one JSON object per line on its stdin:

- `{"op": "hold", "path", "bytes", "interval"}`: keep this lease alive, refreshing it every
  `interval` seconds; `bytes` is the lease exactly as the driver created it (latin-1). No
  answer.
- `{"op": "drop", "path", "worker"}`: forget it; the driver deletes the file itself (it does
  so only while the lease is younger than the heartbeat interval, before the keeper's first
  refresh of it). No answer.
- `{"op": "forget", "path", "worker"}`: the driver's run ended still holding it (a failed or
  interrupted run): stop refreshing it and leave the file to go stale, as it would if the
  driver had died. No answer.
- `{"op": "refresh" | "release" | "hand_over", "path", "worker"}`: answered with one line on stdout,
  `{"ok": bool, "bytes": str | null}`. `refresh`: swap the lease to a fresh heartbeat now
  (the driver confirms a step that outlived a heartbeat interval); `release`: delete it if
  it still holds our bytes; `hand_over`: stop keeping it and give its current bytes (a heavy
  step's own process takes it over from there).

Messages other than `hold` name the worker (the run) that sends them; several runs in one
driver process share its keeper, and a message about a lease that another of them holds
now is stale and ignored (a request is answered not-ok).

Every `interval` seconds after it was last written, the keeper swaps each lease it holds
from the exact bytes it wrote last to bytes with a fresh heartbeat. If a swap fails, it first
reads everything the driver sent meanwhile (a `drop` of that lease ends the matter), then
the lease file: gone means deleted, not taken (forgotten); our worker still in it means ours.
Only a lease file naming another worker is a takeover: the keeper then kills the driver at
once (SIGKILL) -- the step runs in the driver, so this is the only way to stop it before it
writes into an output another driver now owns -- and exits 3.

A driver paused past the lease timeout (its process group stopped, the machine suspended)
resumes together with its keeper. The keeper notices the gap in its own clock, checks every
lease it holds at once, and kills the driver if one was taken over. The driver may run for
the few milliseconds that takes; that window is what is left of the problem.

The keeper exits when the driver closes the pipe -- the kernel does that when the driver
dies, however it dies. The leases it held then go stale and are taken over after the
timeout, as they would be if the driver had died. It is up in under 0.1 s (68-88 ms here):
it imports `executor.store` and the standard library, not the executor package (nor, for a
local tree, the site packages).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

LOST_EXIT_CODE = 3


ALIVE_CHECK_S = 1.0
"""`shared_keeper` asks the operating system whether its keeper still runs (a `waitpid`) at
most this often; in between, a keeper that died is found by the broken pipe of the next
message. (Asking before every message cost a cold step two system calls.)"""


BATCH_S = 0.01
"""After handling the driver's messages, the keeper sleeps this long before it reads again,
so that the messages of the next steps arrive in one read instead of waking it once each.
A request (refresh, release, hand_over) waits at most this long for its answer."""


class KeeperGone(RuntimeError):
    """The keeper process is not there any more (it died, or was never started)."""


class LeaseKeeper:
    """The driver's end: starts the keeper process and talks to it."""

    def __init__(self, prefix: str, kill_pid: int | None = None):
        """`kill_pid`: the process to stop when a lease is taken over (default: this one)."""
        package = os.path.dirname(os.path.abspath(__file__))
        # The executor package's __init__ imports all of it (~0.1 s); the keeper needs only
        # executor.store, so it registers the package without running its __init__.
        bootstrap = (
            "import sys, types; package = types.ModuleType('executor'); "
            f"package.__path__ = [{package!r}]; sys.modules['executor'] = package; "
            "from executor.lease_keeper import main; sys.exit(main(sys.argv[1]))"
        )
        spec = json.dumps({"prefix": prefix, "kill_pid": os.getpid() if kill_pid is None else kill_pid})
        local = "://" not in prefix or prefix.startswith("file://")
        self._process = subprocess.Popen(
            [sys.executable, *(["-S"] if local else []), "-c", bootstrap, spec],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        self._lock = threading.Lock()  # one request (and its answer) at a time
        self._ready = False
        self._gone = False  # a write or read found the process gone
        self._seen_alive = 0.0  # monotonic time `alive()` last found it running

    def send(
        self,
        op: str,
        path: str,
        data: bytes | None = None,
        interval: float | None = None,
        worker: str | None = None,
    ) -> None:
        """A message that needs no answer (hold, drop, forget). `worker`: who sends it (the
        keeper ignores a message about a lease another worker holds now)."""
        line = _message_line(op, path, worker, data, interval)
        with self._lock:
            self._await_ready()
            self._write_line(line)

    def ask(self, op: str, path: str, worker: str | None = None) -> tuple[bool, bytes | None]:
        """A request and its answer: (ok, the lease's bytes as the keeper last wrote them)."""
        with self._lock:
            self._await_ready()
            self._write({"op": op, "path": path, "worker": worker})
            line = self._process.stdout.readline()
        if not line:
            self._gone = True
            raise KeeperGone(f"the lease keeper (pid {self._process.pid}) exited: {self._process.poll()}")
        answer = json.loads(line)
        data = answer.get("bytes")
        return bool(answer.get("ok")), None if data is None else data.encode("latin-1")

    def alive(self) -> bool:
        if self._gone or self._process.poll() is not None:
            return False
        self._seen_alive = time.monotonic()
        return True

    def usable(self) -> bool:
        """Fit to take the next message: not found gone by a write or read, and seen running
        within the last ALIVE_CHECK_S. A keeper that dies between two checks is found by the
        next write (a broken pipe), and the caller asks `shared_keeper` again."""
        if self._gone:
            return False
        return time.monotonic() - self._seen_alive < ALIVE_CHECK_S or self.alive()

    @property
    def pid(self) -> int:
        return self._process.pid

    def wait(self, timeout: float | None = None) -> int:
        return self._process.wait(timeout)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._process.stdin.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        with contextlib.suppress(OSError):
            self._process.stdout.close()

    def wait_ready(self) -> None:
        """Block until the keeper is up (KeeperGone if it failed to start)."""
        with self._lock:
            self._await_ready()

    def _await_ready(self) -> None:
        """The first message waits for the keeper to say it is up (it has opened its store): a
        lease is never handed to a keeper that cannot keep it."""
        if self._ready:
            return
        line = self._process.stdout.readline()
        if line != b"ready\n":
            self._process.wait()
            self._gone = True  # (not usable: the caller's one retry gets a new keeper)
            raise KeeperGone(f"the lease keeper did not start (exit code {self._process.returncode})")
        self._ready = True

    def _write(self, message: dict) -> None:
        self._write_line(json.dumps(message).encode() + b"\n")

    def _write_line(self, line: bytes) -> None:
        try:
            self._process.stdin.write(line)
        except (BrokenPipeError, ValueError) as error:  # (ValueError: the pipe was closed)
            self._gone = True
            raise KeeperGone(f"the lease keeper (pid {self._process.pid}) is gone: {error}") from None


_quote = json.encoder.encode_basestring_ascii  # (C: a JSON string literal, ASCII only)


def _message_line(
    op: str, path: str, worker: str | None, data: bytes | None, interval: float | None
) -> bytes:
    """The line `json.dumps({"op", "path", "worker"[, "bytes"][, "interval"]})` writes, built
    with one C call a string: two such messages go out for every step a run takes (`hold`,
    `drop`), and a dict through `json.dumps` cost each ~3x as much."""
    text = f'{{"op": {_quote(op)}, "path": {_quote(path)}, "worker": {"null" if worker is None else _quote(worker)}'
    if data is not None:
        text += f', "bytes": {_quote(data.decode("latin-1"))}'
    if interval is not None:
        text += f', "interval": {float(interval)!r}'  # (finite: LeaseConfig checks it)
    return (text + "}\n").encode()


_KEEPERS: dict[str, LeaseKeeper] = {}
_KEEPERS_LOCK = threading.Lock()


def shared_keeper(prefix: str) -> LeaseKeeper:
    """This process's keeper for the kind of storage `prefix` is on (started on first use,
    and again if it died). Any prefix of that storage will do: leases are named by full path."""
    kind = prefix.split("://", 1)[0] if "://" in prefix else "file"
    with _KEEPERS_LOCK:
        keeper = _KEEPERS.get(kind)
        if keeper is None or not keeper.usable():
            keeper = _KEEPERS[kind] = LeaseKeeper(prefix)
        return keeper


# -- the keeper process ------------------------------------------------------------------------


def with_fresh_heartbeat(previous: bytes) -> bytes:
    """The lease `previous`, its heartbeat set to now: what every refresh writes.

    The bytes `executor.tree.LeaseRecord.to_bytes` makes (key-sorted JSON), built without
    importing `executor.tree`, which this process does not load.
    """
    try:
        record = json.loads(previous)
    except (ValueError, RecursionError):
        record = {}
    if not isinstance(record, dict):
        record = {}
    # Marin's form ({timestamp, worker_id}); a lease written before it took that form keeps its own.
    record["heartbeat" if "heartbeat" in record and "timestamp" not in record else "timestamp"] = time.time()
    return json.dumps(record, sort_keys=True).encode("utf-8")


STATUS_TAIL_BYTES = 1 << 16
"""How much of a status file's end the keeper reads for its last line (the tree is not
trusted to keep it small)."""


def _worker(data: bytes, key: str = "worker") -> str | None:
    """The worker id in a status line (`worker`) or, with key="worker_id", in a lease."""
    try:
        return json.loads(data).get(key)
    except (ValueError, AttributeError, RecursionError):
        return None


def _lease_worker(data: bytes) -> str | None:
    """The holder of a lease: `worker_id` (Marin's form), or `worker` in one written before it."""
    return _worker(data, "worker_id") or _worker(data)


class _Keeper:
    def __init__(self, store, kill_pid: int):
        self.store = store
        self.kill_pid = kill_pid
        self.held: dict[str, bytes] = {}  # lease path -> the bytes we wrote last
        self.interval: dict[str, float] = {}  # lease path -> its heartbeat interval
        self.due: dict[str, float] = {}  # lease path -> when to refresh it (monotonic)
        self.refreshed: set[str] = set()  # leases we rewrote since the driver gave them to us
        self.pending = b""
        self.handled = 0  # messages handled so far

    # messages
    def read_messages(self, block_for: float | None) -> bool:
        """Handle everything the driver has sent (waiting up to `block_for` s for the first
        bytes, None: until it writes); False once the driver closed the pipe.

        Reads until the pipe is empty, not just once: a keeper that fell behind (a loaded
        machine) may have many messages queued, and a `drop` among them must be seen before
        a failed refresh is taken for a takeover.
        """
        timeout = None if block_for is None else max(0.0, block_for)
        while True:
            ready, _, _ = select.select([0], [], [], timeout)
            if not ready:
                return True
            data = os.read(0, 1 << 16)
            if not data:
                return False
            self.pending += data
            *lines, self.pending = self.pending.split(b"\n")
            for line in lines:
                if line.strip():
                    self.handle(json.loads(line))
                    self.handled += 1
            timeout = 0.0

    def drain(self) -> bool:
        return self.read_messages(0.0)

    def handle(self, message: dict) -> None:
        op, path = message["op"], message["path"]
        if op != "hold" and path in self.held and _lease_worker(self.held[path]) != message.get("worker"):
            # Another run in the driver's process holds this lease now (it took it over from
            # the sender): the sender's messages about it are stale.
            if op in ("refresh", "release", "hand_over"):
                self.answer(False, None)
            return
        if op == "hold":
            self.forget(path)
            self.held[path] = message["bytes"].encode("latin-1")
            self.interval[path] = float(message["interval"])
            self.due[path] = time.monotonic() + self.interval[path]
        elif op == "drop":
            rewritten = path in self.refreshed
            mine = self.forget(path)
            if mine is not None and rewritten:
                # We refreshed it just as the driver deleted it (our swap recreated the file):
                # delete what we wrote.
                with contextlib.suppress(OSError):
                    self.store.compare_and_swap(path, mine, None)
        elif op == "forget":  # the driver's run ended holding it: stop, as its thread would
            self.forget(path)
        elif op == "refresh":
            ok = path in self.held and self.refresh(path)
            if not ok:  # someone else holds it: the driver counts it lost; stop keeping it
                self.forget(path)
            self.answer(ok, self.held.get(path))
        elif op == "release":
            mine = self.forget(path)
            self.answer(mine is not None and self.store.compare_and_swap(path, mine, None), None)
        elif op == "hand_over":
            mine = self.forget(path)
            self.answer(mine is not None, mine)

    def forget(self, path: str) -> bytes | None:
        """Stop keeping the lease; the bytes we wrote last, or None if we did not keep it."""
        self.due.pop(path, None)
        self.interval.pop(path, None)
        self.refreshed.discard(path)
        return self.held.pop(path, None)

    def answer(self, ok: bool, data: bytes | None) -> None:
        line = json.dumps({"ok": ok, "bytes": None if data is None else data.decode("latin-1")})
        os.write(1, line.encode() + b"\n")

    # heartbeats
    def refresh(self, path: str) -> bool:
        """Swap the lease to a fresh heartbeat; False if someone else holds it now."""
        previous = self.held[path]
        new = with_fresh_heartbeat(previous)
        due = time.monotonic() + self.interval[path]
        if not self.store.compare_and_swap(path, previous, new):
            return False
        self.held[path] = new
        self.due[path] = due
        self.refreshed.add(path)
        return True

    def refresh_due(self, everything: bool = False) -> None:
        now = time.monotonic()
        for path in [p for p, due in self.due.items() if everything or due <= now]:
            if path not in self.held:
                continue  # dropped by a message handled meanwhile
            try:
                if self.refresh(path):
                    continue
            except OSError as error:  # storage hiccup: try again soon, until the lease times out
                print(f"lease keeper: heartbeat for {path} failed: {error}", file=sys.stderr, flush=True)
                self.due[path] = time.monotonic() + min(1.0, self.interval[path])
                continue
            if not self.drain():  # the driver may have dropped it (and deleted the file) just now
                sys.exit(0)  # the driver is gone: nothing to stop
            if path in self.held and self.taken_over(path):
                self.lost(path)

    def taken_over(self, path: str) -> bool:
        """After a failed swap, with every message read: is the lease someone else's now? Our
        driver announces every lease it deletes (`drop`, `forget`) before it does, so a lease
        file that is gone was removed by another driver if the step's status names another
        worker (it took the step over and finished it). One that still names our worker is
        ours (adopted)."""
        try:
            current = self.store.read_bytes(path)
        except OSError:
            return False  # cannot tell: try again at the next refresh
        if current is None:
            return self._finished_by_another(path)
        worker = _lease_worker(current)
        if worker is not None and worker == _lease_worker(self.held[path]):
            self.held[path] = current
            return False
        return True

    def _finished_by_another(self, path: str) -> bool:
        """The lease file is gone: taken over only if the step's status shows another worker
        (which took it over and finished it). A tree removed with its status (a test cleaning
        up, `rm -r`) is no takeover: the lease is forgotten."""
        status = path[: -len(".lock")] if path.endswith(".lock") else None
        try:
            data = self.store.read_tail(status, STATUS_TAIL_BYTES)[0] if status else None
        except OSError:
            return False
        last = (data or b"").rstrip(b"\n").rpartition(b"\n")[2]
        other = bool(last) and _worker(last) not in (None, _lease_worker(self.held[path]))
        if not other:
            self.forget(path)
        return other

    def lost(self, path: str) -> None:
        print(
            f"lease keeper: the lease {path} was taken over by another driver while this driver "
            "held it (was the driver paused?); stopping this driver so that the step cannot write "
            "into an output another driver owns now",
            file=sys.stderr,
            flush=True,
        )
        with contextlib.suppress(OSError):
            os.kill(self.kill_pid, signal.SIGKILL)
        sys.exit(LOST_EXIT_CODE)

    def run(self) -> int:
        last_mono, last_wall = time.monotonic(), time.time()
        while True:
            now = time.monotonic()
            # While it holds leases it wakes at least every 0.1 s (to notice a pause); idle, it
            # sleeps until the driver writes.
            waits = [due - now for due in self.due.values()]
            wait = min([0.1, *waits]) if waits else None
            handled = self.handled
            if not self.read_messages(wait):
                return 0
            if self.handled != handled:
                # Let the driver's next messages gather in the pipe rather than wake this
                # process for each (two a step: `hold`, `drop`).
                time.sleep(BATCH_S)
            mono, wall = time.monotonic(), time.time()
            # We did not run for a while (the process group was stopped, the machine slept):
            # every lease may have been taken over meanwhile, so check them all now.
            shortest = min(self.interval.values(), default=1.0)
            paused = self.held and max(mono - last_mono, wall - last_wall) > max(shortest, 1.0)
            last_mono, last_wall = mono, wall
            self.refresh_due(everything=bool(paused))


def main(spec_json: str) -> int:
    spec = json.loads(spec_json)
    from executor.store import open_store

    # Ctrl-C, a closing terminal (SIGHUP) and a job scheduler's SIGTERM reach the whole process
    # group: they are for the driver, which releases its leases through this process and then
    # closes the pipe. A keeper that died of them first left the driver unable to release the
    # leases it had refreshed, for the next run to wait out. The pipe's end is how it ends
    # (the kernel closes it however the driver dies); SIGKILL still works.
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    try:
        store = open_store(spec["prefix"])
    except Exception as error:  # the driver falls back to heartbeats from a thread
        print(f"lease keeper: cannot open {spec['prefix']}: {error}", file=sys.stderr, flush=True)
        return 2
    try:
        os.write(1, b"ready\n")
        return _Keeper(store, int(spec["kill_pid"])).run()
    except BrokenPipeError:  # the driver exited first (a run over in milliseconds): nothing to keep
        return 0
