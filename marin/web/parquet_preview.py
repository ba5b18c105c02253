"""Rows of a parquet file for the browser, read in a process of its own with bounded memory and time.

A parquet file is decoded by pyarrow's C++ reader, which holds a whole data page in memory
however few rows are asked for: a 98 KB file can declare a 1 GiB page (one value of a
million repeated characters per row, compressed), and reading it in the server would take
1 GiB per request. The browser cannot tell from the file's footer alone (page sizes are in
the page headers), and a crafted file could crash the reader outright. So each preview runs
`python -m marin.web.parquet_preview` with the memory it may allocate limited to
`MEMORY_LIMIT_BYTES` and its CPU time to `CPU_SECONDS`, and at most `CONCURRENT_PREVIEWS` run at
once. The child prints one JSON object: the columns, the row count and the rows asked for,
each cell as text cut at `CELL_CHARS` characters, at most `MAX_PAGE_BYTES` of it. A child that
runs out of memory or time is reported on the page ("stopped"), and the server goes on.

The child opens the file itself: a local path, or a URL through `executor.store.open_store`
with the environment it inherits (`AWS_*`, `STORAGE_EMULATOR_HOST`). A `memory://` tree lives
in the server's own process only, so its parquet files are not previewed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

MEMORY_LIMIT_BYTES = 512 << 20
"""Data a preview process may allocate (RLIMIT_DATA: heap and private mappings); the
interpreter and pyarrow take ~130 MB of it."""

CPU_SECONDS = 10
"""CPU time of a preview process (RLIMIT_CPU); the server also stops waiting after `WALL_SECONDS`."""

WALL_SECONDS = 15.0
"""How long the server waits for a preview's answer before it kills the process."""

CONCURRENT_PREVIEWS = 2
"""Preview processes at once; more requests wait for one (so at most this many times
`MEMORY_LIMIT_BYTES` goes to previews)."""

CELL_CHARS = 1000
"""A cell's text is cut here (the page shows less still)."""

MAX_PAGE_BYTES = 8 << 20
"""Rows stop once their cells hold this many characters (the page then links on)."""

MAX_ANSWER_BYTES = MAX_PAGE_BYTES + (1 << 20)
"""The most of a child's output the server reads."""

_slots = threading.BoundedSemaphore(CONCURRENT_PREVIEWS)


@dataclass(frozen=True)
class Rows:
    """What a preview read: a slice of rows, or why there is none."""

    columns: list[str] = field(default_factory=list)
    rows: list[list[str | None]] = field(default_factory=list)
    total: int = 0
    """Rows in the whole file."""

    more: bool = False
    """The page stopped before `limit` rows (MAX_PAGE_BYTES): more follow at offset + len(rows)."""

    error: str | None = None
    """Not a readable parquet file: why."""

    stopped: str | None = None
    """The preview ran out of memory or time: what happened."""


def read_rows(source: str, offset: int, limit: int) -> Rows:
    """Rows `offset`..`offset + limit` of the parquet file at `source` (a local path or URL)."""
    limits = [str(MEMORY_LIMIT_BYTES), str(CPU_SECONDS)]
    # -P: the working directory (perhaps inside the tree browsed) is not put on sys.path, so
    # no file of the tree can be imported as a module by the preview.
    command = [
        sys.executable,
        "-P",
        "-m",
        "marin.web.parquet_preview",
        source,
        str(offset),
        str(limit),
        *limits,
    ]
    with _slots:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            # malloc, not mimalloc: mimalloc reserves ~1 GB of address space up front, which
            # would leave no room under the data limit for the rows themselves.
            env={**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "system"},
        )
        try:
            timer = threading.Timer(WALL_SECONDS, process.kill)
            timer.start()
            try:
                answer = process.stdout.read(MAX_ANSWER_BYTES + 1)
                process.kill()  # it has answered, or it said too much
                process.wait()
            finally:
                timer.cancel()
        finally:
            process.stdout.close()
    try:
        record = json.loads(answer) if len(answer) <= MAX_ANSWER_BYTES else None
    except ValueError:
        record = None
    if not isinstance(record, dict):
        return Rows(
            stopped=f"the preview of this parquet file stopped without an answer (more than "
            f"{MEMORY_LIMIT_BYTES >> 20} MiB of memory, {CPU_SECONDS} s of CPU or {WALL_SECONDS:.0f} s "
            "in all, or a crash); download it with raw instead"
        )
    return Rows(
        columns=[str(name) for name in record.get("columns") or []],
        rows=[[None if cell is None else str(cell) for cell in row] for row in record.get("rows") or []],
        total=int(record.get("total") or 0),
        more=bool(record.get("more")),
        error=record.get("error") if isinstance(record.get("error"), str) else None,
        stopped=record.get("stopped") if isinstance(record.get("stopped"), str) else None,
    )


def _cell(value: Any) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS] + "\u2026"


def _open(source: str) -> Any:
    if "://" not in source:
        return open(source, "rb")
    from executor.store import open_store

    store = open_store(source)
    return store.fs.open(store.fs_path(source), "rb")


def _read(source: str, offset: int, limit: int) -> dict[str, Any]:
    import pyarrow.parquet as pq

    with _open(source) as handle:
        try:
            parquet = pq.ParquetFile(handle)
        except Exception as error:  # pyarrow raises its own error types for bad files
            return {"error": f"not a readable parquet file: {error}"}
        total = parquet.metadata.num_rows
        columns = [str(name) for name in parquet.schema_arrow.names]
        groups, skip, seen = [], 0, 0
        for index in range(parquet.num_row_groups):
            count = parquet.metadata.row_group(index).num_rows
            if seen + count > offset and seen < offset + limit:
                if not groups:
                    skip = offset - seen
                groups.append(index)
            seen += count
        rows: list[list[str | None]] = []
        kept, more = 0, False
        # Small batches: a batch is converted to Python objects whole.
        batches = parquet.iter_batches(batch_size=16, row_groups=groups, use_threads=False) if groups else ()
        for batch in batches:
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            for record in batch.slice(skip).to_pylist():
                row = [_cell(record.get(column)) for column in columns]
                rows.append(row)
                kept += sum(len(cell) for cell in row if cell is not None)
                if len(rows) == limit or kept >= MAX_PAGE_BYTES:
                    break
            skip = 0
            if len(rows) == limit or kept >= MAX_PAGE_BYTES:
                more = len(rows) < limit
                break
    return {"columns": columns, "rows": rows, "total": total, "more": more}


def main(argv: list[str]) -> int:
    import resource

    source, offset, limit, memory, cpu = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4])
    resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    try:
        answer = _read(source, offset, limit)
    except MemoryError:
        answer = {
            "stopped": f"reading these rows needs more than {memory >> 20} MiB of memory "
            "(a parquet page is decoded whole); download the file with raw instead"
        }
    except Exception as error:  # pyarrow's and the store's errors: the file's, not the browser's
        # Out of memory, pyarrow does not always say so (e.g. "SystemError: error return
        # without exception set"): the limits are named too.
        answer = {
            "error": f"cannot read this parquet file within {memory >> 20} MiB of memory and {cpu} s "
            f"of CPU: {type(error).__name__}: {error}"
        }
    sys.stdout.write(json.dumps(answer, ensure_ascii=False))
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: pyarrow's thread pools can take a while to stop


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
