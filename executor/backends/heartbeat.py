"""A step's lease heartbeat, in a process of its own.

    python -m executor.backends.heartbeat SPEC_JSON

Started by the process that runs a heavy step (`executor.backends.host`), so the heartbeat
never shares a GIL with the step's compute: a step that holds the GIL longer than the lease
timeout can no longer starve its own heartbeat and let a second driver take the step over.

Every `interval` seconds it swaps the lease file from the exact bytes it wrote last to new
bytes with a fresh heartbeat (`Store.compare_and_swap`). If the swap fails, someone else
took the lease over: it kills the step's process at once (SIGKILL), so the step cannot
write into an output another driver now owns, and exits 3. It dies with the step's process
(parent-death signal on Linux), and exits 0 on SIGTERM, which is how the step's process
stops it before writing the final status.

SPEC_JSON: {"prefix", "lease_path", "bytes" (the lease as written, latin-1), "interval",
"kill_pid", "parent_pid" (optional: the process that started it)}.

The parent-death signal is armed only once this process runs, and only for the thread that
started it: a step's process that died within those first milliseconds (a step that crashes
at once) would have left its heartbeat running for ever, keeping the lease fresh so that no
driver could ever take the step again. So it also exits as soon as `parent_pid` is no longer
its parent, checked on start and every 0.1 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time

LOST_EXIT_CODE = 3


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def main(spec_json: str) -> int:
    _die_with_parent()
    spec = json.loads(spec_json)
    from executor.lease_keeper import with_fresh_heartbeat
    from executor.store import open_store

    store = open_store(spec["prefix"])
    path = spec["lease_path"]
    previous = spec["bytes"].encode("latin-1")
    interval = float(spec["interval"])
    kill_pid = int(spec["kill_pid"])
    parent = spec.get("parent_pid")
    orphaned = (lambda: False) if parent is None else (lambda: os.getppid() != int(parent))
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    while not stop and not orphaned():
        deadline = time.time() + interval
        while not stop and time.time() < deadline and not orphaned():
            time.sleep(min(0.1, interval))
        if stop or orphaned():
            break
        new = with_fresh_heartbeat(previous)
        try:
            swapped = store.compare_and_swap(path, previous, new)
        except OSError as error:  # storage hiccup: try again next time, until the lease times out
            print(f"heartbeat for {path} failed: {error}", file=sys.stderr, flush=True)
            continue
        if not swapped:
            print(
                f"lost the lease {path}: another driver took the step over; stopping it",
                file=sys.stderr,
                flush=True,
            )
            with contextlib.suppress(OSError):
                os.kill(kill_pid, signal.SIGKILL)
            return LOST_EXIT_CODE
        previous = new
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
