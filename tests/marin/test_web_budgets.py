"""Per-request budgets of the browser's pages that read many files or many metrics.

Found by a red-team pass: `/compare/` read one shard per step of a chain (up to
`CHAIN_LIMIT`), each with a read budget of its own, so one request could use a dozen times
the documented limit; `/train/` drew one chart per distinct `eval/*` name of a crafted
metrics.jsonl (100,000 of them: a 63 MB page and 1.6 GB of server memory).

The trees are made by the executor (module-level step functions, so the tree records them
as importable) and read over real HTTP from a real server on 127.0.0.1. The limits are
lowered, and time is a clock advanced by hand, so nothing depends on how fast the machine
is: the tests count bytes, pages and charts, never seconds.
"""

from __future__ import annotations

import glob
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
from marin.web import files, pages, start_server
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


def test_one_read_budget_of_time_is_shared_by_every_step_of_a_compare_page(chain, monkeypatch):
    """Time from a clock that advances 1 ms each time the readers look at it: one budget of
    5 s (the default) covers about 2,500 lines, fewer than the chain's 6 x 1,020."""
    prefix, relpaths = chain
    ticks = [0]
    lock = threading.Lock()

    def monotonic() -> float:
        with lock:
            ticks[0] += 1
            return ticks[0] / 1000

    monkeypatch.setattr(files, "time", types.SimpleNamespace(monotonic=monotonic))

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
