"""marin.defaults and marin.models with Marin's signatures: what each builder declares (step
names, functions, versioned fields, resources), how versions move, and the steps that run
for a Hub dataset or a Hub tokenizer, against a fake Hub on 127.0.0.1."""

import dataclasses
import json
from pathlib import Path

import pytest

from executor import Executor, ExecutorStep, InputName, ResourceConfig, versioned
from executor.fingerprint import canonical_json, encode, sha256_hex
from executor.graph import resolve
from marin.defaults import (
    TRAIN_FIELDS_VERSIONED_WHEN_SET,
    default_documents,
    default_download,
    default_eval,
    default_tokenize,
    default_train,
    stdlib_download,
)
from marin.models import (
    MODELS,
    SimpleTrainConfig,
    TrainSettings,
    llama3_tokenizer,
    llama_nano,
    marin_tokenizer,
)
from marin.resources import CpuOnlyConfig
from operations import train as train_module
from operations.dataset_formats import render_chats, sample_documents
from operations.documents import make_documents
from operations.download import download
from operations.hub import (
    evaluate_with_hub_tokenizer,
    is_hub_id,
    resolve_tokenizer,
    tokenize_with_hub_tokenizer,
    train_with_hub_tokenizer,
)
from operations.tokenize import tokenize
from tests.fake_hub import hub_env, jsonl_bytes, serve_hub, stories, tokenizer_files


def version_hash(step: ExecutorStep) -> str:
    return resolve([step], "/prefix").resolved(step).version_hash


def version(step: ExecutorStep) -> dict:
    return resolve([step], "/prefix").resolved(step).version


@dataclasses.dataclass(frozen=True)
class TextFormat:  # Levanter's TextLmDatasetFormat, by its fields (importing Levanter costs seconds)
    text_key: str = "text"


@dataclasses.dataclass(frozen=True)
class ChatFormat:  # Levanter's ChatLmDatasetFormat, by its fields
    messages_field: str = "messages"
    single_turn: bool = False
    chat_template: str | None = None
    pack: bool = True
    mask_user_turns: bool = True


def documents_step(name: str = "tiny") -> ExecutorStep:
    return default_documents(name, InputName.hardcoded("raw/tiny"))


# ---------------------------------------------------------------------------- marin.models


def test_versioned_llama_nano_has_the_plain_specs_version_and_a_golden_hash():
    plain = train_module.LlamaSpec(
        hidden_dim=64, intermediate_dim=128, num_layers=2, num_heads=2, num_kv_heads=2, seq_len=128
    )
    assert encode(llama_nano) == encode(plain) == encode(MODELS["llama_nano"])
    assert sha256_hex(canonical_json(encode(versioned(llama_nano).value))) == (
        "e8cd6fb02146f823aa1e0d8a0da9fde445f4efa0586c1dd5e4e25503347f5948"
    )


def test_model_names_are_values_that_still_build_levanter_configs():
    assert MODELS["llama_nano"] is llama_nano and llama_nano.hidden_dim == 64
    assert "82,240" in llama_nano.__doc__
    assert callable(
        llama_nano
    )  # llama_nano(seq_len=64): Levanter's LlamaConfig (tests/operations/test_train.py)
    assert dataclasses.replace(llama_nano, seq_len=64).seq_len == 64


def test_marins_tokenizer_names():
    assert marin_tokenizer == "marin-community/marin-tokenizer"
    assert llama3_tokenizer == "meta-llama/Meta-Llama-3.1-8B"


def test_simple_train_config_takes_marins_fields_and_fills_this_projects_defaults():
    config = SimpleTrainConfig(
        resources=CpuOnlyConfig(),
        train_batch_size=4,
        num_train_steps=100,
        learning_rate=6e-4,
        weight_decay=0.05,
        train_seq_len=64,
        steps_per_export=50,
        steps_per_hf_export=-1,
        data_seed=3,
    )
    settings = config.to_train_settings()
    assert settings == TrainSettings(
        train_batch_size=4,
        num_train_steps=100,
        learning_rate=6e-4,
        weight_decay=0.05,
        seq_len=64,
        steps_per_checkpoint=50,
        steps_per_export=None,
        seed=3,
        resources=CpuOnlyConfig(),
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("ema_beta", 0.999), ("int8", True), ("optimizer_config", object()), ("steps_per_task_eval", 100)],
)
def test_simple_train_config_refuses_what_training_cannot_honour_by_name(field, value):
    config = SimpleTrainConfig(train_batch_size=4, num_train_steps=10, learning_rate=1e-3, **{field: value})
    with pytest.raises(ValueError, match=f"{field}=.*not supported"):
        config.to_train_settings()


def test_simple_train_config_passes_marins_optimizer_and_initialisation_fields_on():
    fields = dict(
        beta1=0.8,
        beta2=0.99,
        epsilon=1e-6,
        max_grad_norm=0.5,
        decay=0.2,
        rewarmup=0.1,
        z_loss_weight=1e-4,
        initialize_from_checkpoint_path="/runs/a/checkpoints/step-9",
    )
    settings = marin_train_config(**fields, cycle_length=[50, 50], skip_bad_steps=True).to_train_settings()
    assert {name: getattr(settings, name) for name in fields} == fields
    assert (settings.cycle_length, settings.skip_bad_steps) == (
        (50, 50),
        True,
    )  # a tuple: the config is frozen
    unset = marin_train_config().to_train_settings()
    assert all(
        getattr(unset, name) is None for name in TRAIN_FIELDS_VERSIONED_WHEN_SET
    )  # skip_bad_steps=False too


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"initialize_from_hf": "meta-llama/Llama-3.1-8B"}, "Hub id, and Hub models are not fetched here"),
        (
            {"initialize_from_checkpoint_path": "/runs/a/checkpoints", "reset_data_loader_on_init": False},
            "reset_data_loader_on_init=False is not supported",
        ),
    ],
)
def test_simple_train_config_refuses_initialisations_it_cannot_honour(fields, message):
    with pytest.raises(ValueError, match=message):
        marin_train_config(**fields).to_train_settings()


def test_simple_train_config_refuses_two_values_for_one_setting():
    config = SimpleTrainConfig(
        train_batch_size=4, num_train_steps=10, learning_rate=1e-3, seq_len=64, train_seq_len=32
    )
    with pytest.raises(ValueError, match="train_seq_len=32 and seq_len=64"):
        config.to_train_settings()


# ---------------------------------------------------------------------------- default_download


def test_default_download_of_a_hub_id_is_marins_step_as_an_input_name():
    raw = default_download("raw/deepseek-prover-bench", "deepseek-ai/DeepSeek-ProverBench", "3b9f067")
    assert isinstance(raw, InputName) and raw.name is None
    step = raw.step
    assert step.name == "raw/deepseek-prover-bench"  # the whole name, as Marin's
    assert step.fn is download
    assert version(step)["config"]["source"] == "hf://datasets/deepseek-ai/DeepSeek-ProverBench"
    assert version(step)["config"]["revision"] == "3b9f067"
    other = default_download("raw/deepseek-prover-bench", "deepseek-ai/DeepSeek-ProverBench", "main")
    assert version_hash(other.step) != version_hash(step)


def test_default_download_hf_urls_glob_selects_files():
    raw = default_download("raw/x", "org/data", "main", hf_urls_glob=["data/*.parquet"])
    assert raw.step.config.include.value == ("data/*.parquet",)


def test_default_download_refuses_a_revision_for_a_local_path(tmp_path):
    with pytest.raises(ValueError, match="applies to Hub datasets only"):
        default_download("raw/local", str(tmp_path), "main")
    assert default_download("raw/local", str(tmp_path)).step.config.source.value == str(tmp_path)


def test_stdlib_download_keeps_its_name_and_leaves_the_location_out_of_the_version():
    step = stdlib_download(max_files=3)
    assert step.name.startswith("raw/python") and step.name.endswith("-stdlib")
    assert "source" not in version(step)["config"]


# ---------------------------------------------------------------------------- default_tokenize


def test_default_tokenize_reads_a_documents_step_as_it_is():
    documents = documents_step()
    step = default_tokenize("tiny", documents, "org/tok")
    assert step.name == "tokenized/tiny"
    assert step.config.input_path is documents
    assert step.fn is tokenize_with_hub_tokenizer  # a Hub id: fetched when the step runs
    assert version(step)["config"]["tokenizer"] == "org/tok"


def test_default_tokenize_with_a_tokenizer_step_calls_tokenize_directly():
    documents = documents_step()
    tokenizer = ExecutorStep("tokenizers/tiny", make_documents, None)
    step = default_tokenize("tiny", documents, tokenizer)
    assert step.fn is tokenize and step.config.tokenizer is tokenizer


def test_default_tokenize_turns_an_input_name_of_raw_files_into_documents_first():
    raw = default_download("raw/tiny", "org/tiny", "main")
    step = default_tokenize("tiny", raw, "org/tok", TextFormat(text_key="story"))
    documents = step.config.input_path
    assert (documents.name, documents.fn) == ("documents/tiny", make_documents)
    assert documents.config.input_path is raw
    assert documents.config.text_field.value == "story"
    assert step.config.text_field.value == "text"  # the shards' field


def test_default_tokenize_of_a_path_versions_the_path(tmp_path):
    step = default_tokenize("tiny", str(tmp_path), "org/tok")
    documents = step.config.input_path
    assert documents.fn is make_documents
    assert version(documents)["config"]["input_path"] == str(tmp_path)


def test_default_tokenize_of_a_hub_dataset_id_downloads_it_first():
    step = default_tokenize("roneneldan/TinyStories", "roneneldan/TinyStories", marin_tokenizer)
    documents = step.config.input_path
    raw = documents.config.input_path
    assert (step.name, documents.name, raw.step.name) == (
        "tokenized/roneneldan/TinyStories",
        "documents/roneneldan/TinyStories",
        "raw/roneneldan/TinyStories",
    )
    assert version(raw.step)["config"]["source"] == "hf://datasets/roneneldan/TinyStories"


def test_default_tokenize_sample_count_adds_a_versioned_sample_step():
    step = default_tokenize("tiny", documents_step(), "org/tok", sample_count=1000)
    sampled = step.config.input_path
    assert (sampled.name, sampled.fn, sampled.config.per_shard.value) == (
        "sampled/tiny",
        sample_documents,
        1000,
    )
    other = default_tokenize("tiny", documents_step(), "org/tok", sample_count=10)
    assert version_hash(other) != version_hash(step)


def test_default_tokenize_chat_format_renders_conversations_with_the_tokenizer():
    raw = default_download("raw/chats", "org/chats", "main")
    step = default_tokenize("chats", raw, "org/tok", ChatFormat(messages_field="conversation"))
    documents = step.config.input_path
    assert documents.fn is render_chats
    assert documents.config.messages_field.value == "conversation"
    assert documents.config.tokenizer.value == "org/tok"


def test_default_tokenize_refuses_marins_is_validation():
    with pytest.raises(ValueError, match="is_validation=True is not supported"):
        default_tokenize("tiny", documents_step(), "org/tok", is_validation=True)


def test_hub_ids_are_told_from_paths_and_urls(tmp_path):
    assert is_hub_id("gpt2") and is_hub_id("org/name") and is_hub_id(marin_tokenizer)
    assert not is_hub_id(str(tmp_path)) and not is_hub_id("s3://bucket/tok") and not is_hub_id("a/b/c")
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "local").mkdir()
    assert not is_hub_id(str(tmp_path / "org" / "local"))


# ---------------------------------------------------------------------------- default_train


def marin_train_config(**fields) -> SimpleTrainConfig:
    """The train_tiny_model_cpu tutorial's config, with `fields` changed."""
    tutorial = dict(
        resources=ResourceConfig.with_cpu(),
        train_batch_size=4,
        num_train_steps=100,
        learning_rate=6e-4,
        weight_decay=0.1,
        max_eval_batches=4,
    )
    return SimpleTrainConfig(**{**tutorial, **fields})


def tutorial_train(**fields) -> ExecutorStep:
    tokenized = default_tokenize("tiny", documents_step(), marin_tokenizer)
    return default_train(
        name="marin-nano",
        tokenized=tokenized,
        model_config=versioned(llama_nano),
        train_config=marin_train_config(**fields),
        tags=["llama", "nano"],
        eval_harness_tasks=[],
        use_default_validation=False,
    )


def test_default_train_step_carries_marins_fields_and_resources():
    step = tutorial_train()
    assert step.name == "checkpoints/marin-nano"
    assert step.fn is train_with_hub_tokenizer
    assert step.resources == ResourceConfig.with_cpu()
    config = version(step)["config"]
    assert config["tokenizer"] == marin_tokenizer
    assert config["model"]["hidden_dim"] == 64
    for field, value in {
        "train.train_batch_size": 4,
        "train.num_train_steps": 100,
        "train.learning_rate": 6e-4,
        "train.weight_decay": 0.1,
    }.items():
        assert config[field] == value
    assert "train.resources" not in config and "train.max_eval_batches" not in config
    assert "[llama, nano]" in step.description


def test_default_train_versions_what_changes_the_model_only():
    base = version_hash(tutorial_train())
    assert version_hash(tutorial_train(steps_per_eval=7)) == base
    assert version_hash(tutorial_train(resources=ResourceConfig.with_gpu("H100"))) == base
    assert version_hash(tutorial_train(warmup=0.2)) != base


def test_a_step_declared_without_the_newer_training_fields_keeps_its_output_path():
    # Pinned before beta1, ..., initialize_from_hf and the W&B labels existed: leaving them unset
    # (or labelling the run) must not move the tutorial's training step. (The tokenize and
    # documents steps above it are in this hash too.)
    step = tutorial_train()
    resolved = resolve([step], "/prefix").resolved(step)
    assert resolved.version_hash == "04b04cdaa41055809670803cb4cd1f44cb8093f2e443f1629d966f71f12fdf5e"
    assert resolved.output_path == "/prefix/checkpoints/marin-nano-04b04cda"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("beta1", 0.8),
        ("beta2", 0.99),
        ("epsilon", 1e-6),
        ("max_grad_norm", 0.5),
        ("decay", 0.2),
        ("rewarmup", 0.1),
        ("cycle_length", [50, 50]),
        ("skip_bad_steps", True),
        ("z_loss_weight", 1e-4),
        ("initialize_from_checkpoint_path", "/runs/a/checkpoints/step-9"),
        ("initialize_from_hf", "/runs/a/hf/step-9"),
    ],
)
def test_the_newer_training_fields_are_versioned_only_when_set(field, value):
    base = version(tutorial_train())
    assert f"train.{field}" not in base["config"]
    changed = version(tutorial_train(**{field: value}))
    assert changed["config"][f"train.{field}"] == value  # (a tuple is encoded as a list)
    assert version_hash(tutorial_train(**{field: value})) != version_hash(tutorial_train())


def test_wandb_labels_reach_the_training_config_and_are_not_versioned(monkeypatch):
    monkeypatch.delenv("WANDB_GROUP", raising=False)
    tokenized = default_tokenize("tiny", documents_step(), "org/tok")
    plain = default_train("n", tokenized, llama_nano, marin_train_config())
    labelled = default_train(
        "n", tokenized, llama_nano, marin_train_config(), tags=["a"], wandb_name="run-1", wandb_group="sweep"
    )
    assert (plain.config.wandb_name, plain.config.wandb_group, plain.config.wandb_tags) == (None, None, ())
    assert (labelled.config.wandb_name, labelled.config.wandb_group, labelled.config.wandb_tags) == (
        "run-1",
        "sweep",
        ("a",),
    )
    assert version_hash(labelled) == version_hash(plain)
    monkeypatch.setenv("WANDB_GROUP", "from-env")  # Marin's fallback for wandb_group
    assert default_train("n", tokenized, llama_nano, marin_train_config()).config.wandb_group == "from-env"
    with pytest.raises(ValueError, match="tags='llama' is a string"):
        default_train("n", tokenized, llama_nano, marin_train_config(), tags="llama")


def test_a_training_steps_checkpoint_as_the_initial_state_is_an_input():
    tokenized = default_tokenize("tiny", documents_step(), "org/tok")
    source = default_train("source", tokenized, llama_nano, marin_train_config())
    continued = default_train(
        "continued",
        tokenized,
        llama_nano,
        marin_train_config(
            num_train_steps=200, initialize_from_checkpoint_path=source / "checkpoints/step-99"
        ),
    )
    graph = resolve([continued], "/prefix")
    assert (
        version(continued)["config"]["train.initialize_from_checkpoint_path"] == "DEP[1]/checkpoints/step-99"
    )
    assert graph.resolved(continued).config.train.initialize_from_checkpoint_path == (
        f"{graph.resolved(source).output_path}/checkpoints/step-99"
    )
    other_source = default_train("source", tokenized, llama_nano, marin_train_config(learning_rate=1e-3))
    moved = default_train(
        "continued",
        tokenized,
        llama_nano,
        marin_train_config(
            num_train_steps=200, initialize_from_checkpoint_path=other_source / "checkpoints/step-99"
        ),
    )
    assert version_hash(moved) != version_hash(continued)


def test_marins_simple_train_config_versions_like_the_settings_it_stands_for():
    tokenized = default_tokenize("tiny", documents_step(), "org/tok")
    marin = default_train("n", tokenized, llama_nano, marin_train_config())
    settings = default_train("n", tokenized, llama_nano, marin_train_config().to_train_settings())
    assert version_hash(marin) == version_hash(settings)


def test_default_train_refuses_in_loop_harness_tasks_and_takes_an_override_path():
    tokenized = default_tokenize("tiny", documents_step(), "org/tok")
    with pytest.raises(ValueError, match="eval_harness_tasks"):
        default_train("n", tokenized, llama_nano, marin_train_config(), eval_harness_tasks=["hellaswag"])
    step = default_train(
        "n", tokenized, llama_nano, marin_train_config(), override_output_path="checkpoints/mine"
    )
    assert step.override_output_path == "checkpoints/mine"


def test_default_eval_of_a_hub_tokenizer_run_resolves_it_when_it_runs():
    trained = tutorial_train()
    evaluated = default_eval("marin-nano", trained, {"tiny": trained.config.tokenized_path})
    assert evaluated.fn is evaluate_with_hub_tokenizer
    assert evaluated.resources == ResourceConfig.with_cpu()


# ---------------------------------------------------------------------------- running, against a fake Hub


def test_resolve_tokenizer_fetches_the_tokenizer_files_into_the_hub_cache(tmp_path):
    files = tokenizer_files(stories(100))
    repos = {("model", "org/tok"): {"main": {**files, "model.safetensors": b"weights, never fetched"}}}
    with serve_hub(repos) as endpoint, hub_env(endpoint, str(tmp_path / "cache")):
        local = resolve_tokenizer("org/tok")
    assert local.startswith(str(tmp_path / "cache"))
    assert json.loads(Path(f"{local}/tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert "model.safetensors" not in {p.name for p in (tmp_path / "cache").rglob("*")}
    assert resolve_tokenizer(str(tmp_path)) == str(tmp_path)  # a directory: as it is


def write_jsonl(path, records) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(jsonl_bytes(records))
    return str(path.parent)


def test_a_path_tokenized_with_a_hub_tokenizer_and_sampled_runs(tmp_path):
    texts = stories(60)
    corpus = write_jsonl(tmp_path / "corpus" / "train.jsonl", [{"story": text} for text in texts])
    repos = {("model", "org/tok"): {"main": tokenizer_files(texts)}}
    step = default_tokenize("stories", corpus, "org/tok", TextFormat(text_key="story"), sample_count=50)
    with serve_hub(repos) as endpoint, hub_env(endpoint, str(tmp_path / "cache")):
        executor = Executor(str(tmp_path / "prefix"), console=False)
        executor.run([step])
    stats = json.loads(Path(f"{executor.output_paths[step]}/stats.json").read_text())
    assert stats["train"]["documents"] + stats["validation"]["documents"] == 50
    sampled = json.loads(Path(f"{executor.output_paths[step.config.input_path]}/stats.json").read_text())
    assert (sampled["documents"], sampled["documents_skipped"]) == (50, 10)


def test_a_chat_dataset_is_rendered_with_the_tokenizers_template_and_tokenized(tmp_path):
    chats = [
        {"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": text}]}
        for i, text in enumerate(stories(20))
    ]
    corpus = write_jsonl(tmp_path / "chats" / "train.jsonl", [*chats, {"other": 1}])
    repos = {("model", "org/tok"): {"main": tokenizer_files(stories(60))}}
    step = default_tokenize("chats", corpus, "org/tok", ChatFormat())
    with serve_hub(repos) as endpoint, hub_env(endpoint, str(tmp_path / "cache")):
        executor = Executor(str(tmp_path / "prefix"), console=False)
        executor.run([step])
    from operations.shards import iter_documents

    rendered = list(iter_documents(executor.output_paths[step.config.input_path]))
    assert (
        rendered[0]["text"] == f"<|user|>hi 0<|end|><|assistant|>{chats[0]['messages'][1]['content']}<|end|>"
    )
    assert [document["id"] for document in rendered[:2]] == ["train.jsonl:1", "train.jsonl:2"]
    assert len(rendered) == 20  # the record without messages is counted, not rendered
    stats = json.loads(Path(f"{executor.output_paths[step]}/stats.json").read_text())
    assert stats["train"]["documents"] + stats["validation"]["documents"] == 20


def test_default_train_takes_levanters_llama_config_by_its_shape_and_refuses_the_rest():
    from levanter.models.llama import LlamaConfig

    tokenized = default_tokenize("tiny", documents_step(), "org/tok")
    shape = dict(seq_len=128, hidden_dim=64, intermediate_dim=128, num_heads=2, num_kv_heads=2, num_layers=2)
    from_levanter = default_train("n", tokenized, versioned(LlamaConfig(**shape)), marin_train_config())
    assert version_hash(from_levanter) == version_hash(
        default_train("n", tokenized, llama_nano, marin_train_config())
    )
    with pytest.raises(ValueError, match="sets initializer_range"):
        default_train("n", tokenized, LlamaConfig(**shape, initializer_range=0.5), marin_train_config())
