"""Run records: what a step function declares about its output's run-describing files and fields."""

import functools
import json

import pytest

from executor.run_records import NO_RUN_RECORDS, RunRecords, records_of, run_records, without_fields


@run_records("logs/**", "wandb/*/run-*.wandb", "attempts.json", fields={"*.json": ["seconds", "a.b"]})
def declared(config):
    return config


def test_file_patterns_match_within_one_part_or_across_parts_with_double_star():
    records = records_of(declared)
    assert records.is_record_file("logs/run.log")
    assert records.is_record_file("logs/deep/er/run.log")
    assert records.is_record_file("wandb/offline-1/run-abc.wandb")
    assert not records.is_record_file("wandb/offline-1/files/run-abc.wandb")  # `*` is one part
    assert records.is_record_file("attempts.json")
    assert not records.is_record_file("sub/attempts.json")
    assert not records.is_record_file("logs")  # the directory name itself is no file under it
    assert not records.is_record_file("checkpoints/step-1/metadata.json")


def test_fields_of_a_file_come_from_every_matching_pattern():
    records = RunRecords(fields=(("*.json", ("x",)), ("stats.json", ("y",))))
    assert records.fields_of("stats.json") == ("x", "y")
    assert records.fields_of("other.json") == ("x",)
    assert records.fields_of("metrics.jsonl") == ()


def test_a_wrapper_made_with_functools_wraps_carries_the_declaration():
    @functools.wraps(declared)
    def wrapper(config):
        return declared(config)

    assert records_of(wrapper) is records_of(declared)
    assert records_of(lambda config: config) is NO_RUN_RECORDS
    assert records_of(None) is NO_RUN_RECORDS


def test_without_fields_drops_nested_and_wildcard_fields_in_json_and_json_lines():
    one = json.dumps({"seconds": 3.5, "loss": 1.25, "a": {"b": 1, "c": 2}, "items": [{"seconds": 1, "k": 0}]})
    assert json.loads(without_fields(one.encode(), ["seconds", "a.b", "items.seconds"])) == {
        "loss": 1.25,
        "a": {"c": 2},
        "items": [{"k": 0}],
    }
    lines = b'{"step": 0, "throughput/tps": 10, "train/loss": 2.0}\n{"step": 1, "throughput/mfu": 0.1}\n'
    assert without_fields(lines, ["throughput/*"]) == b'{"step": 0, "train/loss": 2.0}\n{"step": 1}'
    # Key order and spacing do not matter once canonical; a non-JSON file is left to the caller.
    assert without_fields(b'{"b": 1,  "a": 2}', []) == without_fields(b'{"a":2,"b":1}', [])
    assert without_fields(b"\xff\xfe not text", ["x"]) is None
    assert without_fields(b"plain words", ["x"]) is None


@pytest.mark.parametrize("pattern", ["", "/", "../outside", 3])
def test_a_pattern_that_is_not_relative_to_the_output_is_refused(pattern):
    with pytest.raises(ValueError, match="not a path pattern relative to the output"):
        run_records(pattern)
