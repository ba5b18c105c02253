"""operations.buckets: tensorstore specs from the standard variables, staging and input copies.

Fast tests with no server (the end-to-end runs on SeaweedFS and fake-gcs-server are in
test_buckets_end_to_end.py).
"""

import os
import tempfile

import fsspec
import pytest

from operations import buckets

STORAGE_VARIABLES = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "STORAGE_EMULATOR_HOST",
    "TENSORSTORE_GCS_HTTP_URL",
)


@pytest.fixture
def clean_env(monkeypatch):
    for name in STORAGE_VARIABLES:
        # Set, then delete: the variable's state now is what is restored, even if `configure`
        # sets it later (monkeypatch records nothing for deleting an absent variable).
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


def test_s3_paths_get_an_s3_kvstore_with_endpoint_region_and_credentials_from_the_environment(clean_env):
    from jax.experimental.array_serialization import serialization, tensorstore_impl

    clean_env.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    clean_env.setenv("AWS_REGION", "eu-west-1")
    clean_env.setenv("AWS_ACCESS_KEY_ID", "key")
    clean_env.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    buckets.configure()
    expected = {
        "driver": "s3",
        "bucket": "bkt",
        "path": "run/checkpoints/step-4/model/w",
        "endpoint": "http://127.0.0.1:9000",
        "aws_region": "eu-west-1",
        "aws_credentials": {"type": "environment"},
    }
    # What Levanter's cache (ser.get_tensorstore_spec) and its checkpointer reach.
    spec = serialization.get_tensorstore_spec("s3://bkt/run/checkpoints/step-4/model/w")
    assert spec["kvstore"] == expected and spec["driver"] == "zarr"
    ocdbt = tensorstore_impl.get_tensorstore_spec("s3://bkt/run/checkpoints/step-4/model/w")
    assert ocdbt["kvstore"]["base"] == {**expected, "path": "run/checkpoints/step-4/model"}
    assert ocdbt["kvstore"]["path"] == "w"


def test_s3_specs_name_only_what_is_set(clean_env):
    from jax.experimental.array_serialization import serialization

    buckets.configure()
    assert serialization.get_tensorstore_spec("s3://bkt/a/b")["kvstore"] == {
        "driver": "s3",
        "bucket": "bkt",
        "path": "a/b",
    }
    clean_env.setenv("AWS_DEFAULT_REGION", "us-east-2")
    clean_env.setenv("AWS_ENDPOINT_URL", "http://general")
    clean_env.setenv("AWS_ENDPOINT_URL_S3", "http://s3-only")  # the service's own wins, as in the AWS SDKs
    assert buckets.s3_kvstore_options() == {"endpoint": "http://s3-only", "aws_region": "us-east-2"}


def test_gs_and_local_paths_keep_jaxs_specs(clean_env, tmp_path):
    from jax.experimental.array_serialization import serialization

    buckets.configure()
    assert serialization.get_tensorstore_spec("gs://bkt/a/b")["kvstore"] == {
        "driver": "gcs",
        "bucket": "bkt",
        "path": "a/b",
    }
    local = serialization.get_tensorstore_spec(str(tmp_path / "a"))["kvstore"]
    assert local == {"driver": "file", "path": str(tmp_path / "a")}


def test_configure_is_idempotent(clean_env):
    from jax.experimental.array_serialization import tensorstore_impl

    buckets.configure()
    wrapped = tensorstore_impl.get_tensorstore_spec
    buckets.configure()
    assert tensorstore_impl.get_tensorstore_spec is wrapped


def test_the_gcs_emulator_variable_reaches_tensorstore_and_fsspec(clean_env):
    clean_env.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    clean_env.setitem(fsspec.config.conf, "gs", {})
    clean_env.setitem(fsspec.config.conf, "gcs", {})
    buckets.configure()
    assert os.environ["TENSORSTORE_GCS_HTTP_URL"] == "http://127.0.0.1:4443"
    assert fsspec.config.conf["gs"] == {"token": "anon"}
    # A value the user set is kept.
    clean_env.setenv("TENSORSTORE_GCS_HTTP_URL", "http://elsewhere")
    buckets.configure()
    assert os.environ["TENSORSTORE_GCS_HTTP_URL"] == "http://elsewhere"


def test_the_ray_cache_builder_is_refused_only_for_s3():
    assert "s3://" in buckets.ray_builder_problem("s3://bkt/tokenized")
    assert buckets.ray_builder_problem("gs://bkt/tokenized") is None
    assert buckets.ray_builder_problem("/data/tokenized") is None


def test_staging_for_a_local_destination_is_the_destination(tmp_path):
    with buckets.local_staging(str(tmp_path / "out"), "train") as local:
        assert local == str(tmp_path / "out") and os.path.isdir(local)


def test_staging_for_a_url_uploads_its_files_skipping_links_and_removes_itself(tmp_path):
    destination = f"memory://staging-{tmp_path.name}/run"
    fsspec.filesystem("memory").pipe(f"{destination}/logs/run.log", b"first attempt\n")
    with buckets.local_staging(destination, "train", preload=("logs",)) as local:
        assert os.path.dirname(local) == tempfile.gettempdir()
        assert os.path.basename(local).startswith("marin-staging-train-")
        with open(os.path.join(local, "logs", "run.log"), "a") as handle:  # appended, not replaced
            handle.write("second attempt\n")
        os.makedirs(os.path.join(local, "wandb", "offline-run-1"))
        with open(os.path.join(local, "wandb", "offline-run-1", "run-1.wandb"), "wb") as handle:
            handle.write(b"events")
        os.symlink(os.path.join(local, "wandb", "offline-run-1"), os.path.join(local, "wandb", "latest-run"))
        os.symlink("missing-file", os.path.join(local, "wandb", "debug.log"))
    assert not os.path.exists(local)
    fs = fsspec.filesystem("memory")
    assert fs.cat(f"{destination}/logs/run.log") == b"first attempt\nsecond attempt\n"
    assert fs.cat(f"{destination}/wandb/offline-run-1/run-1.wandb") == b"events"
    assert not fs.exists(f"{destination}/wandb/debug.log") and not fs.exists(
        f"{destination}/wandb/latest-run"
    )


def test_staging_uploads_what_was_written_before_an_error(tmp_path):
    destination = f"memory://staging-error-{tmp_path.name}/run"
    with (
        pytest.raises(RuntimeError, match="training failed"),
        buckets.local_staging(destination, "train") as local,
    ):
        with open(os.path.join(local, "train.log"), "w") as handle:
            handle.write("the story\n")
        raise RuntimeError("training failed")
    assert fsspec.filesystem("memory").cat(f"{destination}/train.log") == b"the story\n"


def test_an_input_directory_on_a_url_is_copied_once_without_weights(tmp_path):
    source = f"memory://inputs-{tmp_path.name}/tokenizer"
    fs = fsspec.filesystem("memory")
    fs.pipe(f"{source}/tokenizer.json", b"{}")
    fs.pipe(f"{source}/sub/extra.txt", b"x")
    fs.pipe(f"{source}/model.safetensors", b"weights")
    local = buckets.local_input_copy(source)
    assert sorted(
        os.path.relpath(os.path.join(d, f), local) for d, _, fs_ in os.walk(local) for f in fs_
    ) == [
        "sub/extra.txt",
        "tokenizer.json",
    ]
    assert buckets.local_input_copy(source) == local  # once per process
    with pytest.raises(FileNotFoundError, match="no files there"):
        buckets.local_input_copy(f"memory://inputs-{tmp_path.name}/missing")


def test_an_input_object_named_with_dot_dot_parts_is_refused_not_written_outside(tmp_path):
    source = f"memory://inputs-evil-{tmp_path.name}/tokenizer"
    fs = fsspec.filesystem("memory")
    fs.pipe(f"{source}/tokenizer.json", b"{}")
    fs.pipe(f"{source}/a/../../../escaped-{tmp_path.name}.txt", b"x")
    with buckets.using_input_copies():
        with pytest.raises(ValueError, match=r"unsafe name"):
            buckets.local_input_copy(source)
        root = buckets._inputs_root
        assert not any(name.startswith(".partial-") for name in os.listdir(root))
    assert not any(f"escaped-{tmp_path.name}" in name for name in os.listdir(tempfile.gettempdir()))


def test_input_copies_are_removed_when_the_last_step_using_them_ends(tmp_path):
    source = f"memory://inputs-scope-{tmp_path.name}/tokenizer"
    fsspec.filesystem("memory").pipe(f"{source}/tokenizer.json", b"{}")
    with buckets.using_input_copies():
        with buckets.using_input_copies():  # another step, e.g. in another driver thread
            local = buckets.local_input_copy(source)
        assert os.path.isfile(os.path.join(local, "tokenizer.json"))
    assert not os.path.exists(local)
    with buckets.using_input_copies():
        again = buckets.local_input_copy(source)
        assert os.path.isfile(os.path.join(again, "tokenizer.json"))  # copied anew
    assert not os.path.exists(again)


def test_staging_preload_refuses_an_object_named_with_dot_dot_parts(tmp_path):
    # local_staging(preload=("logs",)) copies the output's logs/ from the bucket first: the
    # keys there are untrusted like any input's.
    source = f"memory://staging-evil-{tmp_path.name}/run/logs"
    fs = fsspec.filesystem("memory")
    fs.pipe(f"{source}/run.log", b"line\n")
    fs.pipe(f"{source}/a/../../../escaped.txt", b"x")
    local = tmp_path / "staging" / "logs"
    with pytest.raises(ValueError, match=r"unsafe name"):
        buckets.download_directory(source, str(local))
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "staging" / "escaped.txt").exists()
    fs.rm(f"{source}/a/../../../escaped.txt")
    assert buckets.download_directory(source, str(local)) == 1
    assert (local / "run.log").read_bytes() == b"line\n"
