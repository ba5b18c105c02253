"""operations/shards.py's per-shard map on a real two-node Ray cluster (127.0.0.1, one CPU
per node, started and shut down by this module): the same bytes as the local pool, shards
run as Ray tasks outside the driver, a bounded number in flight, resume, and a failing
shard named in the error."""

from __future__ import annotations

import json
import os
import random
import string
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import operations.shards as shards_module
from operations.dedup import DedupConfig, deduplicate
from operations.filter import (
    AlphanumericRatio,
    FilterConfig,
    MaxDuplicateLineFraction,
    MinLength,
    filter_documents,
)
from operations.shards import ShardError, document_writer, map_shards, shard_name, write_documents

ray = pytest.importorskip("ray")

from tests.ray_cluster import loopback_cluster  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHARDS = 6


@pytest.fixture(scope="module")
def cluster():
    with loopback_cluster({"num_cpus": 1}) as (cluster, (worker,)):
        yield {"head": cluster.head_node.node_id, "worker": worker.node_id}


def locally(monkeypatch) -> None:
    """Make map_shards use the local pool although this process is connected to Ray."""
    monkeypatch.setattr(shards_module, "ray_connected", lambda: False)


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` (dot files and directories included), by relative path."""
    return {
        str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()
    }


def text(rng: random.Random, words: int) -> str:
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(words))


def write_corpus(directory: Path) -> str:
    """SHARDS shards of prose, with planted junk (short, symbol soup, repeated lines) and
    duplicates across shards (exact and near)."""
    rng = random.Random(7)
    shared = text(rng, 120)
    for index in range(SHARDS):
        documents = []
        for number in range(40):
            body = text(rng, rng.randint(20, 200))
            kind = number % 10
            if kind == 1:
                body = "ok"
            elif kind == 2:
                body = "#$%^&*()!@ {}[]<>~| " * 20
            elif kind == 3:
                body = "print('again')\n" * 30
            elif kind == 4:
                body = shared if index % 2 else shared.upper() + "  "
            elif kind == 5:
                body = shared.replace(shared.split(" ")[index * 7], f"changed{index}")
            documents.append(
                {"id": f"{index}-{number}", "text": body, "source": "t", "metadata": {"n": number}}
            )
        write_documents(str(directory / shard_name(index)), documents)
    return str(directory)


RULES = (
    MinLength(min_chars=10),
    AlphanumericRatio(min_ratio=0.5),
    MaxDuplicateLineFraction(max_fraction=0.3),
)


def test_filter_on_ray_writes_the_same_bytes_as_the_local_pool(cluster, tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "in")
    filter_documents(FilterConfig(input_path=corpus, output_path=str(tmp_path / "ray"), rules=RULES))
    locally(monkeypatch)
    filter_documents(
        FilterConfig(input_path=corpus, output_path=str(tmp_path / "local"), rules=RULES, workers=2)
    )
    on_ray, local = tree(tmp_path / "ray"), tree(tmp_path / "local")
    assert len([name for name in local if name.startswith("shard-")]) == SHARDS
    assert len([name for name in local if name.startswith(".shard_stats/")]) == SHARDS
    assert json.loads(local["stats.json"])["rules"]["min_length"]["dropped"] > 0
    assert on_ray.keys() == local.keys()
    for name in local:
        assert on_ray[name] == local[name], name


def test_dedup_on_ray_writes_the_same_bytes_as_the_local_pool(cluster, tmp_path, monkeypatch):
    """Both of dedup's shard maps (signatures, filtering). Its .npz work files are zip
    archives stamped with the time they were written, so those are compared array by array;
    every other file byte for byte."""
    corpus = write_corpus(tmp_path / "in")
    deduplicate(DedupConfig(input_path=corpus, output_path=str(tmp_path / "ray")))
    locally(monkeypatch)
    deduplicate(DedupConfig(input_path=corpus, output_path=str(tmp_path / "local"), workers=2))
    on_ray, local = tree(tmp_path / "ray"), tree(tmp_path / "local")
    assert on_ray.keys() == local.keys()
    assert json.loads(local["stats.json"])["documents_removed"] > 0
    for name in local:
        if name.endswith(".npz"):
            with np.load(tmp_path / "ray" / name) as a, np.load(tmp_path / "local" / name) as b:
                assert sorted(a.files) == sorted(b.files), name
                for key in a.files:
                    assert np.array_equal(a[key], b[key]), (name, key)
        else:
            assert on_ray[name] == local[name], name


def spec(index: int, record: Path, **extra) -> str:
    return json.dumps({"index": index, "record": str(record), **extra})


def recording_shard(input_shard: str, output_shard: str) -> dict:
    """Write a small shard and record who ran it (pid, Ray node) and when, in `record`."""
    parameters = json.loads(input_shard)
    started = time.time()
    if parameters.get("fail"):
        raise ValueError(f"planted failure in shard {parameters['index']}")
    with document_writer(output_shard) as write:
        write({"id": str(parameters["index"]), "text": "x" * 10, "source": "t", "metadata": {}})
    time.sleep(parameters.get("sleep", 0))
    context = ray.get_runtime_context() if ray.is_initialized() else None
    entry = {
        "index": parameters["index"],
        "pid": os.getpid(),
        "node": context and context.get_node_id(),
        "task": context and context.get_task_id(),
        "start": started,
        "end": time.time(),
    }
    Path(parameters["record"], f"{parameters['index']}-{uuid.uuid4().hex}.json").write_text(json.dumps(entry))
    return {"documents": 1}


def records(record: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(record.glob("*.json"))]


def test_shards_run_as_ray_tasks_outside_the_driver(cluster, tmp_path):
    record = tmp_path / "record"
    record.mkdir()
    stats = map_shards(recording_shard, [spec(i, record) for i in range(4)], str(tmp_path / "out"))
    assert stats == [{"documents": 1}] * 4
    ran = records(record)
    assert sorted(entry["index"] for entry in ran) == [0, 1, 2, 3]
    assert all(entry["pid"] != os.getpid() and entry["task"] for entry in ran)
    assert {entry["node"] for entry in ran} <= {cluster["head"], cluster["worker"]}


def test_at_most_workers_tasks_are_in_flight(cluster, tmp_path):
    record = tmp_path / "record"
    record.mkdir()
    map_shards(
        recording_shard, [spec(i, record, sleep=0.3) for i in range(4)], str(tmp_path / "out"), workers=1
    )
    ran = sorted(records(record), key=lambda entry: entry["start"])
    assert len(ran) == 4
    for before, after in zip(ran, ran[1:], strict=False):
        assert after["start"] >= before["end"], "two shards ran at once with workers=1"


def test_a_finished_shard_is_not_recomputed_on_ray(cluster, tmp_path):
    record = tmp_path / "record"
    record.mkdir()
    out = tmp_path / "out"
    inputs = [spec(i, record) for i in range(4)]
    map_shards(recording_shard, inputs, str(out))
    first = tree(out)
    (out / shard_name(2)).unlink()
    for path in record.iterdir():
        path.unlink()
    stats = map_shards(recording_shard, inputs, str(out))
    assert [entry["index"] for entry in records(record)] == [2]
    assert stats == [{"documents": 1}] * 4
    assert tree(out) == first


def test_a_failing_shard_fails_the_map_naming_the_shard(cluster, tmp_path):
    record = tmp_path / "record"
    record.mkdir()
    inputs = [spec(i, record, fail=i == 1) for i in range(3)]
    with pytest.raises(
        ShardError, match=r"shard 1 \(.*shard-00001\.jsonl\.gz\) failed on a Ray worker"
    ) as caught:
        map_shards(recording_shard, inputs, str(tmp_path / "out"))
    assert "planted failure in shard 1" in str(caught.value)
    assert isinstance(caught.value.__cause__, ValueError)
    assert not (tmp_path / "out" / shard_name(1)).exists()


def holding_shard(input_shard: str, output_shard: str) -> dict:
    """Say which process runs it (a file named by its pid), write half a shard, then hold."""
    parameters = json.loads(input_shard)
    Path(parameters["record"], f"{os.getpid()}.pid").write_text(str(os.getpid()))
    with document_writer(output_shard) as write:
        write({"id": str(parameters["index"]), "text": "x" * 10, "source": "t", "metadata": {}})
        time.sleep(120)
    return {"documents": 1}


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie holds no files and runs nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_an_interrupt_returns_only_once_the_cancelled_ray_tasks_have_ended(cluster, tmp_path):
    """The run's interrupt calls the map's stopper, then releases the step's lease. The stopper
    cancelled the Ray tasks and returned at once, while their workers were still alive (and
    writing) for a moment: long enough for another driver to take the step."""
    import threading

    from executor.interrupts import stop_running_work

    record = tmp_path / "record"
    record.mkdir()
    inputs = [spec(i, record) for i in range(2)]
    failures: list[BaseException] = []

    def run() -> None:
        try:
            map_shards(holding_shard, inputs, str(tmp_path / "out"), workers=2)
        except BaseException as error:  # the cancelled tasks fail the map
            failures.append(error)

    mapper = threading.Thread(target=run)
    mapper.start()
    try:
        deadline = time.monotonic() + 120
        while len(list(record.glob("*.pid"))) < 2:
            assert time.monotonic() < deadline and mapper.is_alive(), "the tasks never started"
            time.sleep(0.05)
        pids = [int(path.read_text()) for path in record.glob("*.pid")]
        assert stop_running_work() == 1
        assert not [pid for pid in pids if _running(pid)], "a cancelled task's worker outlived the stopper"
    finally:
        mapper.join(timeout=60)
    assert not mapper.is_alive()
    assert failures and isinstance(failures[0], ShardError)
