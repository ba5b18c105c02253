"""A fake Hugging Face Hub on 127.0.0.1 that the real `huggingface_hub` client code talks to,
for model repositories (tokenizers) as well as datasets, plus the small repositories the
Marin tutorials' tests serve from it.

`tests.operations.servers.serve_fake_hub` answers what `HfFileSystem` asks for (repo info,
tree listings, `/datasets/.../resolve/...`). `snapshot_download` and `hf_hub_download` --
what fetches a tokenizer -- also need: a model repository's files at `/<org>/<name>/resolve/
<revision>/<path>` (no `models/` prefix), the file list in the repo info (`siblings`), a commit
sha they can ask for files at, and `X-Repo-Commit` / `ETag` headers. `serve_hub` adds those by
extending that handler; nothing is mocked inside the client.

Point a process at it with `HF_ENDPOINT=<url>` (read when huggingface_hub is imported, so
for a subprocess) and `HF_HOME=<tmp>` (its cache); in-process tests can use `hub_env`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import urllib.parse
from collections.abc import Iterator

from tests.operations.servers import _FakeHubHandler, _serve

Repos = dict[tuple[str, str], dict[str, dict[str, bytes]]]


def commit_sha(repo_type: str, repo_id: str, revision: str) -> str:
    """The commit sha the fake Hub gives `revision` of a repository."""
    return hashlib.sha1(f"{repo_type}/{repo_id}@{revision}".encode()).hexdigest()


class _HubHandler(_FakeHubHandler):
    def _revision(
        self, repo: dict[str, dict[str, bytes]], kind: str, repo_id: str, revision: str
    ) -> str | None:
        """The revision name `revision` stands for (a name, or the sha of one)."""
        revision = urllib.parse.unquote(revision)
        if revision in repo:
            return revision
        return next((name for name in repo if commit_sha(kind, repo_id, name) == revision), None)

    def do_GET(self):  # noqa: N802 -- http.server's naming
        url = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(part) for part in url.path.strip("/").split("/")]
        api = parts[0] == "api"
        if api:
            parts = parts[1:]
        if parts and parts[0] not in ("datasets", "models", "spaces"):
            parts = ["models", *parts]  # model repositories' file URLs have no prefix
        if len(parts) < 3:
            return self._missing("RepoNotFound")
        kind, repo_id = parts[0][:-1], f"{parts[1]}/{parts[2]}"
        repo = self.repos.get((kind, repo_id))
        if repo is None:
            return self._missing("RepoNotFound")
        action, rest = (parts[3], parts[4:]) if len(parts) > 3 else ("revision", [])
        revision = self._revision(repo, kind, repo_id, rest[0] if rest else "main")
        if revision is None:
            return self._missing("RevisionNotFound")
        files = repo[revision]
        sha = commit_sha(kind, repo_id, revision)
        path = "/".join(rest[1:])
        if api and action == "revision":
            siblings = [{"rfilename": name} for name in sorted(files)]
            return self._json({"id": repo_id, "sha": sha, "siblings": siblings, "private": False})
        if api and action == "tree":
            query = urllib.parse.parse_qs(url.query)
            return self._tree(files, path, query.get("recursive", ["False"])[0] == "True")
        if not api and action == "resolve" and path in files:
            data = files[path]
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Repo-Commit", sha)
            self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            return None
        return self._missing("EntryNotFound")


@contextlib.contextmanager
def serve_hub(repos: Repos) -> Iterator[str]:
    """Serve `{(repo_type, repo_id): {revision: {path: bytes}}}` as a Hub; yields its URL."""
    handler = type("HubHandler", (_HubHandler,), {"repos": repos})
    with _serve(handler, "test-fake-hub") as url:
        yield url


@contextlib.contextmanager
def hub_env(endpoint: str, cache: str) -> Iterator[None]:
    """In this process: `HF_ENDPOINT` and `HF_HUB_CACHE` for operations.hub (which reads them
    when it runs), restored afterwards. (huggingface_hub itself read them at import.)"""
    saved = {name: os.environ.get(name) for name in ("HF_ENDPOINT", "HF_HUB_CACHE")}
    os.environ.update(HF_ENDPOINT=endpoint, HF_HUB_CACHE=cache)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# ---------------------------------------------------------------------------- content

WORDS = (  # noqa: SIM905 (a word list reads better than 48 quoted items)
    "the a little big red blue cat dog girl boy tree sun moon ball house river bird fish "
    "ran jumped saw found liked played said was happy sad sleepy and then but so very "
    "one day Lily Tom mom dad friend park garden sky rain toy book cake"
).split()


def stories(count: int, seed: int = 0) -> list[str]:
    """`count` short made-up stories (a TinyStories-like text corpus)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "."]
        sentences += [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))) + "." for _ in range(3)]
        out.append(" ".join(sentences))
    return out


CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
)


def tokenizer_files(corpus: list[str], vocab_size: int = 400) -> dict[str, bytes]:
    """A small byte-level BPE tokenizer trained on `corpus`, as the files of a Hub repository
    (tokenizer.json, tokenizer_config.json with a chat template, special_tokens_map.json)."""
    import tempfile
    from pathlib import Path

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],
    )
    fast.chat_template = CHAT_TEMPLATE
    with tempfile.TemporaryDirectory() as directory:
        fast.save_pretrained(directory)
        return {path.name: path.read_bytes() for path in Path(directory).iterdir() if path.is_file()}


def parquet_bytes(records: list[dict]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records), buffer)
    return buffer.getvalue()


def jsonl_bytes(records: list[dict]) -> bytes:
    return "".join(json.dumps(record) + "\n" for record in records).encode()
