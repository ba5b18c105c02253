"""`mirrored()`: a path relative to the prefix, copied there from `$MARIN_MIRROR_SOURCES`
before the step runs (issue 12; see executor/mirror.py)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest

from executor import Executor, ExecutorRunError, ExecutorStep, mirrored, this_output_path, versioned
from executor.graph import resolve
from executor.mirror import SOURCES_VARIABLE
from executor.template import TemplateError, decode_template, encode_template
from tests.conftest import FAST_LEASES
from tests.operations.buckets import new_bucket, storage_environment


@dataclass(frozen=True)
class CountFiles:
    output_path: str
    data: str
    label: str = "count"


def count_files(config: CountFiles) -> None:
    """Records the path the step was given and every file under it with its text."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(config.data)
    files = {path[len(root.rstrip("/")) + 1 :]: fs.cat_file(path).decode() for path in fs.find(root)}
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "seen.json"), "w") as handle:
        json.dump({"data": config.data, "files": files}, handle)


def counting_step(data, name: str = "count") -> ExecutorStep:
    return ExecutorStep(name, count_files, CountFiles(output_path=this_output_path(), data=data))


def write_tree(root, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def seen(executor: Executor, step: ExecutorStep) -> dict:
    with open(os.path.join(executor.output_paths[step], "seen.json")) as handle:
        return json.load(handle)


def run(prefix: str, step: ExecutorStep) -> Executor:
    executor = Executor(prefix, console=False, lease_config=FAST_LEASES)
    executor.run([step])
    return executor


# -- the version and the concrete value --------------------------------------------------------------


def version_hash(data) -> str:
    step = counting_step(data)
    return resolve([step], "/p").resolved(step).version_hash


def test_the_version_looks_through_it_as_in_marin():
    """Only a versioned path enters the hash; the budget never does."""
    assert version_hash(mirrored("raw/a")) == version_hash(mirrored("raw/b"))
    assert version_hash(mirrored("raw/a")) == version_hash(mirrored("raw/a", budget_gb=1))
    assert version_hash(mirrored(versioned("raw/a"))) != version_hash(mirrored(versioned("raw/b")))
    assert version_hash(mirrored(versioned("raw/a"))) == version_hash(
        mirrored(versioned("raw/a"), budget_gb=1)
    )
    assert version_hash(mirrored(versioned("raw/a"))) == version_hash(versioned("raw/a"))


def test_the_step_sees_the_path_under_the_prefix():
    step = counting_step(mirrored("raw/corpus/"))
    resolved = resolve([step], "gs://bucket/marin").resolved(step)
    assert resolved.config.data == "gs://bucket/marin/raw/corpus"
    (mirror,) = resolved.mirrors
    assert (mirror.field, mirror.relative_path, mirror.budget_gb) == ("data", "raw/corpus", 10.0)


@pytest.mark.parametrize("bad", ["/abs/path", "gs://bucket/x", "a/../b", "./a", "", "a//b", 3, None])
def test_a_path_that_is_not_relative_to_the_prefix_is_refused(bad):
    with pytest.raises(ValueError, match="mirrored"):
        mirrored(bad)


@pytest.mark.parametrize("budget", [0, -1, float("inf"), float("nan"), "10", True])
def test_a_budget_that_is_not_a_positive_number_is_refused(budget):
    with pytest.raises(ValueError, match="budget_gb must be a positive number"):
        mirrored("raw/x", budget_gb=budget)


def test_versioned_of_a_mirrored_value_is_refused():
    with pytest.raises(ValueError, match="versioned"):
        resolve([counting_step(versioned(mirrored("raw/x")))], "/p")


def test_the_recipe_keeps_it_and_an_edited_recipe_cannot_escape_the_prefix():
    """`marin reproduce` rebuilds configs from `config_template`; the tree is untrusted."""
    value = mirrored(versioned("raw/x"), budget_gb=2)
    record = encode_template(value, lambda step: "")
    assert decode_template(record, lambda path: None) == value
    record["__mirrored__"] = {"__versioned__": "../../etc"}
    with pytest.raises(TemplateError, match="relative to the prefix"):
        decode_template(record, lambda path: None)


# -- copying ---------------------------------------------------------------------------------------


def test_a_missing_path_is_copied_from_the_first_source_holding_it(tmp_path, monkeypatch, capsys):
    empty, source, prefix = tmp_path / "empty", tmp_path / "source", str(tmp_path / "prefix")
    empty.mkdir()
    write_tree(source, {"raw/corpus/a.txt": "alpha", "raw/corpus/sub/b.txt": "beta", "raw/other.txt": "x"})
    monkeypatch.setenv(SOURCES_VARIABLE, f"{empty}, {source}")
    step = counting_step(mirrored("raw/corpus"))
    executor = run(prefix, step)
    assert seen(executor, step) == {
        "data": f"{prefix}/raw/corpus",
        "files": {"a.txt": "alpha", "sub/b.txt": "beta"},
    }
    assert not os.path.exists(f"{prefix}/raw/other.txt")  # only the mirrored path
    assert "copied 2 file(s), 9 bytes" in capsys.readouterr().out
    assert not [name for name in os.listdir(f"{prefix}/raw/corpus") if ".mirror-" in name]


def test_a_single_file_is_mirrored_too(tmp_path, monkeypatch):
    source, prefix = tmp_path / "source", str(tmp_path / "prefix")
    write_tree(source, {"raw/one.txt": "only"})
    monkeypatch.setenv(SOURCES_VARIABLE, str(source))
    run(prefix, counting_step(mirrored("raw/one.txt")))
    with open(f"{prefix}/raw/one.txt") as handle:
        assert handle.read() == "only"


def test_only_missing_or_different_files_are_copied(tmp_path, monkeypatch, capsys):
    """A copy cut short is finished by the next run; a complete one copies nothing."""
    source, prefix = tmp_path / "source", tmp_path / "prefix"
    write_tree(source, {"raw/c/a.txt": "alpha", "raw/c/b.txt": "beta", "raw/c/d.txt": "delta"})
    write_tree(prefix, {"raw/c/a.txt": "alpha", "raw/c/b.txt": "be"})  # b cut short, d missing
    monkeypatch.setenv(SOURCES_VARIABLE, str(source))
    step = counting_step(mirrored("raw/c"))
    executor = run(str(prefix), step)
    assert seen(executor, step)["files"] == {"a.txt": "alpha", "b.txt": "beta", "d.txt": "delta"}
    assert "copied 2 file(s), 9 bytes" in capsys.readouterr().out

    run(str(prefix), counting_step(mirrored("raw/c"), name="again"))
    assert "copied" not in capsys.readouterr().out


def test_a_copy_over_budget_copies_nothing_and_fails_the_step_naming_field_and_budget(tmp_path, monkeypatch):
    source, prefix = tmp_path / "source", str(tmp_path / "prefix")
    write_tree(source, {"raw/big/a.bin": "x" * 600, "raw/big/b.bin": "y" * 600})
    monkeypatch.setenv(SOURCES_VARIABLE, str(source))
    step = counting_step(mirrored("raw/big", budget_gb=1e-6))  # 1,000 bytes
    with pytest.raises(ExecutorRunError) as failure:
        run(prefix, step)
    message = str(failure.value)
    assert "field 'data': mirrored path 'raw/big'" in message
    assert (
        "2 file(s)" in message and "over its budget of 1e-06 GB" in message and "raise budget_gb" in message
    )
    assert not os.path.exists(f"{prefix}/raw/big")


def test_a_path_no_source_holds_fails_before_the_step_starts(tmp_path, monkeypatch):
    monkeypatch.delenv(SOURCES_VARIABLE, raising=False)
    step = counting_step(mirrored("raw/nowhere"))
    with pytest.raises(ExecutorRunError) as failure:
        run(str(tmp_path / "prefix"), step)
    assert "no mirror source holds it" in str(failure.value)
    assert f"${SOURCES_VARIABLE} is not set" in str(failure.value)


def test_a_path_already_under_the_prefix_needs_no_source(tmp_path, monkeypatch):
    prefix = tmp_path / "prefix"
    write_tree(prefix, {"raw/here/a.txt": "local"})
    monkeypatch.delenv(SOURCES_VARIABLE, raising=False)
    step = counting_step(mirrored("raw/here"))
    assert seen(run(str(prefix), step), step)["files"] == {"a.txt": "local"}


@pytest.mark.parametrize("kind", ["s3", "gs"])
def test_a_path_is_mirrored_from_a_bucket(request, tmp_path, monkeypatch, kind):
    """The source is another storage (SeaweedFS, fake-gcs-server), read with the usual variables."""
    bucket = new_bucket(request, kind)
    with storage_environment(monkeypatch, bucket):
        root = bucket.prefix.split("://", 1)[1]
        bucket.fs.pipe({f"{root}/raw/web/part-0.txt": b"zero", f"{root}/raw/web/part-1.txt": b"one"})
        monkeypatch.setenv(SOURCES_VARIABLE, bucket.prefix)
        step = counting_step(mirrored(versioned("raw/web")))
        executor = run(str(tmp_path / "prefix"), step)
        assert seen(executor, step)["files"] == {"part-0.txt": "zero", "part-1.txt": "one"}
