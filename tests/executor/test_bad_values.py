"""Runaway config values: refused before anything runs, naming the step and the field.

Limits (docs/executor.md): configs nest at most 100 containers deep (`MAX_DEPTH`), and a
step's version encodes to at most 1 MiB of canonical JSON (`MAX_VERSION_BYTES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from executor import Executor, ExecutorStep, StepDefinitionError, versioned
from executor.fingerprint import MAX_DEPTH, MAX_VERSION_BYTES
from executor.graph import resolve


@dataclass(frozen=True)
class Cfg:
    x: Any = None
    y: Any = None


@dataclass(frozen=True)
class Node:
    child: Any = None


def noop(config: Any) -> None:
    raise AssertionError("a refused step must never run")


def nested_lists(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def nested_dicts(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = {"k": value}
    return value


def nested_dataclasses(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = Node(value)
    return value


def refuse(tmp_path, config: Cfg, *fragments: str) -> str:
    with pytest.raises(StepDefinitionError) as caught:
        Executor(str(tmp_path / "out"), console=False).run([ExecutorStep("s", noop, config)])
    message = str(caught.value)
    for fragment in ("step 's'", *fragments):
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert not (tmp_path / "out").exists()
    return message


@pytest.mark.parametrize("build", [nested_lists, nested_dicts, nested_dataclasses])
def test_a_versioned_value_thousands_deep_is_refused_naming_its_field(tmp_path, build):
    refuse(tmp_path, Cfg(x=versioned(build(5000))), "versioned field 'x'", f"more than {MAX_DEPTH} levels")


def nested_tuples(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = (value,)
    return value


def test_a_set_of_deep_tuples_is_refused_versioned_or_not(tmp_path):
    # The walker does not descend into sets (no markers there); the encoder does.
    refuse(tmp_path, Cfg(x=versioned(frozenset({nested_tuples(5000)}))), "versioned field 'x'", "levels deep")
    refuse(tmp_path, Cfg(y=frozenset({nested_tuples(5000)})), "config field 'y'", "levels deep")


@pytest.mark.parametrize("build", [nested_lists, nested_dicts, nested_dataclasses])
def test_an_unversioned_value_thousands_deep_is_refused_naming_its_field(tmp_path, build):
    refuse(tmp_path, Cfg(y=build(5000)), "config field 'y", f"more than {MAX_DEPTH} levels")


def test_a_deep_value_below_a_dependency_is_refused_with_that_steps_name(tmp_path):
    up = ExecutorStep("up", noop, Cfg(y=nested_lists(5000)))
    with pytest.raises(StepDefinitionError, match="step 'up'"):
        Executor(str(tmp_path / "out"), console=False).run([ExecutorStep("s", noop, Cfg(x=up))])


@pytest.mark.parametrize("wrap", [lambda v: v, versioned], ids=["unversioned", "versioned"])
def test_values_at_the_depth_limit_are_accepted_and_one_more_level_is_not(tmp_path, wrap):
    # The config dataclass is the first container; its field holds MAX_DEPTH - 1 more.
    fits = resolve([ExecutorStep("s", noop, Cfg(x=wrap(nested_lists(MAX_DEPTH - 1))))], str(tmp_path))
    assert fits.steps[0].config_record["x"]  # the recorded config (.executor_info) encodes too
    with pytest.raises(StepDefinitionError, match="field 'x'"):
        resolve([ExecutorStep("s", noop, Cfg(x=wrap(nested_lists(MAX_DEPTH))))], str(tmp_path))


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("x" * (20 << 20), id="20MB-string"),
        pytest.param([f"shard-{i:08d}.jsonl.gz" for i in range(100_000)], id="100k-paths"),
        pytest.param({f"k{i}": i for i in range(200_000)}, id="200k-dict"),
    ],
)
def test_a_versioned_value_over_the_size_limit_is_refused_naming_its_field(tmp_path, value):
    message = refuse(
        tmp_path, Cfg(x=versioned(value), y=versioned(1)), "versioned field 'x'", f"{MAX_VERSION_BYTES:,}"
    )
    assert "digest" in message  # the fix


def test_a_version_just_under_the_size_limit_is_accepted(tmp_path):
    resolve([ExecutorStep("s", noop, Cfg(x=versioned("x" * (MAX_VERSION_BYTES - 200))))], str(tmp_path))
    with pytest.raises(StepDefinitionError, match="versioned field 'x'"):
        resolve([ExecutorStep("s", noop, Cfg(x=versioned("x" * MAX_VERSION_BYTES)))], str(tmp_path))


def test_the_size_limit_counts_utf8_bytes(tmp_path):
    text = "é" * (MAX_VERSION_BYTES // 2 + 10)  # under the limit in characters, over it in bytes
    with pytest.raises(StepDefinitionError, match="versioned field 'x'"):
        resolve([ExecutorStep("s", noop, Cfg(x=versioned(text)))], str(tmp_path))
