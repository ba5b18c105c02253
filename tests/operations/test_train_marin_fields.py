"""operations.train's settings from Marin's SimpleTrainConfig and default_train: the W&B name,
group and tags, Adam's and the schedule's settings, the z-loss, and starting from another run's
checkpoint or Hugging Face export.

What reaches Levanter's configs is read off `levanter_config`; one real nano run (W&B offline)
trains once per module, and shows the labels in its W&B run file and the two ways of starting
from it at work (the first loss of a run started from it is near its last, far below a fresh
start's).
"""

import json
import pathlib
import struct
from dataclasses import replace

import pytest

from operations.train import levanter_config, read_metrics, run_id, train
from tests.operations.test_train import data, nano_config  # noqa: F401 -- `data` is a fixture


def losses(output_path) -> dict[int, float]:
    return {m["step"]: m["train/loss"] for m in read_metrics(str(output_path)) if "train/loss" in m}


# ---------------------------------------------------------------------------- what reaches Levanter


def test_wandb_name_group_and_tags_reach_levanters_wandb_config(data, tmp_path):  # noqa: F811
    default = levanter_config(nano_config(data, tmp_path / "a")).trainer.tracker[0]
    assert (default.name, default.group, default.tags) == (run_id(str(tmp_path / "a")), None, [])
    labelled = replace(
        nano_config(data, tmp_path / "b"), wandb_name="nano-1", wandb_group="sweep", wandb_tags=("a", "b")
    )
    tracker = levanter_config(labelled).trainer.tracker[0]
    assert (tracker.name, tracker.group, tracker.tags) == ("nano-1", "sweep", ["a", "b"])
    assert levanter_config(labelled).trainer.id == run_id(str(tmp_path / "b"))  # resumes by path, as before


def test_unset_optimizer_fields_keep_levanters_defaults(data, tmp_path):  # noqa: F811
    from levanter.main.train_lm import TrainLmConfig
    from levanter.optim import AdamConfig

    lm = levanter_config(nano_config(data, tmp_path / "run"))
    names = (
        "beta1",
        "beta2",
        "epsilon",
        "max_grad_norm",
        "decay",
        "rewarmup",
        "cycle_length",
        "skip_bad_steps",
    )
    assert {name: getattr(lm.optimizer, name) for name in names} == {
        name: getattr(AdamConfig(), name) for name in names
    }
    assert (lm.z_loss_weight, lm.initialize_from_checkpoint_path, lm.initialize_from_hf) == (
        TrainLmConfig.z_loss_weight,
        None,
        False,
    )


def test_optimizer_schedule_and_loss_fields_reach_levanters_configs(data, tmp_path):  # noqa: F811
    values = dict(
        beta1=0.8,
        beta2=0.99,
        epsilon=1e-6,
        max_grad_norm=0.5,
        decay=0.4,
        rewarmup=0.2,
        cycle_length=(10, 10),
        skip_bad_steps=16,
        z_loss_weight=1e-4,
    )
    lm = levanter_config(nano_config(data, tmp_path / "run", **values))
    adam = {**values, "cycle_length": [10, 10]}  # a list: Levanter's test for several cycles
    del adam["z_loss_weight"]
    assert {name: getattr(lm.optimizer, name) for name in adam} == adam
    assert lm.z_loss_weight == 1e-4
    # Two cycles of 10 steps, each decaying over its last 4 steps, the second re-warming up
    # over 2: the peak is held in between, and the rate climbs again after step 10.
    rate = lm.optimizer.lr_scheduler(20)
    peak = nano_config(data, tmp_path / "run").train.learning_rate
    assert float(rate(5)) == pytest.approx(peak)
    assert float(rate(9)) < peak and float(rate(10)) < float(rate(11)) < float(rate(12)) == pytest.approx(
        peak
    )


def test_initial_paths_reach_levanter_as_absolute_paths(data, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    from_checkpoint = levanter_config(
        nano_config(data, tmp_path / "a", initialize_from_checkpoint_path="other/checkpoints/step-9")
    )
    assert from_checkpoint.initialize_from_checkpoint_path == str(tmp_path / "other/checkpoints/step-9")
    from_hf = levanter_config(nano_config(data, tmp_path / "b", initialize_from_hf="other/hf/step-9"))
    assert from_hf.initialize_from_hf == str(tmp_path / "other/hf/step-9")


# ---------------------------------------------------------------------------- refused before training


def test_a_checkpoint_path_without_a_checkpoint_is_refused(data, tmp_path):  # noqa: F811
    (tmp_path / "empty").mkdir()
    config = nano_config(data, tmp_path / "run", initialize_from_checkpoint_path=str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="initialize_from_checkpoint_path=.*no Levanter checkpoint"):
        train(config)


def test_a_checkpoint_at_or_past_the_last_step_is_refused(data, tmp_path):  # noqa: F811
    checkpoint = tmp_path / "other" / "checkpoints" / "step-19"
    checkpoint.mkdir(parents=True)
    (checkpoint / "metadata.json").write_text(json.dumps({"step": 19}))
    config = nano_config(data, tmp_path / "run", initialize_from_checkpoint_path=str(checkpoint.parent))
    with pytest.raises(ValueError, match="at step 19, but num_train_steps=20 .* leaves nothing to train"):
        train(config)


def test_an_hf_checkpoint_of_another_shape_is_refused(data, tmp_path):  # noqa: F811
    export = tmp_path / "hf"
    export.mkdir()
    spec = nano_config(data, tmp_path / "run").model
    hf_config = spec.to_levanter().to_hf_config(400).to_dict()
    (export / "config.json").write_text(json.dumps({**hf_config, "hidden_size": 128, "rope_theta": 1.0}))
    config = nano_config(data, tmp_path / "run", initialize_from_hf=str(export))
    with pytest.raises(ValueError, match="hidden_size: 128 there, 64 here; rope_theta: 1.0 there"):
        train(config)
    assert not (tmp_path / "run" / "checkpoints").exists()


# ---------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def source_run(data, tmp_path_factory):  # noqa: F811
    """A 20-step nano run with W&B (offline) labels: checkpoints at steps 10 and 19, hf/step-19."""
    config = replace(
        nano_config(data, tmp_path_factory.mktemp("source") / "run"),
        wandb_name="nano-source",
        wandb_group="marin-fields",
        wandb_tags=("llama", "nano"),
    )
    train(config)
    return config


def wandb_records(path: pathlib.Path):
    """The protobuf records of a W&B run file (`run-<id>.wandb`): a 7-byte header, then LevelDB's
    log format -- 32 KiB blocks of chunks, each a 7-byte header (checksum, length, type: 1
    whole, 2 first, 3 middle, 4 last) and its bytes."""
    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    position, pending = 7, b""
    while position + 7 <= len(raw):
        block_left = 32768 - position % 32768
        if block_left < 7:  # a block's tail too short for a chunk header is padding
            position += block_left
            continue
        _, length, kind = struct.unpack("<IHB", raw[position : position + 7])
        chunk = raw[position + 7 : position + 7 + length]
        position += 7 + length
        if kind == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


@pytest.mark.slow
def test_the_wandb_run_records_the_name_group_and_tags(source_run):
    output = pathlib.Path(source_run.output_path)
    run = run_id(source_run.output_path)
    files = list(output.glob(f"wandb/offline-run-*-{run}/run-{run}.wandb"))
    assert files  # Levanter starts W&B twice per attempt: every start is labelled
    for file in files:
        (record,) = [r.run for r in wandb_records(file) if r.HasField("run")][:1]
        assert (record.run_id, record.display_name, record.run_group) == (run, "nano-source", "marin-fields")
        assert list(record.tags) == ["llama", "nano"]


@pytest.mark.slow
def test_a_run_started_from_a_checkpoint_continues_from_its_state(source_run, data, tmp_path):  # noqa: F811
    checkpoint = pathlib.Path(source_run.output_path) / "checkpoints" / "step-19"
    config = nano_config(
        data,
        tmp_path / "run",
        num_train_steps=24,
        epochs=2,
        initialize_from_checkpoint_path=str(checkpoint),
    )
    train(replace(config, tracker="none"))
    before, after = losses(source_run.output_path), losses(tmp_path / "run")
    # Weights, optimizer state and step: it goes on at step 20, where the source run stopped.
    assert sorted(after) == [20, 21, 22, 23]
    assert after[20] < before[0] - 1.0
    assert abs(after[20] - before[19]) < 0.5
    stats = json.loads((tmp_path / "run" / "stats.json").read_text())
    assert stats["final_checkpoint_step"] == 23


@pytest.mark.slow
def test_a_run_started_from_an_hf_export_starts_from_its_weights(source_run, data, tmp_path):  # noqa: F811
    export = pathlib.Path(source_run.output_path) / "hf" / "step-19"
    config = nano_config(data, tmp_path / "run", num_train_steps=3, initialize_from_hf=str(export))
    train(replace(config, tracker="none"))
    before, after = losses(source_run.output_path), losses(tmp_path / "run")
    # The weights only: the step (and the optimizer) start afresh.
    assert sorted(after) == [0, 1, 2]
    assert after[0] < before[0] - 1.0
    assert abs(after[0] - before[19]) < 0.5
