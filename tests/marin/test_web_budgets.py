"""Per-request budgets of the browser's pages that read many files or many metrics.

Found by a red-team pass: `/compare/` read one shard per step of a chain (up to
`CHAIN_LIMIT`), each with a read budget of its own, so one request could use a dozen times
the documented limit; `/train/` drew one chart per distinct `eval/*` name of a crafted
metrics.jsonl (100,000 of them: a 63 MB page and 1.6 GB of server memory). A second pass
found what the budget did not count: the compare page's chain lookup (the manifests, read and
scanned once per step: 8 s of CPU for 40 MB of them) and source previews, a training page's
results.json (100 of 1 MB: a 164 MB page), the leaderboard's comparison of recorded configs
(8 s for ten runs of 100,000 fields) and predictions' labels (1 MB each, shown whole).

The trees are made by the executor (module-level step functions, so the tree records them
as importable), except those of the leaderboard and predictions (their steps are recognised
by function name, so they are written by hand), and read over real HTTP from a real server
on 127.0.0.1. The limits are
lowered, and time is a clock advanced by hand, so nothing depends on how fast the machine
is: the tests count bytes, pages and charts, never seconds.
"""

from __future__ import annotations

import glob
import hashlib
import http.client
import json
import os
import re
import threading
import tracemalloc
import types
from dataclasses import dataclass

import pytest

from executor import Executor, ExecutorStep, output_path_of, this_output_path, versioned
from marin import leaderboard, outputs
from marin.web import files, pages, start_server
from operations.scaling_laws import digest_of
from tests.marin.sample_tree import FAST_LEASES

SHARD = "shard-00000.jsonl"
CHAIN = 6
PADDING_LINES = 1000
PADDING_LINE = b"p" * 1023 + b"\n"
"""Each step's shard starts with PADDING_LINES lines of 1 KiB (not JSON: no document)."""
DOCUMENTS = 20


@dataclass(frozen=True)
class ShardConfig:
    index: int
    input_path: str | None
    output_path: str


def write_shard(config: ShardConfig) -> None:
    """~1 MiB of padding, then the same DOCUMENTS documents in every step (a filter that keeps all)."""
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, SHARD), "wb") as handle:
        handle.write(PADDING_LINE * PADDING_LINES)
        for number in range(DOCUMENTS):
            handle.write(json.dumps({"id": f"doc{number}", "text": f"document {number}"}).encode() + b"\n")


@dataclass(frozen=True)
class MetricsConfig:
    lines: list[str]
    output_path: str


def write_metrics(config: MetricsConfig) -> None:
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "metrics.jsonl"), "w") as handle:
        handle.write("".join(line + "\n" for line in config.lines))


def run_steps(prefix: str, steps: list[ExecutorStep]) -> None:
    Executor(prefix, lease_config=FAST_LEASES, console=False).run(steps)


def relpath_of(prefix: str, name: str) -> str:
    (path,) = glob.glob(os.path.join(prefix, name + "-*"))
    return os.path.relpath(path, prefix)


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> tuple[str, list[str]]:
    """CHAIN steps, each reading the one before and writing SHARD: (prefix, their relpaths)."""
    prefix = str(tmp_path_factory.mktemp("chain") / "prefix")
    steps: list[ExecutorStep] = []
    for index in range(CHAIN):
        steps.append(
            ExecutorStep(
                name=f"chain/s{index}",
                fn=write_shard,
                config=ShardConfig(
                    index=versioned(index),
                    input_path=output_path_of(steps[-1]) if steps else None,
                    output_path=this_output_path(),
                ),
            )
        )
    run_steps(prefix, steps)
    return prefix, [relpath_of(prefix, f"chain/s{index}") for index in range(CHAIN)]


def get(port: int, target: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", target)
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8")
    finally:
        connection.close()


@pytest.fixture
def count_lines_read(monkeypatch) -> list[int]:
    """Every byte of lines the readers get from a (decompressed) stream, counted: [total]."""
    counted = [0]
    lock = threading.Lock()
    decompressed = files.decompressed

    class Counting:
        def __init__(self, stream):
            self.stream = stream

        def readline(self, size: int = -1) -> bytes:
            line = self.stream.readline(size)
            with lock:
                counted[0] += len(line)
            return line

        def __getattr__(self, name: str):
            return getattr(self.stream, name)

    monkeypatch.setattr(files, "decompressed", lambda raw, kind: Counting(decompressed(raw, kind)))
    return counted


def compare_page(prefix: str, first: str) -> tuple[int, str]:
    server = start_server(prefix, port=0).start_in_thread()
    try:
        return get(server.port, f"/compare/{first}/{SHARD}?offset={PADDING_LINES}&limit={DOCUMENTS}")
    finally:
        server.shutdown()


def test_the_chain_is_what_the_tests_need(chain):
    """With the default limits every step's shard is read and every document found in each."""
    prefix, relpaths = chain
    status, body = compare_page(prefix, relpaths[0])
    assert status == 200, body
    for index in range(CHAIN):
        assert f"chain/s{index}" in body
    assert "none dropped" in body and "read-limit" not in body
    assert body.count('class="docid mono"') == DOCUMENTS


def test_one_read_budget_of_bytes_is_shared_by_every_step_of_a_compare_page(
    chain, monkeypatch, count_lines_read
):
    """Each shard (~1 MiB) fits the lowered limit (3 MiB) alone; the chain of 6 does not. The
    request reads at most the limit (plus the line that crosses it), and says which steps'
    files it did not (fully) read."""
    prefix, relpaths = chain
    monkeypatch.setattr(files, "MAX_READ_BYTES", 3 << 20)
    shard_bytes = os.path.getsize(os.path.join(prefix, relpaths[0], SHARD))
    assert shard_bytes < files.MAX_READ_BYTES < CHAIN * shard_bytes

    status, body = compare_page(prefix, relpaths[0])

    assert status == 200, body
    assert count_lines_read[0] <= files.MAX_READ_BYTES + len(PADDING_LINE)
    note = re.search(r'<div class="note read-limit">(.*?)</div>', body, re.S)
    assert note is not None, "the page does not say that files were left unread"
    listed = re.findall(r"<li>(.*?)</li>", note.group(1), re.S)
    # s0-s2 are read whole (3 x ~1 MiB); s3 is read in part; s4 and s5 not at all.
    assert len(listed) == 3, listed
    assert "chain/s3" in listed[0] and "read in part" in listed[0] and "stopped reading" in listed[0]
    assert "chain/s4" in listed[1] and "chain/s5" in listed[2]
    assert all("not read" in item and "budget was spent" in item for item in listed[1:])
    assert "at most 3 MiB" in note.group(1)
    # Every document of the first step is still shown; the unread steps are marked, not "dropped".
    assert body.count('class="docid mono"') == DOCUMENTS
    assert body.count("not read (read limit)") >= 2 * DOCUMENTS
    assert "dropped by" not in body


def tick_a_millisecond_per_reading(monkeypatch) -> None:
    """The readers' clock advances 1 ms each time they look at it: time budgets run out
    after a known number of readings, whatever the machine's load."""
    ticks = [0]
    lock = threading.Lock()

    def monotonic() -> float:
        with lock:
            ticks[0] += 1
            return ticks[0] / 1000

    monkeypatch.setattr(files, "time", types.SimpleNamespace(monotonic=monotonic))


def test_one_read_budget_of_time_is_shared_by_every_step_of_a_compare_page(chain, monkeypatch):
    """Time from a clock that advances 1 ms each time the readers look at it: one budget of
    5 s (the default) covers about 2,500 lines, fewer than the chain's 6 x 1,020."""
    prefix, relpaths = chain
    tick_a_millisecond_per_reading(monkeypatch)

    status, body = compare_page(prefix, relpaths[0])

    assert status == 200, body
    note = re.search(r'<div class="note read-limit">(.*?)</div>', body, re.S)
    assert note is not None, "the page does not say that files were left unread"
    assert f"after {files.MAX_READ_SECONDS:.1f} s" in note.group(1)
    assert "chain/s5" in note.group(1) and "chain/s0" not in note.group(1)


def test_a_compare_page_whose_first_file_spends_the_budget_is_refused(chain, monkeypatch):
    prefix, relpaths = chain
    monkeypatch.setattr(files, "MAX_READ_BYTES", 512 << 10)  # less than the padding before the page
    status, body = compare_page(prefix, relpaths[0])
    assert status == 413 and "stopped reading" in body and "raw" in body


# -- training pages -----------------------------------------------------------------------------
def training_tree(tmp_path, lines: list[str]) -> tuple[str, str]:
    prefix = str(tmp_path / "prefix")
    step = ExecutorStep(
        name="crafted/train",
        fn=write_metrics,
        config=MetricsConfig(lines=lines, output_path=this_output_path()),
    )
    run_steps(prefix, [step])
    return prefix, relpath_of(prefix, "crafted/train")


def training_page(prefix: str, relpath: str) -> tuple[int, str]:
    server = start_server(prefix, port=0).start_in_thread()
    try:
        return get(server.port, f"/train/{relpath}")
    finally:
        server.shutdown()


def crafted_metrics(names: int, per_line: int = 1000) -> list[str]:
    lines = []
    for line in range(names // per_line):
        record = {"step": line, "train/loss": 3.0 - line / 100}
        record.update({f"eval/k{line}_{key}": 1.0 for key in range(per_line)})
        lines.append(json.dumps(record))
    return lines


def test_a_training_page_draws_at_most_max_series_charts(tmp_path):
    """10,000 distinct eval/ names: MAX_SERIES charts (plus loss), a bounded page that says
    what it left out, and bounded memory while it is made."""
    prefix, relpath = training_tree(tmp_path, crafted_metrics(10_000))
    assert os.path.getsize(os.path.join(prefix, relpath, "metrics.jsonl")) < 1 << 20

    tracemalloc.start()
    try:
        status, body = training_page(prefix, relpath)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert status == 200, body[-2000:]
    assert body.count('<svg class="chart"') == pages.MAX_SERIES + 1  # + the loss chart
    assert body.count('class="series"') == pages.MAX_SERIES + 1
    left_out = re.search(r'<p class="muted note left-out">(.*?)</p>', body, re.S)
    assert left_out is not None
    assert f"{10_000 - pages.MAX_SERIES} more eval/ metrics are not drawn" in left_out.group(1)
    assert f"at most {pages.MAX_SERIES}" in left_out.group(1)
    assert len(body) < 2 << 20, len(body)
    assert peak < 64 << 20, peak
    # The metrics table: loss and the drawn eval/ metrics only.
    table = body.split('<table class="metrics">', 1)[1].split("</table>", 1)[0]
    assert table.count("<tr>") == pages.MAX_SERIES + 2  # + the header and train/loss


def test_left_out_metric_names_are_counted_in_bounded_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(pages, "MAX_LEFT_OUT_NAMES", 500)
    long_name = "eval/" + "n" * pages.MAX_METRIC_KEY_CHARS
    lines = crafted_metrics(3000) + [json.dumps({"step": 99, long_name: 1.0, "eval/loss": 2.5})]
    prefix, relpath = training_tree(tmp_path, lines)
    status, body = training_page(prefix, relpath)
    assert status == 200
    assert "at least 500 more eval/ metrics are not drawn" in body
    assert f"1 value(s) left out: their names are longer than {pages.MAX_METRIC_KEY_CHARS}" in body
    assert long_name not in body
    assert 'data-key="eval/loss"' in body  # the always-drawn metrics do not count against the cap


def test_a_long_series_is_thinned_while_read_and_keeps_its_last_point_and_minimum(tmp_path):
    steps = 4 * pages.MAX_SERIES_POINTS + 7
    lines = [json.dumps({"step": step, "train/loss": 10.0 - step / steps}) for step in range(steps)]
    lines[1234] = json.dumps({"step": 1234, "train/loss": 0.125})  # the minimum, on a step thinning drops
    lines.append(json.dumps({"step": steps - 1, "train/loss": 7.5}))  # a later line wins for the last step
    prefix, relpath = training_tree(tmp_path, lines)

    status, body = training_page(prefix, relpath)

    assert status == 200
    assert f"more than {pages.MAX_SERIES_POINTS} points were thinned" in body
    row = re.search(r"<tr><td>train/loss</td>(.*?)</tr>", body, re.S).group(1)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    assert cells[0:3] == ["7.5", "0.125", str(steps - 1)], cells
    kept = int(cells[3].split(" of ")[0])
    assert kept <= pages.MAX_SERIES_POINTS + 1 and f"of {steps + 1} (thinned)" in cells[3]
    series = pages._Series()
    for step in range(100 * pages.MAX_SERIES_POINTS):
        series.add(float(step), 1.0)
    assert len(series.values) <= pages.MAX_SERIES_POINTS


def test_a_short_series_is_kept_whole(tmp_path):
    lines = [json.dumps({"step": step, "train/loss": 5.0 - step, "eval/bpb": 1.0}) for step in range(50)]
    lines.append(json.dumps({"step": 10, "train/loss": -100.0}))  # rewritten after a restart
    lines.append(json.dumps({"step": 10, "train/loss": 0.5}))
    prefix, relpath = training_tree(tmp_path, lines)
    status, body = training_page(prefix, relpath)
    assert status == 200 and "thinned" not in body and "left-out" not in body
    row = re.search(r"<tr><td>train/loss</td>(.*?)</tr>", body, re.S).group(1)
    assert re.findall(r"<td[^>]*>(.*?)</td>", row) == ["-44", "-44", "49", "50"]


# -- the chain lookup and the source previews of a compare page --------------------------------
SOURCE_BYTES = 3000
"""Each source file of the sourced chain: under pages.RAW_SOURCE_BYTES, so it is shown whole."""


@dataclass(frozen=True)
class SourcesConfig:
    output_path: str


def write_sources(config: SourcesConfig) -> None:
    """Raw files named like the chain's documents (`doc<n>`): the compare page's source column."""
    os.makedirs(config.output_path, exist_ok=True)
    for number in range(DOCUMENTS):
        with open(os.path.join(config.output_path, f"doc{number}"), "w") as handle:
            handle.write(f"source {number} " + "s" * SOURCE_BYTES)


def make_chain(prefix: str, count: int, with_source: bool = False) -> list[str]:
    """`count` shard steps (as in the `chain` fixture), after a raw step if `with_source`:
    the relpaths of the shard steps."""
    steps: list[ExecutorStep] = []
    upstream = None
    if with_source:
        upstream = ExecutorStep(name="chain/raw", fn=write_sources, config=SourcesConfig(this_output_path()))
        steps.append(upstream)
    for index in range(count):
        upstream = ExecutorStep(
            name=f"chain/s{index}",
            fn=write_shard,
            config=ShardConfig(
                index=versioned(index),
                input_path=output_path_of(upstream) if upstream is not None else None,
                output_path=this_output_path(),
            ),
        )
        steps.append(upstream)
    run_steps(prefix, steps)
    return [relpath_of(prefix, f"chain/s{index}") for index in range(count)]


@pytest.fixture
def count_records_read(monkeypatch) -> list[int]:
    """Bytes of bookkeeping (steps' records, experiment manifests) the tree reads: [total]."""
    counted = [0]
    lock = threading.Lock()
    read_record = outputs.OutputTree.read_record

    def counting(self, path: str, limit: int = outputs.MAX_RECORD_BYTES) -> bytes | None:
        data = read_record(self, path, limit)
        with lock:
            counted[0] += len(data or b"")
        return data

    monkeypatch.setattr(outputs.OutputTree, "read_record", counting)
    return counted


def lookup_note(body: str) -> str | None:
    note = re.search(r'<div class="note lookup-limit">(.*?)</div>', body, re.S)
    return note.group(1) if note else None


def crafted_manifest(prefix: str, name: str, entries: list[dict], pad: int = 0) -> None:
    """An experiment manifest of `entries` (recorded under this tree's prefix), padded to `pad` bytes."""
    record = {"prefix": prefix, "created_date": "2026-01-01T00:00:00.000Z", "steps": entries}
    record["description"] = "d" * max(0, pad - len(json.dumps(record)))
    with open(os.path.join(prefix, "experiments", name), "w") as handle:
        json.dump(record, handle)


def test_the_chain_lookup_reads_at_most_its_share_of_bookkeeping(tmp_path, monkeypatch, count_records_read):
    """Five crafted manifests of 1 MiB (read before the real one: their names sort first),
    with the lookup's limit lowered to 2 MiB: the page reads two of them and says that the
    other four were not read and that the chain may go on; once it read every manifest (about
    5 MiB here, and 40 MB of them took 8 s of CPU: see docs/browser.md)."""
    prefix = str(tmp_path / "prefix")
    relpaths = make_chain(prefix, 2)
    for number in range(5):
        crafted_manifest(prefix, f"000-crafted-{number}.json", [], pad=1 << 20)
    monkeypatch.setattr(pages, "MAX_LOOKUP_BYTES", 2 << 20, raising=False)

    status, body = compare_page(prefix, relpaths[0])

    assert status == 200, body
    assert count_records_read[0] <= (2 << 20) + (1 << 20) + (64 << 10), count_records_read[0]
    note = lookup_note(body)
    assert note is not None, "the page does not say that the chain lookup stopped"
    assert "4 experiment manifests not read" in note and "at most 2 MiB" in note
    assert body.count('class="docid mono"') == DOCUMENTS  # the first step's documents are still shown


def test_the_chain_lookup_stops_after_half_the_requests_time(tmp_path, monkeypatch):
    """A manifest naming 3,000 readers of the first step that do not exist, whose paths sort
    before the real reader: looking at them one by one stops after half the request's time
    (a clock that advances 1 ms each time it is read), and the page says where the chain
    may go on; the shards still get the other half."""
    prefix = str(tmp_path / "prefix")
    relpaths = make_chain(prefix, 2)
    first = os.path.join(prefix, relpaths[0])
    entries = [
        {"name": f"crafted/u{n}", "output_path": f"{prefix}/aaa/u{n:05d}", "dependencies": [first]}
        for n in range(3000)
    ]
    crafted_manifest(prefix, "000-crafted.json", entries)
    tick_a_millisecond_per_reading(monkeypatch)

    status, body = compare_page(prefix, relpaths[0])

    assert status == 200, body
    note = lookup_note(body)
    assert note is not None, "the page does not say that the chain lookup stopped"
    assert f"{files.MAX_READ_SECONDS / 2:g} s" in note and "chain/s0" in note
    assert body.count('class="docid mono"') == DOCUMENTS


@pytest.fixture(scope="module")
def sourced_chain(tmp_path_factory) -> tuple[str, list[str]]:
    prefix = str(tmp_path_factory.mktemp("sourced") / "prefix")
    return prefix, make_chain(prefix, 3, with_source=True)


@pytest.fixture
def count_heads_read(monkeypatch) -> list[int]:
    """Files whose head (`files.read_head`) was read: [count]."""
    counted = [0]
    read_head = files.read_head

    def counting(*args, **kwargs):
        result = read_head(*args, **kwargs)
        counted[0] += 1
        return result

    monkeypatch.setattr(files, "read_head", counting)
    return counted


def test_the_source_column_of_a_sourced_chain(sourced_chain, count_heads_read):
    prefix, relpaths = sourced_chain
    status, body = compare_page(prefix, relpaths[0])
    assert status == 200, body
    assert "chain/raw (source file)" in body and "source 7 sss" in body
    assert count_heads_read[0] == DOCUMENTS and "read-limit" not in body


def test_source_previews_are_read_within_the_requests_budget(sourced_chain, monkeypatch, count_heads_read):
    """The shards spend the (lowered) budget: no source file is read after that, and the page
    says so, instead of reading the page's sources whatever the budget."""
    prefix, relpaths = sourced_chain
    monkeypatch.setattr(files, "MAX_READ_BYTES", 3 << 19)  # 1.5 MiB: the first shard, part of the second

    status, body = compare_page(prefix, relpaths[0])

    assert status == 200, body
    assert count_heads_read[0] == 0
    note = re.search(r'<div class="note read-limit">(.*?)</div>', body, re.S)
    assert note is not None
    text = re.sub(r"<[^>]+>", "", note.group(1))
    assert f"source files of chain/raw: not read for {DOCUMENTS} documents" in text
    assert "source 7 sss" not in body
    assert body.count('class="docid mono"') == DOCUMENTS


# -- results.json of a training page -----------------------------------------------------------
READERS = 5
RESULT_KEYS = 2000


@dataclass(frozen=True)
class ResultsConfig:
    index: int
    input_path: str
    output_path: str


def write_results(config: ResultsConfig) -> None:
    """An evaluation of the training step: results.json of RESULT_KEYS metrics (~60 KB)."""
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "results.json"), "w") as handle:
        json.dump({f"task{key:05d}/acc": key / RESULT_KEYS for key in range(RESULT_KEYS)}, handle)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> tuple[str, str]:
    """A training step and READERS evaluations that read it, each with a results.json."""
    prefix = str(tmp_path_factory.mktemp("evaluated") / "prefix")
    lines = [json.dumps({"step": step, "train/loss": 3.0 - step / 10}) for step in range(10)]
    train = ExecutorStep(
        name="crafted/train",
        fn=write_metrics,
        config=MetricsConfig(lines=lines, output_path=this_output_path()),
    )
    readers = [
        ExecutorStep(
            name=f"crafted/eval{index}",
            fn=write_results,
            config=ResultsConfig(
                index=versioned(index), input_path=output_path_of(train), output_path=this_output_path()
            ),
        )
        for index in range(READERS)
    ]
    run_steps(prefix, [train, *readers])
    return prefix, relpath_of(prefix, "crafted/train")


def results_tables(body: str) -> list[str]:
    return re.findall(r'<table class="results">(.*?)</table>', body, re.S)


def test_a_training_page_reads_at_most_max_results_files_and_rows(evaluated, monkeypatch, count_heads_read):
    prefix, relpath = evaluated
    monkeypatch.setattr(pages, "MAX_RESULTS_FILES", 3, raising=False)

    status, body = training_page(prefix, relpath)

    assert status == 200, body[-2000:]
    assert count_heads_read[0] == 3
    tables = results_tables(body)
    assert len(tables) == 3
    max_rows = getattr(pages, "MAX_RESULT_ROWS", RESULT_KEYS)
    assert max_rows < RESULT_KEYS
    assert all(table.count("<tr>") == max_rows + 1 for table in tables)  # + the header
    assert f"{RESULT_KEYS - max_rows} more values are not shown" in body
    assert "2 more steps that read it were not looked at (a page reads at most 3 results.json)" in body
    assert "crafted/eval3" in body and "crafted/eval4" in body  # named, with links
    assert len(body) < 512 << 10, len(body)


def test_results_json_reads_count_against_the_requests_budget(evaluated, monkeypatch, count_heads_read):
    """With a budget of 150 KB, two results.json of ~60 KB are read and the third crosses it:
    the other two are not read, and the page says so."""
    prefix, relpath = evaluated
    monkeypatch.setattr(files, "MAX_READ_BYTES", 150_000)

    status, body = training_page(prefix, relpath)

    assert status == 200, body[-2000:]
    assert count_heads_read[0] == 3
    assert len(results_tables(body)) == 3
    assert "2 more steps not looked at for results.json: the request's read budget" in body


# -- leaderboard and predictions -----------------------------------------------------------------
def write_step_record(prefix: str, name: str, info: dict) -> str:
    """A step output as the executor writes its bookkeeping (these steps' functions are
    recognised by name, so the tree is written by hand, as in test_leaderboard.py)."""
    path = os.path.join(prefix, f"{name}-{hashlib.sha256(name.encode()).hexdigest()[:8]}")
    os.makedirs(path)
    with open(os.path.join(path, ".executor_info"), "w") as handle:
        json.dump({"name": name, "output_path": path, **info}, handle)
    with open(os.path.join(path, ".executor_status"), "w") as handle:
        for status in ("RUNNING", "SUCCESS"):
            handle.write(json.dumps({"date": "2026-11-23T10:00:00.000Z", "status": status}) + "\n")
    return path


WIDE_FIELDS = 20_000


@pytest.fixture(scope="module")
def board(tmp_path_factory) -> str:
    """Three training runs whose recorded configs have WIDE_FIELDS fields each, all of them
    different; the first also logged 100,000 eval/ metrics at its last step."""
    prefix = str(tmp_path_factory.mktemp("board") / "prefix")
    for run in range(3):
        config = {f"field{key:05d}": run for key in range(WIDE_FIELDS)}
        path = write_step_record(
            prefix,
            f"checkpoints/wide{run}",
            {"fn_name": "operations.train:train", "config": {}, "version": {"config": config}},
        )
        with open(os.path.join(path, "stats.json"), "w") as handle:
            json.dump({"final_eval_loss": 3.0 + run / 10, "parameter_count": 1000}, handle)
        with open(os.path.join(path, "metrics.jsonl"), "w") as handle:
            for line in range(100 if run == 0 else 0):
                handle.write(
                    json.dumps({"step": 9, **{f"eval/k{line}_{key}": 1.0 for key in range(1000)}}) + "\n"
                )
            last = {"step": 9, "throughput/total_tokens": 4096, **({"eval/bpb": 1.5} if run == 0 else {})}
            handle.write(json.dumps(last) + "\n")
    return prefix


def board_page(prefix: str, target: str = "/leaderboard") -> tuple[int, str]:
    server = start_server(prefix, port=0).start_in_thread()
    try:
        return get(server.port, target)
    finally:
        server.shutdown()


def record_compared_fields(monkeypatch) -> list[int]:
    """How many config fields the leaderboard compares of each run, as it ranks them."""
    compared: list[int] = []
    fields = leaderboard.compared_fields

    def recording(run):
        kept = fields(run)
        compared.append(len(kept))
        return kept

    monkeypatch.setattr(leaderboard, "compared_fields", recording)
    return compared


def test_the_leaderboard_compares_at_most_max_config_fields_per_run(board, monkeypatch):
    """20,000 differing fields per run: ranking compared every one of them (json.dumps of each
    field of each run: 8 s of CPU for ten runs of 100,000); now the first
    leaderboard.MAX_COMPARED_FIELDS, and the page says so."""
    compared = record_compared_fields(monkeypatch)

    status, body = board_page(board)

    assert status == 200, body
    assert len(compared) == 3
    limit = leaderboard.MAX_COMPARED_FIELDS
    assert max(compared) == limit < WIDE_FIELDS
    assert (
        f"3 runs record more than {limit:,} config fields: what differs is compared over the first {limit:,}"
        in body
    )
    assert body.count(">checkpoints/wide") == 3 and "field00000=" in body
    assert len(body) < 64 << 10, len(body)


def test_a_run_that_logged_100000_eval_metrics_is_no_burden_to_the_leaderboard(board):
    """Not a defect (measured): only the last 256 KiB of metrics.jsonl are read, and three
    keys of it used. The page stays small and the run's eval/bpb is still its last value."""
    path = glob.glob(os.path.join(board, "checkpoints", "wide0-*", "metrics.jsonl"))[0]
    assert os.path.getsize(path) > 2_000_000
    status, body = board_page(board, "/leaderboard?by=bpb")
    assert status == 200 and len(body) < 64 << 10
    assert body.count(">1.5<") == 1  # wide0's eval/bpb; the others logged none


def test_a_prediction_with_a_label_of_a_million_characters_makes_a_small_page(tmp_path):
    """prediction.json may hold 1 MiB: its label was shown whole (20 such predictions made a
    19 MB page). The label is cut at MAX_LABEL_CHARS, saying how long it was."""
    prefix = str(tmp_path / "prefix")
    for number in range(3):
        path = write_step_record(
            prefix, f"predictions/p{number}", {"fn_name": "operations.scaling_laws:write_prediction"}
        )
        record = {"target": {"label": "L" * 1_000_000}, "predicted_loss": 3.0, "interval": [2.9, 3.1]}
        record["digest"] = digest_of(record)
        with open(os.path.join(path, "prediction.json"), "w") as handle:
            json.dump(record, handle)

    status, body = board_page(prefix, "/predictions")
    assert status == 200, body[-2000:]
    assert len(body) < 64 << 10, len(body)
    assert body.count("(1,000,000 characters)") == 3

    status, body = board_page(prefix, f"/step/{relpath_of(prefix, 'predictions/p0')}")
    assert status == 200 and len(body) < 64 << 10 and "(1,000,000 characters)" in body


# -- the experiment manifests of the index, experiment and step pages ---------------------------
# Found by a third pass: `/`, `/exp/<id>` and `/step/<rel>` read every manifest under
# experiments/ (200 of 4 MiB: 838 MB read, 4 GB of memory, 16 s of CPU and an 818 MB page for
# one `/`, whose description column showed each manifest's description whole; 20 manifests of
# 27,000 step entries each: 46 s of CPU for `/`, a 22 MB experiment page, a 32 MB step page).
def app_page(prefix: str, target: str) -> tuple[int, str]:
    response = pages.App(prefix).handle(target)
    return response.status, response.body.decode("utf-8")


@pytest.fixture
def manifests_read(monkeypatch) -> list[tuple[str, int]]:
    """(name, bytes) of each experiment manifest the tree read."""
    read: list[tuple[str, int]] = []
    lock = threading.Lock()
    read_record = outputs.OutputTree.read_record

    def counting(self, path: str, limit: int = outputs.MAX_RECORD_BYTES) -> bytes | None:
        data = read_record(self, path, limit)
        if "/experiments/" in path:
            with lock:
                read.append((os.path.basename(path), len(data or b"")))
        return data

    monkeypatch.setattr(outputs.OutputTree, "read_record", counting)
    return read


@pytest.fixture
def steps_looked_up(monkeypatch) -> list[int]:
    """Step outputs the request looked up by path (`_Tree.load_step`): [count]."""
    counted = [0]
    load_step = pages._Tree.load_step

    def counting(self, path):
        counted[0] += 1
        return load_step(self, path)

    monkeypatch.setattr(pages._Tree, "load_step", counting)
    return counted


def manifest_note(body: str) -> str | None:
    note = re.search(r'<div class="note manifests-unread">(.*?)</div>', body, re.S)
    return re.sub(r"<[^>]+>", "", note.group(1)) if note else None


def dated(path: str, mtime: float) -> None:
    os.utime(path, (mtime, mtime))


@pytest.fixture
def many_manifests(tmp_path) -> tuple[str, list[str]]:
    """A chain of 2 steps (its real manifest the newest) and 30 crafted manifests
    `exp-00`..`exp-29` (exp-29 the most recently modified), each naming the chain's first
    step: (prefix, the chain's relpaths)."""
    prefix = str(tmp_path / "prefix")
    relpaths = make_chain(prefix, 2)
    first = os.path.join(prefix, relpaths[0])
    (real,) = glob.glob(os.path.join(prefix, "experiments", "*.json"))
    dated(real, 1_000_000_100)
    for number in range(30):
        crafted_manifest(prefix, f"exp-{number:02d}.json", [{"name": "chain/s0", "output_path": first}])
        dated(os.path.join(prefix, "experiments", f"exp-{number:02d}.json"), 1_000_000_000 + number)
    return prefix, relpaths


def test_a_normal_tree_reads_every_manifest_and_says_nothing(many_manifests, manifests_read):
    prefix, _relpaths = many_manifests
    status, body = app_page(prefix, "/")
    assert status == 200
    assert len(manifests_read) == 31 and manifest_note(body) is None
    assert body.count('href="/exp/') == 31


def test_the_index_reads_at_most_max_manifests_the_newest_first(many_manifests, monkeypatch, manifests_read):
    prefix, _relpaths = many_manifests
    monkeypatch.setattr(pages, "MAX_MANIFESTS", 10, raising=False)
    monkeypatch.setattr(pages, "MAX_UNREAD_NAMED", 5, raising=False)

    status, body = app_page(prefix, "/")

    assert status == 200, body
    (real,) = [
        name for name in os.listdir(os.path.join(prefix, "experiments")) if not name.startswith("exp-")
    ]
    assert sorted(name for name, _size in manifests_read) == sorted(
        [real] + [f"exp-{number}.json" for number in range(21, 30)]
    )
    note = manifest_note(body)
    assert note is not None, "the page does not say that manifests were left unread"
    assert "21 experiment manifests not read" in note and "at most 10 experiment manifests" in note
    assert "most recently modified first" in note
    # The newest unread are named (linked: /exp/ reads one manifest alone), the rest counted.
    for number in range(16, 21):
        assert f'href="/exp/exp-{number:02d}"' in body
    assert 'href="/exp/exp-15"' not in body and "and 16 more" in note
    assert body.count("<tr>") == 10 + 1  # + the header


def test_the_index_reads_at_most_max_manifest_bytes(
    tmp_path, monkeypatch, count_records_read, manifests_read
):
    """Ten manifests of 1 MB (one file, hard-linked) with the cap lowered to 3 MiB: sizes
    come from the listing, so the manifests past the cap are not opened."""
    prefix = str(tmp_path / "prefix")
    make_chain(prefix, 1)
    crafted_manifest(prefix, "big-0.json", [], pad=1_000_000)
    for number in range(1, 10):
        os.link(
            os.path.join(prefix, "experiments", "big-0.json"),
            os.path.join(prefix, "experiments", f"big-{number}.json"),
        )
    (real,) = [
        path for path in glob.glob(os.path.join(prefix, "experiments", "*.json")) if "/big-" not in path
    ]
    dated(real, 2_000_000_000)  # the newest
    monkeypatch.setattr(pages, "MAX_MANIFEST_BYTES", 3 << 20, raising=False)

    status, body = app_page(prefix, "/")

    assert status == 200, body[:2000]
    assert sum(size for _name, size in manifests_read) <= 3 << 20, manifests_read
    assert len(manifests_read) == 4  # the real one (a few KB) and three of 1 MB
    note = manifest_note(body)
    assert note is not None and "7 experiment manifests not read" in note and "3 MiB" in note
    assert len(body) < 64 << 10, len(body)  # the descriptions (1 MB each) are cut


def test_a_manifests_description_is_cut_on_the_index_and_experiment_pages(tmp_path):
    prefix = str(tmp_path / "prefix")
    make_chain(prefix, 1)
    crafted_manifest(prefix, "long.json", [], pad=1 << 20)
    with open(os.path.join(prefix, "experiments", "long.json")) as handle:
        length = len(json.load(handle)["description"])
    for target in ("/", "/exp/long"):
        status, body = app_page(prefix, target)
        assert status == 200, body[:2000]
        assert len(body) < 64 << 10, (target, len(body))
        assert f"({length:,} characters)" in body


def test_the_manifests_step_entries_are_looked_at_up_to_max_manifest_steps(
    tmp_path, monkeypatch, manifests_read, steps_looked_up
):
    """Five manifests of 1,000 entries each (outputs that do not exist), the newest first,
    with the cap lowered to 2,500 entries: the index looks up at most that many outputs,
    cuts the manifest that crosses the cap and does not read the two after it."""
    prefix = str(tmp_path / "prefix")
    make_chain(prefix, 1)
    (real,) = glob.glob(os.path.join(prefix, "experiments", "*.json"))
    dated(real, 1_000_000_100)  # the newest: 1 entry
    for number in range(5):
        entries = [
            {"name": f"x/e{number}_{key}", "output_path": f"{prefix}/x/e{number}_{key:04d}-0123abcd"}
            for key in range(1000)
        ]
        crafted_manifest(prefix, f"wide-{number}.json", entries)
        dated(os.path.join(prefix, "experiments", f"wide-{number}.json"), 1_000_000_000 + number)
    monkeypatch.setattr(pages, "MAX_MANIFEST_STEPS", 2500, raising=False)

    status, body = app_page(prefix, "/")

    assert status == 200, body[:2000]
    assert steps_looked_up[0] <= 2500, steps_looked_up[0]
    assert sorted(name for name, _size in manifests_read)[-3:] == [
        "wide-2.json",
        "wide-3.json",
        "wide-4.json",
    ]
    assert len(manifests_read) == 4
    note = manifest_note(body)
    assert note is not None and "2 experiment manifests not read" in note and "2,500 steps" in note
    assert "wide-2: 501 of its 1,000 steps not looked at" in note


def test_an_experiment_page_reads_its_own_manifest_only(many_manifests, monkeypatch, manifests_read):
    """Even one the index does not read (past MAX_MANIFESTS)."""
    prefix, relpaths = many_manifests
    monkeypatch.setattr(pages, "MAX_MANIFESTS", 10, raising=False)
    status, body = app_page(prefix, "/exp/exp-00")
    assert status == 200, body[:2000]
    assert manifests_read == [("exp-00.json", manifests_read[0][1])]
    assert f'href="/step/{relpaths[0]}"' in body
    status, body = app_page(prefix, "/exp/missing")
    assert status == 404 and "no experiment" in body and len(manifests_read) == 2


def test_an_experiment_page_shows_at_most_max_experiment_steps(tmp_path, monkeypatch):
    prefix = str(tmp_path / "prefix")
    make_chain(prefix, 1)
    entries = [{"name": f"x/e{key}", "output_path": f"{prefix}/x/e{key:04d}-0123abcd"} for key in range(300)]
    crafted_manifest(prefix, "wide.json", entries)
    monkeypatch.setattr(pages, "MAX_EXPERIMENT_STEPS", 100, raising=False)

    status, body = app_page(prefix, "/exp/wide")

    assert status == 200, body[:2000]
    steps_table = body.split('<table class="steps">', 1)[1].split("</table>", 1)[0]
    assert steps_table.count("<tr>") == 100 + 1  # + the header
    assert body.count('<g class="node') <= 100
    assert "200 more steps of this experiment are not shown" in body and "at most 100" in body


def test_a_step_page_says_its_experiments_may_be_more_than_listed(
    many_manifests, monkeypatch, manifests_read
):
    prefix, relpaths = many_manifests
    monkeypatch.setattr(pages, "MAX_MANIFESTS", 10, raising=False)

    status, body = app_page(prefix, f"/step/{relpaths[0]}")

    assert status == 200, body[:2000]
    assert len(manifests_read) == 10
    note = manifest_note(body)
    assert note is not None and "21 experiment manifests not read" in note
    assert "may be incomplete" in note
    listed = re.search(r"<dt>experiments</dt><dd>(.*?)</dd>", body, re.S).group(1)
    crafted = [name for name in re.findall(r'href="/exp/([^"]+)"', listed) if name.startswith("exp-")]
    assert crafted == [f"exp-{number}" for number in range(29, 20, -1)]
    assert "exp-20" not in listed and "may be incomplete" in listed


def test_a_step_page_lists_each_experiment_once_and_at_most_max_step_readers(tmp_path, monkeypatch):
    """One manifest naming the first step 2,000 times and 300 readers of it."""
    prefix = str(tmp_path / "prefix")
    relpaths = make_chain(prefix, 1)
    first = os.path.join(prefix, relpaths[0])
    entries = [{"name": "chain/s0", "output_path": first}] * 2000 + [
        {"name": f"x/r{key}", "output_path": f"{prefix}/x/r{key:03d}-0123abcd", "dependencies": [first]}
        for key in range(300)
    ]
    crafted_manifest(prefix, "crafted.json", entries)
    monkeypatch.setattr(pages, "MAX_STEP_READERS", 50, raising=False)

    status, body = app_page(prefix, f"/step/{relpaths[0]}")

    assert status == 200, body[:2000]
    assert body.count('href="/exp/crafted"') == 1
    downstream = body.split("<ul class=downstream>", 1)[1].split("</ul>", 1)[0]
    assert downstream.count("<li") == 50 + 1  # + the line that counts the rest
    assert "250 more steps read it" in downstream and "at most 50" in downstream


def test_the_other_pages_that_read_the_manifests_say_what_they_left_unread(many_manifests, monkeypatch):
    """The list of every step and the leaderboard (their outputs include those only manifests
    name) and a compare page's chain lookup read the manifests within the same caps."""
    prefix, relpaths = many_manifests
    monkeypatch.setattr(pages, "MAX_MANIFESTS", 10, raising=False)
    for target in ("/steps", "/leaderboard", "/predictions"):
        status, body = app_page(prefix, target)
        assert status == 200, (target, body[:2000])
        note = manifest_note(body)
        assert note is not None and "21 experiment manifests not read" in note, target
        assert "are not listed" in note
    status, body = app_page(prefix, f"/compare/{relpaths[0]}/{SHARD}")
    assert status == 200, body[:2000]
    note = lookup_note(body)
    assert (
        note is not None and "21 experiment manifests not read" in note and "10 manifests were read" in note
    )


def test_marin_leaderboard_compares_at_most_max_compared_fields_and_says_so(board, monkeypatch, capsys):
    """The CLI ranked with every recorded field too (the same 8 s for a crafted tree)."""
    from marin.cli import main as marin

    compared = record_compared_fields(monkeypatch)
    assert marin(["leaderboard", "--prefix", board]) == 0
    captured = capsys.readouterr()
    assert compared == [leaderboard.MAX_COMPARED_FIELDS] * 3
    assert (
        f"note: 3 run(s) record more than {leaderboard.MAX_COMPARED_FIELDS:,} config fields" in captured.err
    )
    assert "checkpoints/wide0" in captured.out and "field00000=" in captured.out
