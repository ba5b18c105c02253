"""Bad input and faults on the command line: one `error:` line, the right exit code, nothing left behind.

Each test runs a tiny experiment script in a subprocess, as a user would, and checks that
stderr holds exactly one line starting with `error: ` (no traceback) that names the flag,
URL, file, step or field to fix. Exit codes: 2 for usage errors (flags), 1 for failures.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executor.tree import LeaseRecord

REPO = Path(__file__).resolve().parents[2]

STUDY = '''
"""A tiny study: a -> b, and c on its own. STUDY_MODE adds one kind of trouble."""

import os
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.memory import MemoryFileSystem

from executor import ExecutorStep, executor_main, output_path_of, this_output_path, versioned

MODE = os.environ.get("STUDY_MODE", "")


class FlakyFileSystem(MemoryFileSystem):
    """memory:// failing the way a storage client does once its retries are spent."""

    protocol = "flaky"
    store = {}
    pseudo_dirs = [""]

    @classmethod
    def _strip_protocol(cls, path):
        return MemoryFileSystem._strip_protocol(path.removeprefix("flaky://"))

    def cat_file(self, path, start=None, end=None, **kwargs):
        if MODE == "read_timeout" and path.endswith(".executor_status"):
            raise TimeoutError("read timed out (gave up after 5 retries)")
        return super().cat_file(path, start, end, **kwargs)

    def _open(self, path, mode="rb", **kwargs):
        if MODE == "read_only" and "w" in mode:
            raise PermissionError(13, "Read-only file system", path)
        if MODE == "write_timeout" and "w" in mode and path.endswith(".executor_status"):
            raise TimeoutError("write timed out (gave up after 5 retries)")
        return super()._open(path, mode, **kwargs)

    def ls(self, path, detail=True, **kwargs):
        if MODE == "list_error":
            raise OSError(5, "Input/output error", path)
        return super().ls(path, detail=detail, **kwargs)


fsspec.register_implementation("flaky", FlakyFileSystem, clobber=True)


@dataclass(frozen=True)
class Config:
    output_path: str
    value: Any = 0
    input_path: Any = None
    extra: Any = None


def write(config):
    with fsspec.open(config.output_path + "/done", "w") as handle:
        handle.write(repr(config.value)[:100])


def nested(depth):
    value = 0
    for _ in range(depth):
        value = [value]
    return value


a = ExecutorStep("a", write, Config(this_output_path(), versioned(1)))
b = ExecutorStep("b", write, Config(this_output_path(), versioned(2), output_path_of(a)))
c = ExecutorStep("c", write, Config(this_output_path(), versioned(3)))
steps = [b, c]
if MODE == "deep_versioned":
    steps.append(ExecutorStep("deep", write, Config(this_output_path(), versioned(nested(5000)))))
if MODE == "deep_config":
    steps.append(ExecutorStep("deep", write, Config(this_output_path(), extra=nested(5000))))
if MODE == "large_versioned":
    steps.append(ExecutorStep("large", write, Config(this_output_path(), versioned("x" * 20_000_000))))
if MODE == "bad_name":
    steps.append(ExecutorStep("a/./b", write, Config(this_output_path())))  # the bad line
if MODE == "nested_output":
    steps.append(ExecutorStep(os.environ["STUDY_NESTED_NAME"], write, Config(this_output_path())))
if MODE == "one_step":
    steps = b  # not [b]

if __name__ == "__main__":
    executor_main(steps)
'''


def run_study(
    tmp_path: Path, *args: str, mode: str = "", env: dict | None = None
) -> subprocess.CompletedProcess:
    script = tmp_path / "study.py"
    script.write_text(STUDY)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MARIN_")}
    environ.update({"PYTHONPATH": str(REPO), "STUDY_MODE": mode, **(env or {})})
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def error_line(result: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    """The one `error: ` line on stderr; checks the exit code, no traceback and the fragments."""
    report = f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == code, report
    assert "Traceback" not in result.stderr, report
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, report
    for fragment in fragments:
        assert fragment in result.stderr, f"{fragment!r} missing\n{report}"
    return errors[0]


def only_the_script(tmp_path: Path) -> None:
    """Nothing but the script (and Python's cache) was left in the working directory."""
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["study.py"]


# -- flags --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--max_concurrent", "abc"], ["--max_concurrent", "'abc'", "whole number"]),
        (["--max_concurrent", "1.5"], ["--max_concurrent", "'1.5'"]),
        (["--max_concurrent", "0"], ["--max_concurrent must be at least 1, got 0"]),
        (["--max_concurrent", "-3"], ["--max_concurrent must be at least 1, got -3"]),
        (["--max_concurrent"], ["--max_concurrent", "expected one argument"]),
        (["--run_only", "["], ["--run_only", "invalid regular expression '['"]),
        (["--run_only", '["a", "("]'], ["--run_only", "invalid regular expression '('"]),
        (["--run_only", "[1, 2]"], ["--run_only '[1, 2]'", "JSON list of regexes"]),
        (["--run_only", "[" * 5000 + "]" * 5000], ["--run_only: a JSON list nested too deeply"]),
        (
            ["--run_only", "(" * 5000 + ")" * 5000],
            ["--run_only: invalid regular expression", "nested too deeply"],
        ),
        (["--dry_run", "maybe"], ["--dry_run", "'maybe'", "true or false"]),
        (["--force_run_failed", "perhaps"], ["--force_run_failed", "'perhaps'"]),
        (["--no_such_flag", "1"], ["unrecognized arguments: --no_such_flag 1"]),
        (["--dry_run", "true", "--dry_run", "false"], ["--dry_run given twice: give it once"]),
        (["--run_only", "a", "--run_only=c"], ["--run_only given twice: give it once"]),
        (["--max_con", "2", "--max_concurrent", "3"], ["--max_concurrent given twice: give it once"]),
        (["--lease_timeout", "0"], ["--lease_timeout must be a positive number of seconds"]),
        (["--lease_timeout", "nan"], ["--lease_timeout 'nan' is not a number of seconds"]),  # as MARIN_*
        (["--lease_poll", "soon"], ["--lease_poll", "'soon'", "number of seconds"]),
        (["--lease_poll", "1e300"], ["--lease_poll must be at most 2,592,000 seconds (30 days), got 1e+300"]),
        (
            ["--lease_heartbeat", "90"],
            ["--lease_heartbeat (90s) must be smaller than the default --lease_timeout (60s)"],
        ),
        (
            ["--lease_timeout", "5", "--lease_heartbeat", "5"],
            ["--lease_heartbeat (5s) must be smaller than --lease_timeout (5s)"],
        ),
    ],
)
def test_a_bad_flag_is_one_usage_error_line(tmp_path, args, fragments):
    prefix = tmp_path / "out"
    result = run_study(tmp_path, "--prefix", str(prefix), *args)
    error_line(result, 2, *fragments)
    assert (sorted(prefix.rglob("*")) if prefix.exists() else []) == []


def test_run_only_matching_no_step_is_a_warning_and_runs_nothing(tmp_path):
    """As in Marin: exit 0, one warning naming the pattern and the steps; nothing written."""
    prefix = tmp_path / "out"
    result = run_study(tmp_path, "--prefix", str(prefix), "--run_only", "nothing.*")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "error: " not in result.stderr
    assert "run_only pattern 'nothing.*' matches no step; the steps are: a, b, c" in result.stderr
    assert not any(p.name.startswith(("a-", "b-", "c-")) for p in prefix.rglob("*"))


@pytest.mark.parametrize(
    ("config_file", "fragments"),
    [
        ("max_concurrent: abc\n", ["--max_concurrent", "'abc'"]),
        ("no_such_flag: 1\n", ["`no_such_flag`", "not valid"]),
        ("prefix: [\n", ["cannot read the flags in flags.yaml: ParserError", 'in "flags.yaml", line 2']),
        (None, ["cannot read the flags", "FileNotFoundError", "flags.yaml"]),
    ],
)
def test_a_bad_config_file_is_one_usage_error_line(tmp_path, config_file, fragments):
    if config_file is not None:
        (tmp_path / "flags.yaml").write_text(config_file)
    result = run_study(tmp_path, "--config_path", "flags.yaml", "--dry_run", "true")
    error_line(result, 2, *fragments)


@pytest.mark.parametrize(
    ("config_file", "holds"),
    [
        ("- a\n- b\n", "a list"),
        ("5\n", "the number 5"),
        ("true\n", "the value true"),
        ("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/:/usr/sbin/nologin\n", "text"),  # /etc/passwd
    ],
    ids=["list", "number", "bool", "passwd"],
)
def test_a_config_file_that_is_not_a_mapping_is_one_usage_error_line(tmp_path, config_file, holds):
    """draccus failed inside itself: `AttributeError: 'str' object has no attribute 'copy'`."""
    (tmp_path / "flags.yaml").write_text(config_file)
    result = run_study(tmp_path, "--config_path", "flags.yaml", "--prefix", str(tmp_path / "out"))
    line = error_line(result, 2)
    assert line == (
        f"error: --config_path flags.yaml holds {holds}, not a mapping of flag: value "
        "(one `flag: value` per line, e.g. `prefix: /data/marin`)"
    )
    assert "Error" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("config_file", ["", "\n  \n", "# no flags yet\n", "---\n", "null\n"], ids=repr)
def test_an_empty_config_file_gives_no_flags(tmp_path, config_file):
    """It was `AttributeError: 'NoneType' object has no attribute 'copy'` (or a TypeError)."""
    (tmp_path / "flags.yaml").write_text(config_file)
    prefix = tmp_path / "out"
    for extra in ([], ["--dry_run", "true"]):  # (alone, and with a flag draccus reads)
        result = run_study(tmp_path, "--config_path", "flags.yaml", "--prefix", str(prefix), *extra)
        assert result.returncode == 0, result.stderr
        assert "error" not in result.stderr
    assert sorted(p.name[:2] for p in prefix.iterdir() if p.name != "experiments") == ["a-", "b-", "c-"]


def test_an_empty_json_config_file_gives_no_flags_too(tmp_path):
    (tmp_path / "flags.json").write_text("")
    result = run_study(tmp_path, "--config_path=flags.json", "--dry_run", "true")
    assert result.returncode == 0, result.stderr
    assert "Plan: 3 steps" in result.stdout


@pytest.mark.parametrize("value", ["1_0", "5_0", "1_0.5", "0x10", "1:30", "٥", "True", "null", " ", ".inf"])
@pytest.mark.parametrize("flag", ["--lease_timeout", "--lease_heartbeat", "--lease_poll"])
def test_a_lease_flag_takes_the_numbers_its_variable_takes(flag, value):
    """`--lease_poll 1_0` ran with 10 while `MARIN_LEASE_POLL=1_0` was refused."""
    from executor import main
    from executor.lease import LeaseConfig

    variable = {"--lease_timeout": "MARIN_LEASE_TIMEOUT", "--lease_heartbeat": "MARIN_LEASE_HEARTBEAT"}
    variable = variable.get(flag, "MARIN_LEASE_POLL")
    if value.strip():  # (a blank variable is an unset one; a blank flag is refused as "" was)
        with pytest.raises(ValueError, match=f"^{variable}=.* is not a number of seconds$"):
            LeaseConfig.from_env({variable: value})
    with pytest.raises(main.UsageError) as refused:
        main.parse_flags([flag, value])
    assert str(refused.value) == (
        f"{flag} {value!r} is not a number of seconds: write plain decimal digits, e.g. 60, 0.5 or "
        "1e3 (no underscores), as in MARIN_LEASE_*"
    )


@pytest.mark.parametrize("value", ["010", "1e1", "+10", "10.", "10.0", " 10 "])
def test_a_lease_flag_reads_a_number_as_its_variable_does(value):
    """`010` was 8 (YAML's octal) as a flag and 10 as MARIN_LEASE_POLL."""
    from executor import main
    from executor.lease import LeaseConfig

    assert main.parse_flags(["--lease_poll", value]).lease_poll == 10.0
    assert main.parse_flags(["--lease_poll=" + value]).lease_poll == 10.0
    assert LeaseConfig.from_env({"MARIN_LEASE_POLL": value}).poll_interval == 10.0


@pytest.mark.parametrize("value", ["1_0", "0x10", "0b11", "1:30", "٥", "True", "null", "~"])
@pytest.mark.parametrize("flag", ["--max_concurrent", "--max_retries"])
def test_a_whole_number_flag_takes_plain_decimal_digits_only(flag, value):
    from executor import main

    with pytest.raises(main.UsageError) as refused:
        main.parse_flags([flag, value])
    assert str(refused.value) == (
        f"{flag} {value!r} is not a whole number: write plain decimal digits, e.g. 4 (no underscores)"
    )
    assert main.parse_flags([flag, "010"]) == main.ExecutorMainConfig(**{flag[2:]: 10})  # not octal 8


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--lease_poll", "1_0"], "--lease_poll '1_0' is not a number of seconds"),
        (["--lease_timeout=5_0"], "--lease_timeout '5_0' is not a number of seconds"),
        (["--max_concurrent", "1_0"], "--max_concurrent '1_0' is not a whole number"),
        (["--max_retries", "0x1"], "--max_retries '0x1' is not a whole number"),
    ],
)
def test_a_number_flag_with_underscores_is_one_usage_error_line(tmp_path, args, fragment):
    result = run_study(tmp_path, "--prefix", str(tmp_path / "out"), *args)
    error_line(result, 2, fragment, "no underscores")
    only_the_script(tmp_path)


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"MARIN_LEASE_TIMEOUT": "abc"}, "MARIN_LEASE_TIMEOUT='abc' is not a number of seconds"),
        (
            {"MARIN_LEASE_TIMEOUT": "5_0"},
            "MARIN_LEASE_TIMEOUT='5_0' is not a number of seconds",
        ),  # float(): 50
        ({"MARIN_LEASE_TIMEOUT": "٥٠"}, "is not a number of seconds"),  # Arabic-Indic 50
        ({"MARIN_LEASE_POLL": "1e300"}, "MARIN_LEASE_POLL must be at most 2,592,000 seconds (30 days)"),
        ({"MARIN_LEASE_POLL": "-1"}, "MARIN_LEASE_POLL must be a positive number of seconds, got -1.0"),
        (
            {"MARIN_LEASE_HEARTBEAT": "100"},
            "MARIN_LEASE_HEARTBEAT (100s) must be smaller than the default --lease_timeout (60s)",
        ),
        (
            {"MARIN_LEASE_TIMEOUT": "5"},
            "the default --lease_heartbeat (10s) must be smaller than MARIN_LEASE_TIMEOUT (5s)",
        ),
    ],
)
def test_a_bad_lease_variable_is_one_usage_error_line(tmp_path, env, fragment):
    result = run_study(tmp_path, "--prefix", str(tmp_path / "out"), "--dry_run", "true", env=env)
    error_line(result, 2, fragment)


def _plant_lease(tmp_path: Path, age: float) -> None:
    """A lease on step `a` from a driver whose last heartbeat was `age` seconds ago."""
    result = run_study(tmp_path, "--prefix", str(tmp_path / "out"), "--dry_run", "true")
    output = next(
        line.split("-> ", 1)[1] for line in result.stdout.splitlines() if "-> " in line and "/a-" in line
    )
    os.makedirs(output)
    record = LeaseRecord(worker="elsewhere:1:dead", heartbeat=time.time() - age)
    Path(output, ".executor_status.lock").write_bytes(record.to_bytes())


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--lease_timeout", "2", "--lease_heartbeat", "0.5"], {}),
        ([], {"MARIN_LEASE_TIMEOUT": "2", "MARIN_LEASE_HEARTBEAT": "0.5"}),
        (["--lease_timeout", "2", "--lease_heartbeat", "0.5"], {"MARIN_LEASE_TIMEOUT": "3600"}),  # flags win
    ],
)
def test_the_lease_timeout_from_a_flag_or_the_environment_reaches_the_plan(tmp_path, args, env):
    _plant_lease(tmp_path, age=30)
    default = run_study(tmp_path, "--prefix", str(tmp_path / "out"), "--dry_run", "true")
    assert "running elsewhere: held by elsewhere:1:dead" in default.stdout  # 30 s < 60 s default
    short = run_study(tmp_path, "--prefix", str(tmp_path / "out"), "--dry_run", "true", *args, env=env)
    assert short.returncode == 0, short.stderr
    assert "stale lease of elsewhere:1:dead" in short.stdout


def test_a_short_lease_timeout_takes_a_dead_drivers_step_over_in_a_run(tmp_path):
    _plant_lease(tmp_path, age=30)
    args = ["--prefix", str(tmp_path / "out"), "--lease_timeout", "2", "--lease_heartbeat", "0.5"]
    result = run_study(tmp_path, *args, "--lease_poll", "0.1")
    assert result.returncode == 0, result.stderr
    assert "stale lease of elsewhere:1:dead" in result.stdout  # not "running elsewhere": no wait
    assert "3 ran, 0 cached" in result.stdout


# -- storage ------------------------------------------------------------------------------


def test_an_unknown_storage_scheme_is_a_usage_error_naming_the_url(tmp_path):
    result = run_study(tmp_path, "--prefix", "foo://bucket/out")
    error_line(result, 2, "'foo://bucket/out'", "foo://")
    only_the_script(tmp_path)


@pytest.mark.parametrize("prefix", ["s3://", "gs://", "s3:///out", "gs:////"])
def test_a_url_without_a_bucket_is_a_usage_error_not_a_local_directory(tmp_path, prefix):
    """`s3://` alone became `s3:`: the run wrote everything to a local directory of that name."""
    result = run_study(tmp_path, "--prefix", prefix)
    error_line(result, 2, f"prefix {prefix!r} names no bucket")
    only_the_script(tmp_path)


def test_a_bucket_name_the_s3_client_refuses_is_one_error_line(tmp_path):
    """botocore refuses the name before any request (ParamValidationError, over several lines).

    The endpoint listens (and is never asked anything): one nobody listens on is refused first,
    by the run's connection probe (`retry.refused_endpoint`)."""
    with socket.create_server(("127.0.0.1", 0)) as listening:
        endpoint = f"http://127.0.0.1:{listening.getsockname()[1]}"
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
        result = run_study(tmp_path, "--prefix", "s3://Bad_Bucket!/out", "--dry_run", "true", env=env)
    error_line(result, 1, "s3://Bad_Bucket!/out", "the S3 client refuses it", "check the bucket name")
    only_the_script(tmp_path)


@pytest.mark.parametrize("value", ["", "   "], ids=["empty", "spaces"])
def test_an_empty_marin_prefix_is_a_usage_error_not_the_default_prefix(tmp_path, value):
    """It wrote under ./marin-output, without even the notice a missing prefix gets."""
    result = run_study(tmp_path, env={"MARIN_PREFIX": value})
    error_line(
        result,
        2,
        "MARIN_PREFIX is set but empty: set it to a directory or a URL (s3://bucket/path), "
        "or unset it to use ./marin-output",
    )
    only_the_script(tmp_path)


def test_a_given_prefix_does_not_read_an_empty_marin_prefix(tmp_path):
    result = run_study(tmp_path, "--prefix", str(tmp_path / "out"), env={"MARIN_PREFIX": ""})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out").is_dir()


def test_an_unknown_scheme_in_marin_prefix_is_a_usage_error_too(tmp_path):
    result = run_study(tmp_path, env={"MARIN_PREFIX": "foo://bucket/out"})
    error_line(result, 2, "'foo://bucket/out'")
    only_the_script(tmp_path)


@pytest.mark.parametrize(
    ("mode", "args", "fragments"),
    [
        (
            "read_timeout",
            [],
            ["cannot read flaky://bucket/out/a-", ".executor_status", "TimeoutError", "retries"],
        ),
        ("read_only", [], ["cannot write to the prefix flaky://bucket/out", "PermissionError", "Read-only"]),
        ("list_error", ["--dry_run", "true"], ["cannot read the prefix flaky://bucket/out", "OSError"]),
    ],
)
def test_storage_that_fails_after_its_retries_is_one_error_line(tmp_path, mode, args, fragments):
    result = run_study(tmp_path, "--prefix", "flaky://bucket/out", *args, mode=mode)
    error_line(result, 1, *fragments)
    only_the_script(tmp_path)


def test_storage_failing_in_the_middle_of_a_run_is_one_error_line(tmp_path):
    result = run_study(tmp_path, "--prefix", "flaky://bucket/out", mode="write_timeout")
    error_line(result, 1, "TimeoutError", "write timed out")
    only_the_script(tmp_path)


# -- declarations -------------------------------------------------------------------------


def test_an_invalid_step_name_at_the_top_of_a_script_is_one_line_with_its_place(tmp_path):
    result = run_study(tmp_path, "--prefix", str(tmp_path / "out"), mode="bad_name")
    line = error_line(result, 1, "step name 'a/./b' is invalid", "'.'")
    bad_line = next(i for i, text in enumerate(STUDY.splitlines(), 1) if text.endswith("# the bad line"))
    assert line.startswith(f"error: study.py:{bad_line}: ")
    only_the_script(tmp_path)


def test_one_step_given_instead_of_a_list_is_one_error_line(tmp_path):
    """`executor_main(step)`: iterating the step raised TypeError, with a traceback."""
    result = run_study(tmp_path, "--prefix", str(tmp_path / "out"), mode="one_step")
    error_line(result, 1, "steps must be a list of steps, got ExecutorStep 'b': pass [step]")
    only_the_script(tmp_path)


def test_a_step_writing_inside_another_steps_output_is_one_error_line(tmp_path):
    dry = run_study(tmp_path, "--prefix", str(tmp_path / "out"), "--dry_run", "true")
    a_dir = next(
        line.rsplit("/", 1)[1] for line in dry.stdout.splitlines() if "-> " in line and "/a-" in line
    )
    env = {"STUDY_NESTED_NAME": f"{a_dir}/inner"}
    result = run_study(tmp_path, "--prefix", str(tmp_path / "out"), mode="nested_output", env=env)
    error_line(result, 1, f"step '{a_dir}/inner'", "inside the output of step 'a'")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("mode", "fragments"),
    [
        ("deep_versioned", ["step 'deep'", "field 'value", "nested more than 100 levels deep"]),
        ("deep_config", ["step 'deep'", "config field 'extra", "nested more than 100 levels deep"]),
        ("large_versioned", ["step 'large'", "versioned field 'value'", "over the limit of 1,048,576"]),
    ],
)
def test_a_runaway_config_value_is_one_error_line_naming_step_and_field(tmp_path, mode, fragments):
    result = run_study(tmp_path, "--prefix", str(tmp_path / "out"), mode=mode)
    error_line(result, 1, *fragments)
    assert "RecursionError" not in result.stderr
    assert not (tmp_path / "out").exists()


# -- status files -------------------------------------------------------------------------

CORRUPTIONS = {
    "truncated": b'{"date": "2026-01-01T00:00:00.000Z", "status": "SUCC',
    "not-utf8": b'{"status": "SUCCESS", "message": "\xff\xfe"}\n',
    "directory": None,
}


def _corrupt(status_file: Path, kind: str) -> None:
    status_file.unlink()
    if CORRUPTIONS[kind] is None:
        status_file.mkdir()
        (status_file / "junk").write_text("x")
    else:
        status_file.write_bytes(CORRUPTIONS[kind])


def _status_file_of_a(tmp_path: Path) -> Path:
    prefix = tmp_path / "out"
    result = run_study(tmp_path, "--prefix", str(prefix), "--run_only", "a")
    assert result.returncode == 0, result.stderr
    (a_dir,) = [p for p in prefix.iterdir() if p.name.startswith("a-")]
    return a_dir / ".executor_status"


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))  # every kind, in process: test_bad_status_files.py
def test_an_unreadable_status_file_is_one_error_line_naming_the_file_and_the_fix(tmp_path, kind):
    status_file = _status_file_of_a(tmp_path)
    _corrupt(status_file, kind)
    dry = run_study(tmp_path, "--prefix", str(tmp_path / "out"), "--dry_run", "true")
    error_line(dry, 1, "dry run: 1 step(s) would fail: a;")  # the run would fail: so does its check
    assert f"error   a  cannot read the status file {status_file}" in dry.stdout
    assert "after dependency a has an error" in dry.stdout
    result = run_study(tmp_path, "--prefix", str(tmp_path / "out"))
    error_line(result, 1, f"cannot read the status file {status_file}", "Delete it", "a")
    assert status_file.is_dir() if kind == "directory" else status_file.read_bytes() == CORRUPTIONS[kind]


def _output_of_a(tmp_path: Path, prefix: Path) -> str:
    plan = run_study(tmp_path, "--prefix", str(prefix), "--dry_run", "true")
    return next(line.split("-> ")[1] for line in plan.stdout.splitlines() if f"-> {prefix}/a-" in line)


@pytest.mark.parametrize("below", ["", "/manifests/deeper"])
def test_manifests_inside_a_steps_output_are_a_usage_error(tmp_path, below):
    """It was the run failing (exit 1), naming `executor_info_base_path` but not the flag."""
    prefix = tmp_path / "out"
    base = _output_of_a(tmp_path, prefix) + below
    result = run_study(tmp_path, "--prefix", str(prefix), "--executor_info_base_path", base)
    line = error_line(result, 2)
    assert line.startswith(
        f"error: --executor_info_base_path {base} is inside the output of step 'a' "
        f"({_output_of_a(tmp_path, prefix)}): "
    )
    only_the_script(tmp_path)


@pytest.mark.parametrize("base", ["zz", "zz/", "zz/q"], ids=["directory", "trailing-slash", "deeper"])
def test_a_step_output_inside_the_manifests_directory_is_a_usage_error_naming_both(tmp_path, base):
    """`--executor_info_base_path <prefix>/zz` with a step `zz/q`: the manifests' directory
    held a step's output (the default <prefix>/experiments is refused to every step)."""
    prefix = tmp_path / "out"
    env = {"STUDY_NESTED_NAME": "zz/q/r" if base == "zz/q" else "zz/q"}
    args = ["--prefix", str(prefix), "--executor_info_base_path", f"{prefix}/{base}"]
    result = run_study(tmp_path, *args, mode="nested_output", env=env)
    line = error_line(result, 2)
    name = env["STUDY_NESTED_NAME"]
    assert line.startswith(
        f"error: --executor_info_base_path {prefix}/{base.rstrip('/')} holds the output of step "
        f"{name!r} ({prefix}/{name}-"
    )
    assert "put them where no step writes, or rename the step" in line
    only_the_script(tmp_path)


@pytest.mark.parametrize("where", ["prefix", "above", "sibling", "beside-the-step"])
def test_manifests_beside_the_outputs_are_fine(tmp_path, where):
    """The prefix itself, or a directory above it, holds the outputs and the manifests as files
    side by side; a directory no step writes in is the manifests' own."""
    prefix = tmp_path / "out"
    base = {
        "prefix": prefix,
        "above": tmp_path,
        "sibling": tmp_path / "manifests",
        "beside-the-step": prefix / "zz" / "manifests",
    }[where]
    args = ["--prefix", str(prefix), "--executor_info_base_path", str(base)]
    result = run_study(tmp_path, *args, mode="nested_output", env={"STUDY_NESTED_NAME": "zz/q"})
    assert result.returncode == 0, result.stderr
    assert f"Experiment manifest: {base}/study-" in result.stdout


def test_an_unreadable_status_file_does_not_stop_unrelated_steps(tmp_path):
    status_file = _status_file_of_a(tmp_path)
    _corrupt(status_file, "truncated")
    result = run_study(tmp_path, "--prefix", str(tmp_path / "out"))
    error_line(result, 1, f"cannot read the status file {status_file}", "a [failed]")
    assert "2 failed" in result.stdout  # a, and b that depends on it
    assert "executor error" not in result.stderr  # failed as planned, not by crashing on the file
    outputs = {p.name.split("-")[0]: p for p in (tmp_path / "out").iterdir() if "-" in p.name}
    assert (outputs["c"] / "done").read_text() == "3"  # the unrelated branch ran
    assert "b" not in outputs or not (outputs["b"] / "done").exists()  # the dependent did not


def test_a_script_that_only_imports_executor_gets_the_one_line_error_too(tmp_path):
    """`import executor` then `executor.executor_main(...)` at the end: the report of a bad
    declaration at the top was installed only when executor_main was first used."""
    script = tmp_path / "study.py"
    script.write_text(
        "import executor\n"
        "from dataclasses import dataclass\n\n"
        "@dataclass(frozen=True)\n"
        "class Config:\n"
        "    output_path: str\n\n"
        "steps = [executor.ExecutorStep('a/./b', print, Config(executor.this_output_path()))]  # bad\n"
        "executor.executor_main(steps)\n"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MARIN_")}
    result = subprocess.run(
        [sys.executable, str(script), "--prefix", str(tmp_path / "out")],
        cwd=tmp_path,
        env={**environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = error_line(result, 1, "step name 'a/./b' is invalid")
    assert line.startswith("error: study.py:8: ")
