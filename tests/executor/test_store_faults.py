"""Object storage faults: transient ones are retried (and logged) and change nothing in the
outputs; permanent ones fail at once with one line naming the bucket and the setting; a
step killed mid-write leaves nothing a later run takes for finished.

The experiments run as real scripts in subprocesses (`executor_main`, the CLI a researcher
runs) against SeaweedFS and fake-gcs-server on 127.0.0.1. Faults come from
`tests.fault_proxy.FaultProxy`, an HTTP proxy between the clients and the server that
fails a share of requests with 503, 429 or a connection reset -- the executor's own
requests and the step functions' alike, in the driver and in the data steps' workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest

from executor import retry
from executor.store import StoreError, open_store
from tests.fault_proxy import FaultProxy
from tests.operations.servers import free_port
from tests.waiting import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXPERIMENT = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, sys.argv.pop(1))
    import fsspec
    from dataclasses import dataclass
    from executor import ExecutorStep, executor_main, output_path_of, this_output_path, versioned
    from tests.executor.steps_for_tests import WriteConfig, write_value

    a = ExecutorStep("faults/a", write_value, WriteConfig(this_output_path(), versioned(1), key="a"))
    b = ExecutorStep(
        "faults/b", write_value, WriteConfig(this_output_path(), versioned(2), [output_path_of(a)], key="b")
    )
    steps = [b]
    if os.environ.get("FAULTS_DATA"):
        from marin.defaults import default_dedup, default_documents, default_filter, stdlib_download
        from operations.filter import default_code_rules

        raw = stdlib_download(max_files=20)
        filtered = default_filter("faults", default_documents("faults", raw), default_code_rules())
        steps.append(default_dedup("faults", filtered))


    @dataclass(frozen=True)
    class HalfConfig:
        output_path: str
        marker: str


    def write_then_hang(config):
        with fsspec.open(f"{config.output_path}/part-0", "wb") as out:
            out.write(b"complete")
        # A multipart upload (5 MiB parts): one part sent, then the process is killed.
        fs, path = fsspec.core.url_to_fs(f"{config.output_path}/part-1")
        with fs.open(path, "wb", block_size=5 * 2**20) as out:
            out.write(b"x" * (6 * 2**20))
            out.flush()
            open(config.marker, "w").close()
            if os.environ.get("FAULTS_HANG"):
                time.sleep(3600)


    if os.environ.get("FAULTS_HALF"):
        steps = [ExecutorStep("faults/half", write_then_hang, HalfConfig(this_output_path(), os.environ["FAULTS_HALF"]))]
    executor_main(steps=steps)
    """
)

BOOKKEEPING = (".executor_status", ".executor_info", ".executor_log", ".executor_status.lock", ".plan.json")
"""Files whose bytes differ between two prefixes whatever the faults: the executor's own
(times, worker ids), and documents' `.plan.json` (digests of chunk descriptors that name
the input's full path)."""


@pytest.fixture
def experiment(tmp_path) -> str:
    path = tmp_path / "faults_experiment.py"
    path.write_text(EXPERIMENT)
    return str(path)


def run_experiment(script: str, prefix: str, env: dict[str, str], *flags: str, timeout: float = 300):
    return subprocess.run(
        [sys.executable, script, REPO, "--prefix", prefix, *flags],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def step_outputs(fs, prefix: str) -> dict[str, bytes]:
    """Every object the steps wrote under `prefix` (relative key -> bytes, the prefix in
    them replaced by `<prefix>`: a few record their input paths), without the executor's
    bookkeeping (times, worker ids) and the run's manifest."""
    root = fs._strip_protocol(prefix).rstrip("/")
    out = {}
    for key in fs.find(root):
        relative = key[len(root) + 1 :]
        if relative.startswith("experiments/") or relative.rsplit("/", 1)[-1] in BOOKKEEPING:
            continue
        out[relative] = fs.cat_file(key).replace(root.encode(), b"<prefix>")
    return out


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# -- transient faults ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("store", ["s3", "gs"])
def test_a_run_with_ten_percent_of_requests_failing_matches_a_clean_run(store, experiment, request):
    if store == "s3":
        server = request.getfixturevalue("s3_server")
        clean_env = server.env
        flavor = "s3"
    else:
        server = request.getfixturevalue("gcs_server")
        clean_env = server.env
        flavor = "gcs"
    clean, faulty = server.new_prefix(), server.new_prefix()
    data = {"FAULTS_DATA": "1"}
    done = run_experiment(experiment, clean, {**clean_env, **data})
    assert done.returncode == 0, done.stderr[-3000:]

    with FaultProxy(server.endpoint_url, fault_rate=0.1, seed=11, flavor=flavor) as proxy:
        proxied = {"AWS_ENDPOINT_URL": proxy.url} if store == "s3" else {"STORAGE_EMULATOR_HOST": proxy.url}
        done = run_experiment(experiment, faulty, {**clean_env, **proxied, **data})
        assert done.returncode == 0, done.stderr[-3000:]
        assert "6 ran, 0 cached, 0 failed" in done.stdout
        faults = sum(proxy.faults.values())
        assert faults >= 10, f"too few faults to mean anything: {dict(proxy.faults)}"
        retries = [line for line in done.stderr.splitlines() if "executor.retry: storage:" in line]
        assert len(retries) >= faults // 2, f"{faults} faults, {len(retries)} retry lines logged"

        # Faults on a cached re-run too: every step is skipped, nothing is written.
        proxy.fault_rate = 0.3
        again = run_experiment(experiment, faulty, {**clean_env, **proxied, **data})
        assert again.returncode == 0, again.stderr[-3000:]
        assert "0 ran, 6 cached, 0 failed" in again.stdout

    fs = server.filesystem()
    clean_files, faulty_files = step_outputs(fs, clean), step_outputs(fs, faulty)
    assert any(name.endswith(".jsonl.gz") for name in clean_files)
    assert sorted(faulty_files) == sorted(clean_files)
    assert [name for name in clean_files if faulty_files[name] != clean_files[name]] == []


def test_the_store_retries_a_transient_error_the_client_gave_up_on(s3_server, monkeypatch, caplog):
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(retry.ATTEMPTS_ENV, "3")
    prefix = s3_server.new_prefix()
    store = open_store(prefix)
    real_cat = store.fs.cat_file
    calls = []

    def flaky_cat(path, *args, **kwargs):
        calls.append(path)
        if len(calls) < 3:
            raise ConnectionResetError(104, "Connection reset by peer")
        return real_cat(path, *args, **kwargs)

    store.write_atomic(f"{prefix}/f", b"data")
    monkeypatch.setattr(store.fs, "cat_file", flaky_cat)
    with caplog.at_level("WARNING", logger="executor.retry"):
        assert store.read_bytes(f"{prefix}/f") == b"data"
    assert len(calls) == 3
    logged = [record.getMessage() for record in caplog.records if record.name == "executor.retry"]
    assert len(logged) == 2 and all(f"read {prefix}/f" in line for line in logged)


def test_retries_stop_at_the_attempt_limit_and_raise_the_last_error():
    policy = retry.RetryPolicy(attempts=3, total_wait_s=60)
    calls = []

    def always_reset():
        calls.append(1)
        raise ConnectionResetError(104, "reset")

    with pytest.raises(ConnectionResetError):
        retry.call("read", "s3://b/k", always_reset, policy=policy, sleep=lambda s: None)
    assert len(calls) == 3


def test_retries_stop_when_the_total_wait_would_pass_its_cap():
    policy = retry.RetryPolicy(attempts=50, total_wait_s=1.0, first_wait_s=0.2, max_wait_s=10)
    waits = []

    def always_reset():
        raise TimeoutError("timed out")

    with pytest.raises(TimeoutError):
        retry.call("read", "s3://b/k", always_reset, policy=policy, sleep=waits.append)
    assert sum(waits) <= 1.0 and len(waits) < 10


def test_a_permanent_or_unknown_error_is_not_retried():
    calls = []

    def refused():
        calls.append(1)
        raise PermissionError("Forbidden")

    with pytest.raises(PermissionError):
        retry.call("read", "s3://b/k", refused, policy=retry.RetryPolicy(), sleep=lambda s: None)
    assert len(calls) == 1


def test_the_retry_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(retry.ATTEMPTS_ENV, "7")
    monkeypatch.setenv(retry.TOTAL_WAIT_ENV, "2.5")
    assert retry.RetryPolicy.from_env() == retry.RetryPolicy(attempts=7, total_wait_s=2.5)
    monkeypatch.setenv(retry.ATTEMPTS_ENV, "many")
    with pytest.raises(ValueError, match=retry.ATTEMPTS_ENV):
        retry.RetryPolicy.from_env()


# -- permanent errors ----------------------------------------------------------------------


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_missing_s3_bucket_fails_at_once_naming_the_bucket_and_setting(s3_server, experiment, dry_run):
    bucket = f"missing-{uuid.uuid4().hex[:8]}"
    flags = ("--dry_run", "true") if dry_run else ()
    done = run_experiment(experiment, f"s3://{bucket}/x", s3_server.env, *flags, timeout=60)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    [line] = error_lines(done.stderr)
    assert f"S3 bucket {bucket!r}" in line and "does not exist" in line and "AWS_ENDPOINT_URL" in line
    assert not s3_server.filesystem().exists(bucket)  # and nothing created it


@pytest.mark.parametrize(
    "wrong",
    [{"AWS_SECRET_ACCESS_KEY": "wrong-secret"}, {"AWS_ACCESS_KEY_ID": "nobody"}],
    ids=["secret", "key"],
)
def test_refused_s3_credentials_fail_at_once_naming_the_bucket_and_settings(s3_server, experiment, wrong):
    done = run_experiment(experiment, s3_server.new_prefix(), {**s3_server.env, **wrong}, timeout=60)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    [line] = error_lines(done.stderr)
    assert "S3 refused the credentials for bucket 'tests'" in line
    assert "AWS_ACCESS_KEY_ID" in line and "AWS_SECRET_ACCESS_KEY" in line


def test_a_missing_gcs_bucket_fails_at_once_naming_the_bucket_and_setting(gcs_server, experiment):
    bucket = f"missing-{uuid.uuid4().hex[:8]}"
    done = run_experiment(experiment, f"gs://{bucket}/x", gcs_server.env, timeout=60)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    [line] = error_lines(done.stderr)
    assert f"GCS bucket {bucket!r}" in line and "does not exist" in line and "STORAGE_EMULATOR_HOST" in line


def test_the_store_names_a_missing_bucket_on_reads_too(s3_server, monkeypatch):
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    store = open_store("s3://no-such-bucket-here/p")
    with pytest.raises(StoreError, match="'no-such-bucket-here' .*does not exist"):
        store.read_bytes("s3://no-such-bucket-here/p/.executor_status")
    with pytest.raises(StoreError, match="AWS_ENDPOINT_URL"):
        store.check_readable("s3://no-such-bucket-here/p")


# -- a step killed mid-write ---------------------------------------------------------------


def test_a_step_killed_mid_write_leaves_no_success_and_no_partial_object(s3_server, experiment, tmp_path):
    prefix = s3_server.new_prefix()
    marker = tmp_path / "writing"
    env = {**s3_server.env, "FAULTS_HALF": str(marker), "FAULTS_HANG": "1"}
    flags = ("--lease_timeout", "3", "--lease_heartbeat", "0.5", "--lease_poll", "0.2")
    driver = subprocess.Popen(
        [sys.executable, experiment, REPO, "--prefix", prefix, *flags],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: marker.exists() or driver.poll() is not None, timeout=120)
        assert driver.poll() is None, "the driver ended before the step was killed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)

    fs = s3_server.filesystem()
    root = fs._strip_protocol(prefix)
    [output] = [path for path in fs.find(root) if path.endswith("/part-0")]
    output = output.rsplit("/", 1)[0]
    status = fs.cat_file(f"{output}/.executor_status").decode()
    assert "SUCCESS" not in status and "RUNNING" in status
    assert not fs.exists(f"{output}/part-1"), "a half-written object is visible under its final name"

    # A later run does not take the step for finished: it runs it again, to the end.
    done = run_experiment(experiment, prefix, {**s3_server.env, "FAULTS_HALF": str(marker)}, *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 ran, 0 cached, 0 failed" in done.stdout
    fs.invalidate_cache()
    assert fs.cat_file(f"{output}/part-1") == b"x" * (6 * 2**20)
    assert fs.cat_file(f"{output}/.executor_status").decode().rstrip().splitlines()[-1].find("SUCCESS") >= 0


@pytest.mark.parametrize("status", [401, 403])
def test_refused_gcs_credentials_fail_at_once_naming_the_bucket_and_setting(gcs_server, experiment, status):
    # fake-gcs-server accepts any token: the proxy answers every request as GCS answers refused
    # credentials (401 authError / 403 forbidden), the only way to see a refusal here.
    with FaultProxy(gcs_server.endpoint_url, flavor="gcs", refuse_credentials=status) as proxy:
        done = run_experiment(
            experiment, gcs_server.new_prefix(), {"STORAGE_EMULATOR_HOST": proxy.url}, timeout=60
        )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    [line] = error_lines(done.stderr)
    assert (
        "GCS refused the credentials for bucket 'tests'" in line and "GOOGLE_APPLICATION_CREDENTIALS" in line
    )
    # At once: the first refused request ends the run; nothing is retried.
    assert len(proxy.log) == 1, proxy.log


@pytest.mark.parametrize("store", ["s3", "gs"])
def test_an_endpoint_nothing_listens_on_fails_with_one_line_naming_the_setting(store, experiment):
    port = free_port()  # nothing listens there
    if store == "s3":
        env = {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "key",
            "AWS_SECRET_ACCESS_KEY": "secret",
            "AWS_REGION": "us-east-1",
        }
        setting, server = "AWS_ENDPOINT_URL", "S3"
    else:
        env, setting, server = (
            {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"},
            "STORAGE_EMULATOR_HOST",
            "GCS",
        )
    done = run_experiment(experiment, f"{store}://tests/x", env, timeout=240)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    [line] = error_lines(done.stderr)
    assert f"cannot connect to the {server} server at http://127.0.0.1:{port} ({setting})" in line
    assert "bucket 'tests'" in line and f"fix {setting}" in line
    # Checked once, before any status read: only the client's own tries, none of ours on top.
    assert "storage: read" not in done.stderr and "retry 1 of" not in done.stderr


def test_an_unreachable_endpoint_mid_run_is_retried_then_named_in_one_line(monkeypatch, caplog):
    port = free_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv(retry.ATTEMPTS_ENV, "2")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    try:
        store = open_store("s3://tests/p")
        with (
            caplog.at_level("WARNING", logger="executor.retry"),
            pytest.raises(StoreError, match=f"cannot connect to the S3 server at http://127.0.0.1:{port}"),
        ):
            store.read_bytes("s3://tests/p/.executor_status")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    # A status read mid-run is retried under the policy (an outage may pass); the probe is not.
    assert [r.getMessage() for r in caplog.records if "retry 1 of 1" in r.getMessage()]


def test_the_unreachable_probe_is_not_retried_under_the_policy():
    calls = []

    def refused():
        calls.append(1)
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(ConnectionRefusedError):
        retry.call(
            "probe",
            "s3://b/k",
            refused,
            policy=retry.RetryPolicy(),
            sleep=lambda s: None,
            retry_unreachable=False,
        )
    assert len(calls) == 1
    with pytest.raises(ConnectionRefusedError):
        retry.call("read", "s3://b/k", refused, policy=retry.RetryPolicy(attempts=3), sleep=lambda s: None)
    assert len(calls) == 1 + 3
