"""What the training and eval outputs record about their run rather than their result.

Set on the step functions as `fn.__run_records__` (the plain-data form of
`executor.run_records`; operations do not import the executor): `marin reproduce` lists these
files and fields instead of comparing them, and compares everything else byte for byte.
"""

TRAIN = {
    "files": [
        "logs/**",  # Levanter's log: timestamps, named by a run id that hashes the output path
        "wandb/**",  # W&B's offline run: timestamped folders, its own logs
        "attempts.json",  # seconds per attempt, where each resumed
    ],
    "fields": {
        "metrics.jsonl": [
            "throughput/duration",
            "throughput/*_time",
            "throughput/*_per_second",
            "eval/*_time",
        ],
        "stats.json": ["run_id", "median_tokens_per_second", "attempts"],
        "checkpoints/*/metadata.json": ["timestamp"],
    },
}
"""operations.train.train: the checkpoints, the HF export, the losses, norms, learning rates and
token counts are compared; wall-clock times, speeds and the run's names are not."""

EVAL = {"fields": {"stats.json": ["seconds"]}}
"""operations.eval.evaluate: results.json is compared whole; stats.json without its seconds."""
