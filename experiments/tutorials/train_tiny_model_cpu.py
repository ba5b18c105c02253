"""Train a tiny model on a small dataset, on the CPU.

    python experiments/tutorials/train_tiny_model_cpu.py                 # writes under ./marin-output
    python experiments/tutorials/train_tiny_model_cpu.py --dry_run true  # the plan only

Marin's tutorial of the same name, ported by changing its imports:

1. the dataset is a Hugging Face Hub id: `default_tokenize` downloads it (`raw/...`), turns
   its files into document shards (`documents/...`, the text in the format's `text_key`),
   keeps the first `sample_count` documents of every shard (`sampled/...`) and tokenizes
   them with Marin's tokenizer, fetched from the Hub when the step runs (`tokenized/...`);
2. `default_train` trains `llama_nano` (this project's shape: see docs/coming_from_marin.md)
   with Levanter on the CPU (`resources`), in a process of its own.

Hub ids resolve against `HF_ENDPOINT` (default huggingface.co) and are cached under
`HF_HOME`. The real roneneldan/TinyStories is a few GB: the whole repository is downloaded
before sampling (see docs/coming_from_marin.md). `TUTORIAL_TRAIN_STEPS` shortens training
(the tests run it with a small fake Hub on 127.0.0.1).
"""

import os

from levanter.data.text import TextLmDatasetFormat

from executor import ResourceConfig, executor_main, versioned
from marin.defaults import default_tokenize, default_train
from marin.models import SimpleTrainConfig, llama_nano, marin_tokenizer

# 1. Choose a dataset
tinystories_hf_id = "roneneldan/TinyStories"

# 2. Tokenize the dataset with sampling
# For this tutorial, we limit to 1000 documents per shard
tinystories_tokenized = default_tokenize(
    name=tinystories_hf_id,
    dataset=tinystories_hf_id,
    tokenizer=marin_tokenizer,
    format=TextLmDatasetFormat(),
    sample_count=1000,
)


# 3. Define training configuration
nano_train_config = SimpleTrainConfig(
    # Here we define the hardware resources we need.
    resources=ResourceConfig.with_cpu(),
    train_batch_size=4,
    num_train_steps=int(os.environ.get("TUTORIAL_TRAIN_STEPS", "100")),
    # set hyperparameters
    learning_rate=6e-4,
    weight_decay=0.1,
    # keep eval quick for tutorial
    max_eval_batches=4,
)

# 4. Train the model
nano_tinystories_model = default_train(
    name="marin-nano-tinystories",
    # Steps can depend on other steps: nano_tinystories_model depends on tinystories_tokenized
    tokenized=tinystories_tokenized,
    model_config=versioned(llama_nano),
    train_config=nano_train_config,
    # wandb tags
    tags=["llama", "nano", "tinystories", "tutorial"],
    # no eval harness tasks in the loop: there's no point on such a tiny model
    eval_harness_tasks=[],
    # to keep the tutorial fast, skip default validation sets
    use_default_validation=False,
)

if __name__ == "__main__":
    executor_main(
        steps=[
            nano_tinystories_model,
        ]
    )
