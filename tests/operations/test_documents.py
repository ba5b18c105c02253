"""operations/documents.py: raw files -> document shards, on tiny trees made in each test."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
import sysconfig
import uuid
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from operations.documents import DocumentsConfig, make_documents
from operations.shards import iter_documents, list_shards, read_documents

ARTICLE = "Use water at about eighty degrees and steep it for two minutes; longer makes it bitter."
PAGE = f"""<!doctype html><html><head><title>Tea notes</title></head><body>
<nav><ul><li><a href="/">Home</a></li><li><a href="/shop">Shop our teas</a></li></ul></nav>
<article><h1>Brewing green tea</h1><p>{ARTICLE}</p>
<p>Good leaves can be steeped three times, a little longer each time.</p></article>
<footer>Copyright 2024 Example Tea Company. All rights reserved.</footer></body></html>"""


def make_raw_tree(root: Path) -> Path:
    """One file of each kind, plus the files the operation must ignore or count."""
    (root / "code").mkdir(parents=True)
    (root / "notes.txt").write_text("hello world\n")
    (root / "code" / "hello.py").write_text("print('hi')\n")
    (root / "records.jsonl").write_text(
        '{"text": "first record", "url": "https://a.example"}\n'
        "{not json\n"
        "\n"
        '{"text": "second record", "lang": "en"}\n'
    )
    (root / "list.json").write_text(json.dumps([{"text": "alpha", "n": 1}, {"text": "beta", "n": 2}]))
    pq.write_table(pa.table({"text": ["row zero", "row one"], "score": [0.5, 1.5]}), root / "table.parquet")
    (root / "page.html").write_text(PAGE)
    (root / "empty.txt").write_text("  \n")
    (root / "latin1.txt").write_bytes("café au lait".encode("latin-1"))
    # Ignored: hidden files and the download operation's bookkeeping.
    (root / ".hidden.txt").write_text("not corpus text")
    (root / "manifest.json").write_text("{}")
    (root / "stats.json").write_text("{}")
    # Unsupported: counted, not read.
    (root / "image.png").write_bytes(b"\x89PNG\r\n")
    return root


def doc(id: str, text: str, **metadata) -> dict:
    return {"id": id, "text": text, "source": "raw", "metadata": metadata}


def config(input_path, output_path, **overrides) -> DocumentsConfig:
    return DocumentsConfig(
        input_path=str(input_path), output_path=str(output_path), **{"workers": 1, **overrides}
    )


def read_stats(output: Path) -> dict:
    return json.loads((output / "stats.json").read_text())


def test_each_reader_gives_exact_documents_and_counters(tmp_path):
    raw = make_raw_tree(tmp_path / "raw")
    out = tmp_path / "out"
    make_documents(config(raw, out, max_error_fraction=0.3))

    documents = list(iter_documents(str(out)))
    page = next(d for d in documents if d["id"] == "page.html")
    assert ARTICLE in page["text"] and "Brewing green tea" in page["text"]
    assert "Shop our teas" not in page["text"] and "Copyright" not in page["text"]
    assert documents == [
        doc("code/hello.py", "print('hi')\n", path="code/hello.py", reader="text"),
        doc("list.json:0", "alpha", path="list.json", reader="json", row=0, n=1),
        doc("list.json:1", "beta", path="list.json", reader="json", row=1, n=2),
        doc("notes.txt", "hello world\n", path="notes.txt", reader="text"),
        doc("page.html", page["text"], path="page.html", reader="html", title="Tea notes"),
        doc(
            "records.jsonl:1",
            "first record",
            path="records.jsonl",
            reader="jsonl",
            line=1,
            url="https://a.example",
        ),
        doc("records.jsonl:4", "second record", path="records.jsonl", reader="jsonl", line=4, lang="en"),
        doc("table.parquet:0", "row zero", path="table.parquet", reader="parquet", row=0, score=0.5),
        doc("table.parquet:1", "row one", path="table.parquet", reader="parquet", row=1, score=1.5),
    ]

    stats = read_stats(out)
    assert stats["files"] == 8
    assert stats["files_by_reader"] == {"text": 4, "json": 1, "jsonl": 1, "parquet": 1, "html": 1}
    assert stats["documents"] == 9
    assert stats["errors"] == {"empty": 1, "malformed_json": 1, "non_utf8": 1}
    assert stats["error_examples"] == {
        "empty": ["empty.txt"],
        "malformed_json": ["records.jsonl:2"],
        "non_utf8": ["latin1.txt"],
    }
    assert (stats["error_count"], stats["inputs"], stats["error_fraction"]) == (3, 12, 0.25)
    assert stats["ignored_files"] == 3
    assert stats["unsupported_files"] == {"count": 1, "by_extension": {".png": 1}, "examples": ["image.png"]}
    assert stats["input_bytes"] == sum(
        (raw / p).stat().st_size
        for p in ["code/hello.py", "empty.txt", "latin1.txt", "list.json", "notes.txt", "page.html"]
        + ["records.jsonl", "table.parquet"]
    )
    assert "error" not in stats


def test_encoding_errors_replace_keeps_non_utf8_files(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "latin1.txt").write_bytes("café".encode("latin-1"))
    make_documents(config(raw, tmp_path / "out", encoding_errors="replace"))
    assert [d["text"] for d in iter_documents(str(tmp_path / "out"))] == ["caf\ufffd"]
    stats = read_stats(tmp_path / "out")
    assert stats["errors"] == {} and stats["replaced_non_utf8"] == 1


def test_small_shards_split_the_sorted_files_in_order(tmp_path):
    raw = make_raw_tree(tmp_path / "raw")
    make_documents(config(raw, tmp_path / "one", max_error_fraction=0.3))
    make_documents(config(raw, tmp_path / "many", max_error_fraction=0.3, target_shard_bytes=100))

    shards = list_shards(str(tmp_path / "many"))
    assert len(shards) > 3
    assert len(list_shards(str(tmp_path / "one"))) == 1
    many = list(iter_documents(str(tmp_path / "many")))
    assert many == list(iter_documents(str(tmp_path / "one")))
    assert [d["id"] for d in many] == sorted(d["id"] for d in many)
    assert read_stats(tmp_path / "many")["shards"] == len(shards)


def test_identical_input_gives_byte_identical_output(tmp_path):
    raw = make_raw_tree(tmp_path / "raw")
    for name in ("a", "b"):
        # Two worker processes: the parallel path must not change a byte either.
        make_documents(
            config(raw, tmp_path / name, max_error_fraction=0.3, target_shard_bytes=300, workers=2)
        )
    names = sorted(p.name for p in (tmp_path / "a").iterdir() if not p.name.startswith("."))
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir() if not p.name.startswith("."))
    assert "stats.json" in names and len(names) > 2
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_rerun_recomputes_only_the_missing_shard(tmp_path):
    raw = make_raw_tree(tmp_path / "raw")
    out = tmp_path / "out"
    settings = dict(max_error_fraction=0.3, target_shard_bytes=100)
    make_documents(config(raw, out, **settings))
    shards = [Path(s) for s in list_shards(str(out))]
    before = {s.name: s.read_bytes() for s in shards}
    stats_before = read_stats(out)
    for shard in shards:
        os.utime(shard, ns=(0, 0))  # a shard written again gets a fresh mtime

    lost = shards[1]
    lost.unlink()
    (out / ".shard_stats" / f"{lost.name}.json").unlink()
    make_documents(config(raw, out, **settings))

    assert lost.exists() and lost.read_bytes() == before[lost.name]
    rewritten = [s.name for s in shards if s.stat().st_mtime_ns != 0]
    assert rewritten == [lost.name]
    assert read_stats(out) == stats_before


def test_too_many_errors_fail_after_writing_stats_and_fail_again_on_rerun(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "good.txt").write_text("some text")
    (raw / "empty.txt").write_text("")
    (raw / "latin1.txt").write_bytes("café".encode("latin-1"))
    out = tmp_path / "out"

    with pytest.raises(ValueError) as failure:
        make_documents(config(raw, out))
    message = str(failure.value)
    for part in ["2 of 3 inputs", "0.667", "max_error_fraction=0.1", "empty.txt", "latin1.txt", "non_utf8"]:
        assert part in message, part
    stats = read_stats(out)
    assert stats["error"] == message and stats["errors"] == {"empty": 1, "non_utf8": 1}

    # The shards were kept, but a re-run reaches the same verdict instead of a success.
    with pytest.raises(ValueError) as again:
        make_documents(config(raw, out))
    assert str(again.value) == message


def test_zstd_output_is_readable_by_read_documents(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.md").write_text("# Title\n\nbody\n")
    make_documents(config(raw, tmp_path / "out", compression="zstd"))
    [shard] = list_shards(str(tmp_path / "out"))
    assert shard.endswith("shard-00000.jsonl.zst")
    assert [d["text"] for d in read_documents(shard)] == ["# Title\n\nbody\n"]


def test_compressed_json_lines_and_json_lines_named_json(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    with gzip.open(raw / "a.jsonl.gz", "wt") as handle:
        handle.write('{"content": "zipped", "text": "not this one"}\n')
    (raw / "b.json").write_text('{"content": "one"}\n{"content": "two"}\n')
    (raw / "c.json").write_text('{"content": "single", "tags": ["x"]}')
    make_documents(config(raw, tmp_path / "out", text_field="content", source="mixed"))
    assert [(d["id"], d["text"], d["source"]) for d in iter_documents(str(tmp_path / "out"))] == [
        ("a.jsonl.gz:1", "zipped", "mixed"),
        ("b.json:1", "one", "mixed"),
        ("b.json:2", "two", "mixed"),
        ("c.json", "single", "mixed"),
    ]
    first = next(iter_documents(str(tmp_path / "out")))
    assert first["metadata"] == {"path": "a.jsonl.gz", "reader": "jsonl", "line": 1, "text": "not this one"}


def test_records_without_the_text_field_are_counted(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.jsonl").write_text('{"body": "x"}\n[1, 2]\n{"text": ""}\n{"text": "ok"}\n')
    make_documents(config(raw, tmp_path / "out", max_error_fraction=1.0))
    stats = read_stats(tmp_path / "out")
    assert stats["errors"] == {"missing_text": 2, "empty": 1}
    assert stats["error_examples"]["missing_text"] == ["a.jsonl:1", "a.jsonl:2"]
    assert stats["documents"] == 1


def test_corrupt_files_are_counted_as_unreadable(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    (raw / "cut.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a"}\n' * 100)[:40])
    (raw / "fine.txt").write_text("fine")
    make_documents(config(raw, tmp_path / "out", max_error_fraction=1.0))
    stats = read_stats(tmp_path / "out")
    assert stats["errors"] == {"unreadable": 2}
    assert stats["error_examples"] == {"unreadable": ["broken.parquet", "cut.jsonl.gz"]}
    # What decompressed before the cut is kept (and counted); the rest of the file is the error.
    ids = [d["id"] for d in iter_documents(str(tmp_path / "out"))]
    assert ids[-1] == "fine.txt" and all(i.startswith("cut.jsonl.gz:") for i in ids[:-1])
    assert stats["documents"] == len(ids)


def test_glob_input_and_include_exclude_patterns(tmp_path):
    raw = make_raw_tree(tmp_path / "raw")
    (raw / "code" / "skip_me.py").write_text("x = 1\n")
    make_documents(config(f"{raw}/**/*.py", tmp_path / "glob"))
    assert [d["id"] for d in iter_documents(str(tmp_path / "glob"))] == ["code/hello.py", "code/skip_me.py"]

    make_documents(
        config(
            raw,
            tmp_path / "filtered",
            include=("*.py", "*.txt"),
            exclude=("*skip*", "latin1*"),
            max_error_fraction=0.5,
        )
    )
    assert [d["id"] for d in iter_documents(str(tmp_path / "filtered"))] == ["code/hello.py", "notes.txt"]
    stats = read_stats(tmp_path / "filtered")
    assert stats["excluded_files"] == 7 and stats["errors"] == {"empty": 1}


def test_changed_input_listing_is_refused_instead_of_mixing_shards(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.txt").write_text("a")
    make_documents(config(raw, tmp_path / "out"))
    (raw / "b.txt").write_text("b")
    with pytest.raises(ValueError, match="different file listing"):
        make_documents(config(raw, tmp_path / "out"))


def test_fsspec_urls_for_input_and_output(tmp_path):
    base = f"memory://documents-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    fs.pipe(f"{base}/raw/doc.txt", b"from memory")
    fs.pipe(f"{base}/raw/.hidden", b"skip")
    make_documents(config(f"{base}/raw", f"{base}/out"))
    assert [(d["id"], d["text"], d["source"]) for d in iter_documents(f"{base}/out")] == [
        ("doc.txt", "from memory", "raw")
    ]
    assert json.loads(fs.cat(f"{base}/out/stats.json"))["documents"] == 1


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("compression", "lz4", "DocumentsConfig.compression"),
        ("encoding_errors", "ignore", "DocumentsConfig.encoding_errors"),
        ("readers", {".txt": "pdf"}, "DocumentsConfig.readers"),
        ("max_error_fraction", 2.0, "DocumentsConfig.max_error_fraction"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, field, value, words):
    with pytest.raises(ValueError, match=words):
        make_documents(config(tmp_path, tmp_path / "out", **{field: value}))


@pytest.mark.skipif(importlib.util.find_spec("trafilatura") is not None, reason="trafilatura is installed")
def test_trafilatura_when_missing_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="html_extractor.*trafilatura.*not installed"):
        make_documents(config(tmp_path, tmp_path / "out", html_extractor="trafilatura"))


def test_no_readable_files_is_a_clear_error(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.bin").write_bytes(b"\0")
    with pytest.raises(ValueError, match=r"has a reader.*\.bin"):
        make_documents(config(raw, tmp_path / "out"))


def test_a_copy_of_part_of_the_standard_library(tmp_path):
    stdlib = Path(sysconfig.get_path("stdlib"))
    raw = tmp_path / "stdlib"
    shutil.copytree(stdlib / "json", raw / "json", ignore=shutil.ignore_patterns("__pycache__"))
    # Intentionally non-UTF-8 modules (latin-1, koi8-r): counted, never a crash.
    shutil.copytree(
        stdlib / "test" / "encoded_modules",
        raw / "test" / "encoded_modules",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    expected_texts, empty, non_utf8 = {}, 0, 0
    for path in sorted(raw.rglob("*.py")):
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            non_utf8 += 1
            continue
        if text.strip():
            expected_texts[path.relative_to(raw).as_posix()] = text
        else:
            empty += 1
    assert non_utf8 >= 1

    make_documents(config(raw, tmp_path / "out", include=("*.py",), max_error_fraction=0.5, workers=2))
    documents = list(iter_documents(str(tmp_path / "out")))
    assert {d["id"]: d["text"] for d in documents} == expected_texts
    assert all(d["source"] == "stdlib" for d in documents)
    stats = read_stats(tmp_path / "out")
    assert stats["errors"] == {k: v for k, v in {"empty": empty, "non_utf8": non_utf8}.items() if v}
    assert stats["input_bytes"] == sum(os.path.getsize(p) for p in raw.rglob("*.py"))
