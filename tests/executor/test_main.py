"""`executor_main`: the command line every experiment script gets (run as a user would, in a subprocess)."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from executor import ExecutorMainConfig
from tests.executor.steps_for_tests import modules_loaded_by

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELLO = os.path.join(REPO, "experiments", "tutorials", "hello_world.py")


def run_script(*args, cwd, env_prefix=None, check=True):
    env = {key: value for key, value in os.environ.items() if key != "MARIN_PREFIX"}
    env["PYTHONPATH"] = REPO
    if env_prefix:
        env["MARIN_PREFIX"] = env_prefix
    result = subprocess.run(
        [sys.executable, HELLO, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    if check and result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def step_dirs(prefix):
    base = os.path.join(prefix, "hello_world")
    return sorted(os.listdir(base)) if os.path.isdir(base) else []


def test_the_flag_set_is_frozen():
    # Marin's flags, the lease timing (issue 9: slow storage, fast tests), the backend (issue 10); adding one is
    # a deliberate change to every experiment's command line.
    names = [field.name for field in dataclasses.fields(ExecutorMainConfig)]
    assert names == [
        "prefix",
        "executor_info_base_path",
        "dry_run",
        "force_run_failed",
        "run_only",
        "max_concurrent",
        "lease_timeout",
        "lease_heartbeat",
        "lease_poll",
        "backend",
        "ray_address",
        "max_retries",
    ]


def test_hello_world_runs_and_then_is_cached(tmp_path):
    prefix = str(tmp_path / "out")
    first = run_script("--prefix", prefix, cwd=tmp_path)
    assert "2 ran, 0 cached" in first.stdout
    dirs = step_dirs(prefix)
    assert [d.rsplit("-", 1)[0] for d in dirs] == ["numbers", "stats"]
    stats_dir = os.path.join(prefix, "hello_world", dirs[1])
    with open(os.path.join(stats_dir, "stats.json")) as handle:
        assert json.load(handle)["count"] == 100
    second = run_script("--prefix", prefix, cwd=tmp_path)
    assert "0 ran, 2 cached" in second.stdout
    assert "Experiment manifest:" in second.stdout


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    prefix = tmp_path / "out"
    result = run_script("--prefix", str(prefix), "--dry_run", "true", cwd=tmp_path)
    assert "Plan: 2 steps (1 run, 1 blocked)" in result.stdout
    assert not prefix.exists()


def test_run_only_selects_steps_by_regex(tmp_path):
    prefix = str(tmp_path / "out")
    run_script("--prefix", prefix, "--run_only", '["hello_world/num.*"]', cwd=tmp_path)
    assert [d.rsplit("-", 1)[0] for d in step_dirs(prefix)] == ["numbers"]


def test_run_only_also_takes_a_single_regex(tmp_path):
    prefix = str(tmp_path / "out")
    run_script("--prefix", prefix, "--run_only", "hello_world/num.*", cwd=tmp_path)
    assert [d.rsplit("-", 1)[0] for d in step_dirs(prefix)] == ["numbers"]
    run_script(f"--prefix={prefix}", "--run_only=hello_world/stats", cwd=tmp_path)
    assert [d.rsplit("-", 1)[0] for d in step_dirs(prefix)] == ["numbers", "stats"]


def test_marin_prefix_is_the_default_prefix(tmp_path):
    prefix = str(tmp_path / "from-env")
    run_script(cwd=tmp_path, env_prefix=prefix)
    assert len(step_dirs(prefix)) == 2


def test_without_any_prefix_outputs_go_to_marin_output_in_the_working_directory(tmp_path):
    result = run_script(cwd=tmp_path)
    assert f"writing under {tmp_path}/marin-output" in result.stdout
    assert len(step_dirs(str(tmp_path / "marin-output"))) == 2


def test_an_invalid_run_only_regex_is_a_usage_error_with_a_clear_message(tmp_path):
    result = run_script("--prefix", str(tmp_path / "out"), "--run_only", '["("]', cwd=tmp_path, check=False)
    assert result.returncode == 2
    assert "run_only: invalid regular expression '('" in result.stderr


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max_concurrent", "1"),
        ("--force_run_failed", "false"),
        ("--lease_timeout", "30"),
        ("--lease_heartbeat", "0.5"),
        ("--lease_poll", "0.25"),
    ],
)
def test_flags_are_accepted(tmp_path, flag, value):
    run_script("--prefix", str(tmp_path / "out"), flag, value, cwd=tmp_path)


def test_help_lists_every_flag_with_its_docstring(tmp_path):
    result = run_script("--help", cwd=tmp_path)
    for field in dataclasses.fields(ExecutorMainConfig):
        assert f"--{field.name}" in result.stdout
    assert "noqa" not in result.stdout  # draccus shows a comment after a field as its help
    assert "MARIN_LEASE_TIMEOUT" in result.stdout


def test_importing_executor_main_does_not_import_draccus():
    # executor_main imports draccus when it parses flags: a script's imports stay cheap.
    code = "from executor import executor_main, ExecutorMainConfig"
    assert modules_loaded_by(code, ("draccus", "yaml")) == []
