"""Download a dataset: a Hugging Face Hub repository at a pinned revision, or a local path.

    python experiments/tutorials/download_dataset.py                 # writes under ./marin-output
    python experiments/tutorials/download_dataset.py --dry_run true  # the plan only
    HF_ENDPOINT=http://... python experiments/tutorials/download_dataset.py   # another Hub

Marin's tutorial of the same name, ported by changing its imports. The files land under
`<prefix>/raw/deepseek-prover-bench-<hash>/`, with `manifest.json` (path, size and sha256 of
every file) and `stats.json`. The revision is part of the step's version: pin a commit and
the output never changes under you; point at another and it is a new output.

`default_download` takes any other source `operations.download` reads too, e.g.
`default_download("raw/my-corpus", "/data/my-corpus")` (a local directory or glob, http(s),
s3://, gs://); a revision then makes no sense and is refused. `DOWNLOAD_SOURCE=<path>` runs
this script on such a source instead of the Hub repository.
"""

import os

from executor import executor_main
from marin.defaults import default_download

local_source = os.environ.get("DOWNLOAD_SOURCE")

if local_source:
    deepseek_prover_bench = default_download("raw/local-dataset", local_source)
else:
    deepseek_prover_bench = default_download(
        "raw/deepseek-prover-bench", "deepseek-ai/DeepSeek-ProverBench", "3b9f067"
    )

if __name__ == "__main__":
    executor_main(
        steps=[deepseek_prover_bench],
        description="Download the DeepSeek-ProverBench dataset",
    )
