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


def test_plain_data_on_the_function_is_read_and_checked_like_the_decorator():
    def step(config):
        return config

    step.__run_records__ = {"files": ["logs/**"], "fields": {"stats.json": "seconds"}}
    assert records_of(step) == RunRecords(files=("logs/**",), fields=(("stats.json", ("seconds",)),))
    step.__run_records__ = {"files": ["../outside/**"]}
    with pytest.raises(ValueError, match="is not a path pattern"):
        records_of(step)
    step.__run_records__ = {"fields": {"stats.json": [""]}}
    with pytest.raises(ValueError, match="fields of 'stats.json' must be non-empty strings"):
        records_of(step)


def test_train_and_eval_declare_timings_but_not_results():
    from operations.eval import evaluate
    from operations.hub import evaluate_with_hub_tokenizer, train_with_hub_tokenizer
    from operations.train import train

    records = records_of(train)
    assert records == records_of(train_with_hub_tokenizer)
    assert records_of(evaluate) == records_of(evaluate_with_hub_tokenizer)
    assert records.is_record_file("logs/quickstart-nano-ac91b2a2-91e9ff623d.log.log")
    assert not records.is_record_file("checkpoints/step-7/model/lm_head/weight/0.0")
    assert not records.is_record_file("hf/step-7/model.safetensors")
    line = b'{"step": 3, "train/loss": 6.2, "throughput/duration": 4.5, "throughput/hook_time": 0.1,'
    line += (
        b' "throughput/tokens_per_second": 223.3, "throughput/total_tokens": 2048, "eval/total_time": 2.8}'
    )
    kept = json.loads(without_fields(line, records.fields_of("metrics.jsonl")))
    assert kept == {"step": 3, "train/loss": 6.2, "throughput/total_tokens": 2048}
    assert records.fields_of("checkpoints/step-4/metadata.json") == ("timestamp",)
