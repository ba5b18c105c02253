"""operations.eval: per-domain held-out loss and bits-per-byte of a real (nano) checkpoint.

One module fixture trains a tokenizer, tokenizes two tiny corpora (two "domains") with it,
and trains the nano Llama 5 steps on the first with operations.train (on CPU). The tests
evaluate the final checkpoint on both domains and check the numbers against the training
run's own eval loss and against token and byte counts made here from the caches.
"""

import json
import math
import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest

from marin.models import MODELS
from operations.eval import EvalConfig, evaluate, read_results, token_byte_lengths
from operations.tokenize import TokenizeConfig, lm_data_config, tokenize
from operations.tokenizer import TrainTokenizerConfig, train_tokenizer
from operations.train import SimpleTrainConfig, TrainConfig, read_metrics, train
from tests.operations.test_tokenizer import make_corpus

REPO = pathlib.Path(__file__).resolve().parents[2]
SEQ_LEN = 64
BATCH = 4
STEPS = 5


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(tokenized paths by domain, tokenizer, training output) of a 5-step nano run on domain "a"."""
    root = tmp_path_factory.mktemp("eval")
    make_corpus(str(root / "docs_a"), documents=300, shards=2, seed=0)
    make_corpus(str(root / "docs_b"), documents=120, shards=1, seed=1)
    tokenizer = str(root / "tokenizer")
    train_tokenizer(
        TrainTokenizerConfig(input_path=str(root / "docs_a"), output_path=tokenizer, vocab_size=400)
    )
    domains = {}
    for name, fraction in (("a", 0.1), ("b", 0.3)):
        domains[name] = str(root / f"tokenized_{name}")
        tokenize(TokenizeConfig(str(root / f"docs_{name}"), tokenizer, domains[name], fraction, workers=1))
    output = str(root / "run")
    train(
        TrainConfig(
            tokenized_path=domains["a"],
            tokenizer=tokenizer,
            model=MODELS["llama_nano"],
            train=SimpleTrainConfig(
                train_batch_size=BATCH,
                num_train_steps=STEPS,
                learning_rate=3e-3,
                seq_len=SEQ_LEN,
                steps_per_eval=STEPS,  # eval at step 0 and at the last step, on the whole validation set
                steps_per_checkpoint=STEPS,
            ),
            output_path=output,
            tracker="none",
        )
    )
    return domains, tokenizer, output


def eval_config(run, output_path, **fields):
    domains, tokenizer, output = run
    values = dict(
        checkpoint_path=f"{output}/checkpoints",
        tokenizer=tokenizer,
        datasets=domains,
        model=MODELS["llama_nano"],
        output_path=str(output_path),
        batch_size=BATCH,
        seq_len=SEQ_LEN,
    )
    values.update(fields)
    return EvalConfig(**values)


def direct_counts(tokenized_path, tokenizer_path):
    """Predicted tokens and their UTF-8 bytes in a validation cache, counted without the evaluator."""
    import haliax as hax
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    special = set(tokenizer.all_special_ids)
    dataset = lm_data_config(tokenized_path, tokenizer_path).validation_set(hax.Axis("position", SEQ_LEN))
    examples = dataset.as_sync_dataset()
    tokens = n_bytes = 0
    for index in range(len(examples)):
        ids = np.asarray(examples[index].tokens.array)
        # Every position but the first is a prediction target; its bytes are those of its token text.
        targets = ids[1:]
        tokens += len(targets)
        for token in tokenizer.convert_ids_to_tokens(targets.tolist()):
            n_bytes += 0 if tokenizer.convert_tokens_to_ids(token) in special else len(_utf8(token))
    return tokens, n_bytes


def _utf8(byte_level_token):
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    decoder = {char: byte for byte, char in bytes_to_unicode().items()}
    return bytes(decoder[char] for char in byte_level_token)


def test_importing_eval_does_not_import_levanter_or_jax():
    code = "import sys, operations.eval; print(sorted(m for m in ('levanter', 'jax', 'haliax') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert out.strip() == "[]"


def test_config_is_frozen_hashable_and_picklable():
    config = EvalConfig("ckpt", "tok", {"a": "x", "b": "y"}, MODELS["llama_nano"], "out")
    assert pickle.loads(pickle.dumps(config)) == config
    assert hash(config) == hash(EvalConfig("ckpt", "tok", {"b": "y", "a": "x"}, MODELS["llama_nano"], "out"))
    with pytest.raises(AttributeError):
        config.batch_size = 2  # type: ignore[misc]


def test_a_domain_without_a_validation_cache_is_refused_by_name(tmp_path):
    config = EvalConfig(
        "ckpt", "tok", {"web": str(tmp_path / "nothing")}, MODELS["llama_nano"], str(tmp_path)
    )
    with pytest.raises(ValueError, match=r"datasets\['web'\].*operations.tokenize"):
        evaluate(config)


@pytest.mark.slow
def test_per_domain_loss_and_bpb_match_training_eval_and_direct_counts(run, tmp_path):
    domains, tokenizer, output = run
    config = eval_config(run, tmp_path / "eval")
    evaluate(config)
    results = read_results(config.output_path)

    final_step = STEPS - 1
    assert results["step"] == final_step and results["checkpoint"].endswith(f"step-{final_step}")
    assert set(results["domains"]) == {"a", "b"}
    for name, domain in results["domains"].items():
        assert all(math.isfinite(domain[key]) for key in ("loss", "bpb", "levanter_bpb")), name
        # bits per byte is the total loss in bits over the bytes of the predicted tokens.
        tokens, n_bytes = direct_counts(domains[name], tokenizer)
        assert (domain["tokens"], domain["bytes"]) == (tokens, n_bytes), name
        assert domain["bpb"] == pytest.approx(domain["loss"] * tokens / (n_bytes * math.log(2)), rel=1e-12)
        # After 5 steps the model is far from uniform over the 400 tokens, not yet good.
        assert 0.5 < domain["loss"] < math.log(400), name
    assert results["macro_avg_loss"] == pytest.approx(
        np.mean([d["loss"] for d in results["domains"].values()])
    )
    assert results["macro_avg_bpb"] == pytest.approx(np.mean([d["bpb"] for d in results["domains"].values()]))

    # The same checkpoint, the same validation set: the trainer's in-training eval of the last step.
    trained = {m["step"]: m["eval/loss"] for m in read_metrics(output) if "eval/loss" in m}
    assert results["domains"]["a"]["loss"] == pytest.approx(trained[final_step], rel=1e-5)
    print(
        f"\neval: a loss {results['domains']['a']['loss']:.6f} (training eval {trained[final_step]:.6f}, "
        f"diff {abs(results['domains']['a']['loss'] - trained[final_step]):.1e}), "
        f"bpb {results['domains']['a']['bpb']:.4f} (Levanter's {results['domains']['a']['levanter_bpb']:.4f}); "
        f"b loss {results['domains']['b']['loss']:.5f} bpb {results['domains']['b']['bpb']:.4f}; "
        f"{json.loads((tmp_path / 'eval' / 'stats.json').read_text())['seconds']} s"
    )

    # A finished evaluation is not recomputed.
    before = (tmp_path / "eval" / "results.json").read_bytes()
    evaluate(config)
    assert (tmp_path / "eval" / "results.json").read_bytes() == before


@pytest.mark.slow
def test_max_eval_batches_caps_every_domain(run, tmp_path):
    config = eval_config(
        run, tmp_path / "eval", max_eval_batches=1, checkpoint_path=f"{run[2]}/checkpoints/step-4"
    )
    evaluate(config)
    results = read_results(config.output_path)
    for domain in results["domains"].values():
        assert 0 < domain["tokens"] <= BATCH * (SEQ_LEN - 1)


@pytest.mark.slow
def test_byte_lengths_are_exact_for_byte_level_tokens(run):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run[1])
    table = token_byte_lengths(tokenizer)
    text = "naïve café 日本語 emoji 🙂"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert int(table[ids].sum()) == len(text.encode("utf-8"))
    assert table[tokenizer.eos_token_id] == 0


@pytest.mark.slow
def test_a_local_multiple_choice_task_runs_through_levanters_harness(run, tmp_path):
    pytest.importorskip("lm_eval", reason="lm-eval-harness is optional (pip install lm-eval==0.4.13)")
    questions = [
        {"question": "def f(x): return", "choices": [" x", " 日本語 café"], "label": 0},
        {"question": "for x in", "choices": [" data", " 🙂🙂🙂"], "label": 0},
        {"question": "import", "choices": [" self", " naïve"], "label": 0},
        {"question": "while", "choices": [" tabs", " value"], "label": 1},
    ]
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "toy.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    (tasks / "toy.yaml").write_text(
        "task: toy_mc\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n  data_files:\n    test: toy.jsonl\n"  # relative to the YAML file
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{label}}"\n'
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    config = eval_config(run, tmp_path / "eval", harness_tasks=(str(tasks / "toy.yaml"),))
    evaluate(config)
    harness = read_results(config.output_path)["harness"]
    toy = harness["tasks"]["toy_mc"]
    assert toy["sample_len"] == len(questions)
    assert toy["acc,none"] in {0.0, 0.25, 0.5, 0.75, 1.0}
    assert harness["averages"]["macro_avg_acc,none"] == toy["acc,none"]
    print(f"\nharness: toy_mc acc {toy['acc,none']}, acc_norm {toy['acc_norm,none']}")
