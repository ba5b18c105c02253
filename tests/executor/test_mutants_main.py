"""`executor_main` and its flag parsing (`executor.main`), in this process.

Each test pins a behaviour that a mutation of `executor/main.py` broke without any other
in-process test noticing (see docs/testing.md; the subprocess CLI tests cover some of
these too, but mutmut cannot see into subprocesses): exit codes and the one-line error
for each kind of failure, the messages printed on success, where the manifest goes, and
which flag values are read without draccus.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import sys
from typing import Any

import pytest

import executor.main as main
import executor.step_errors as step_errors
from executor import ExecutorStep, this_output_path, versioned
from executor.plan import RunOnlyError
from executor.runner import ExecutorRunError
from executor.steps import StepDefinitionError
from executor.store import StoreError
from tests.executor.steps_for_tests import CALLS, WriteConfig, write_value

ENV = (
    "MARIN_PREFIX",
    "MARIN_LEASE_TIMEOUT",
    "MARIN_LEASE_HEARTBEAT",
    "MARIN_LEASE_POLL",
    "MARIN_BACKEND",
    "RAY_ADDRESS",
)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    CALLS.clear()
    for variable in ENV:
        monkeypatch.delenv(variable, raising=False)


def write_step(name: str, value: Any = 0) -> ExecutorStep:
    return ExecutorStep(name, write_value, WriteConfig(this_output_path(), versioned(value), key=name))


@pytest.fixture
def run_main(monkeypatch, capsys):
    """Run `executor_main(steps)` with `flags`; returns (exit code, executor or None, stdout, stderr)."""

    def run(steps, *flags: str):
        monkeypatch.setattr(sys, "argv", ["experiment.py", *flags])
        capsys.readouterr()
        try:
            result, code = main.executor_main(steps), 0
        except SystemExit as exit_:
            result, code = None, exit_.code
        out, err = capsys.readouterr()
        return code, result, out, err

    return run


def error_line(err: str) -> str:
    (line,) = [line for line in err.splitlines() if line.strip()]
    assert line.startswith("error: ")
    return line[len("error: ") :]


# -- a run that finishes ------------------------------------------------------------------------


def test_a_run_prints_where_its_manifest_is_and_returns_the_executor(run_main, tmp_path):
    code, executor, out, err = run_main([write_step("a")], "--prefix", str(tmp_path / "out"))
    assert code == 0
    assert executor.executor_info_path.startswith(str(tmp_path / "out" / "experiments") + "/")
    assert f"Experiment manifest: {executor.executor_info_path}\n" in out
    assert os.path.exists(executor.executor_info_path)
    assert CALLS == {"a": 1}


def test_the_description_given_to_executor_main_is_recorded_in_the_manifest(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sys, "argv", ["experiment.py", "--prefix", str(tmp_path / "out")])
    executor = main.executor_main([write_step("a")], description="what this study is for")
    with open(executor.executor_info_path, encoding="utf-8") as manifest:
        assert json.load(manifest)["description"] == "what this study is for"


def test_the_manifest_goes_under_executor_info_base_path(run_main, tmp_path):
    base = str(tmp_path / "manifests")
    code, executor, out, _ = run_main(
        [write_step("a")], "--prefix", str(tmp_path / "out"), "--executor_info_base_path", base
    )
    assert code == 0
    assert executor.executor_info_path.startswith(base + "/")
    assert os.listdir(base) == [os.path.basename(executor.executor_info_path)]
    assert not os.path.exists(tmp_path / "out" / "experiments")


def test_a_dry_run_runs_nothing_and_names_no_manifest(run_main, tmp_path):
    code, executor, out, _ = run_main(
        [write_step("a")], "--prefix", str(tmp_path / "out"), "--dry_run", "true"
    )
    assert code == 0 and executor is not None
    assert CALLS == {}
    assert "Experiment manifest" not in out
    assert not os.path.exists(tmp_path / "out")


def test_without_a_prefix_the_default_is_named_once(run_main, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, out, _ = run_main([write_step("a")], "--dry_run", "true")
    assert code == 0
    line = f"No --prefix and no $MARIN_PREFIX: writing under {tmp_path / 'marin-output'}"
    assert out.count(line) == 1


def test_a_prefix_from_marin_prefix_is_not_announced(run_main, tmp_path, monkeypatch):
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "env"))
    code, executor, out, _ = run_main([write_step("a")])
    assert code == 0
    assert "No --prefix" not in out
    assert executor.prefix == str(tmp_path / "env")


def test_a_prefix_flag_is_not_announced(run_main, tmp_path):
    code, _, out, _ = run_main([write_step("a")], "--prefix", str(tmp_path / "out"), "--dry_run", "true")
    assert code == 0 and "No --prefix" not in out


def test_logging_is_configured_at_info_only_when_nothing_configured_it(run_main, tmp_path, monkeypatch):
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)
    code, *_ = run_main([write_step("a")], "--prefix", str(tmp_path / "out"), "--dry_run", "true")
    assert code == 0
    assert root.level == logging.INFO
    (handler,) = root.handlers
    assert handler.formatter._fmt == "%(asctime)s %(levelname)s %(name)s: %(message)s"

    existing = logging.NullHandler()
    monkeypatch.setattr(root, "handlers", [existing])
    monkeypatch.setattr(root, "level", logging.WARNING)
    run_main([write_step("a")], "--prefix", str(tmp_path / "out"), "--dry_run", "true")
    assert root.handlers == [existing] and root.level == logging.WARNING


# -- failures: exit code and one line ---------------------------------------------------------


class RaisingExecutor:
    """Stands in for Executor: its constructor or its run raises `error`."""

    def __init__(self, error: BaseException, when: str):
        self.error, self.when = error, when
        self.executor_info_path = None

    def __call__(self, *args, **kwargs):
        if self.when == "init":
            raise self.error
        return self

    def run(self, *args, **kwargs):
        raise self.error


@pytest.mark.parametrize(
    ("error", "when", "code", "line"),
    [
        (ValueError("Executor: prefix is empty"), "init", 2, "Executor: prefix is empty"),
        (StoreError("no filesystem for 'x://'"), "init", 2, "no filesystem for 'x://'"),
        (OSError("plain"), "init", 2, "plain"),
        (
            RunOnlyError("run_only patterns (z) match no step"),
            "run",
            2,
            "--run_only patterns (z) match no step",
        ),
        (RunOnlyError("something else"), "run", 2, "something else"),
        (StepDefinitionError("step 'a': bad"), "run", 1, "step 'a': bad"),
        (ValueError("cannot read the status file"), "run", 1, "cannot read the status file"),
        (ExecutorRunError([]), "run", 1, "0 step(s) failed: []"),
        (StoreError("cannot write /p/x: full"), "run", 1, "cannot write /p/x: full"),
        (
            FileNotFoundError(errno.ENOENT, "No such file or directory", "/p/x"),
            "run",
            1,
            "storage failed on /p/x: FileNotFoundError: [Errno 2] No such file or directory: '/p/x'",
        ),
        (TimeoutError("read timed out"), "run", 1, "storage failed: TimeoutError: read timed out"),
        (KeyboardInterrupt(), "run", 130, "interrupted"),
    ],
    ids=lambda value: "case",
)
def test_each_failure_exits_with_its_code_and_one_error_line(
    run_main, tmp_path, monkeypatch, error, when, code, line
):
    monkeypatch.setattr(main, "Executor", RaisingExecutor(error, when))
    got, executor, out, err = run_main([write_step("a")], "--prefix", str(tmp_path / "out"))
    assert got == code
    assert error_line(err).startswith(line)
    assert "Experiment manifest" not in out


def test_an_unreadable_status_file_exits_1_naming_it(run_main, tmp_path):
    prefix = tmp_path / "out"
    code, executor, *_ = run_main([write_step("a")], "--prefix", str(prefix), "--dry_run", "true")
    status = os.path.join(executor.output_paths[executor.steps[0]], ".executor_status")
    os.makedirs(os.path.dirname(status))
    with open(status, "w") as handle:
        handle.write("garbage\n")
    code, _, _, err = run_main([write_step("a")], "--prefix", str(prefix))
    assert code == 1
    assert err.startswith("error: 1 step(s) failed: [")
    assert f"cannot read the status file {status}" in err


def test_a_usage_error_exits_2_before_anything_runs(run_main, tmp_path):
    code, executor, out, err = run_main(
        [write_step("a")], "--prefix", str(tmp_path / "out"), "--max_concurrent", "0"
    )
    assert code == 2 and executor is None
    assert error_line(err) == "--max_concurrent must be at least 1, got 0"
    assert CALLS == {} and not os.path.exists(tmp_path / "out")


def test_describe_os_error():
    assert main._describe_os_error(StoreError("cannot read /x: y")) == "cannot read /x: y"
    assert main._describe_os_error(PermissionError(13, "Permission denied", "/x")) == (
        "storage failed on /x: PermissionError: [Errno 13] Permission denied: '/x'"
    )
    assert main._describe_os_error(OSError("no filename")) == "storage failed: OSError: no filename"


# -- the excepthook for steps declared wrongly at the top of a script ------------------------------


def _raise_from_here(error: BaseException):
    try:
        raise error
    except BaseException as caught:  # noqa: BLE001 (the test inspects it)
        return type(caught), caught, caught.__traceback__


def test_a_step_definition_error_is_one_line_naming_the_script_line(capsys, monkeypatch):
    called = []
    kind, error, tb = _raise_from_here(StepDefinitionError("step name '' is invalid"))
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    step_errors._one_line_step_errors(kind, error, tb, previous=lambda *args: called.append(args))
    err = capsys.readouterr().err
    assert called == []
    line = tb.tb_lineno
    assert err == f"error: tests/executor/test_mutants_main.py:{line}: step name '' is invalid\n"


def test_the_script_path_is_absolute_outside_the_working_directory(capsys, monkeypatch, tmp_path):
    kind, error, tb = _raise_from_here(StepDefinitionError("bad"))
    monkeypatch.chdir(tmp_path)
    step_errors._one_line_step_errors(kind, error, tb, previous=lambda *args: None)
    assert capsys.readouterr().err == f"error: {os.path.abspath(__file__)}:{tb.tb_lineno}: bad\n"


def _raise_through(*filenames: str):
    """Raise StepDefinitionError('bad name') through one frame per filename, outermost first."""
    namespace: dict = {"StepDefinitionError": StepDefinitionError}
    body = "    raise StepDefinitionError('bad name')\n"
    for index, filename in reversed(list(enumerate(filenames))):
        code = f"def f{index}():\n" + body
        exec(compile(code, filename, "exec"), namespace)
        body = f"    f{index}()\n"
    try:
        namespace["f0"]()
    except StepDefinitionError as caught:
        return type(caught), caught, caught.__traceback__


INSIDE = os.path.join(os.path.dirname(os.path.abspath(main.__file__)), "declared_here.py")


def test_frames_inside_the_executor_are_skipped_to_name_the_callers_line(capsys, monkeypatch):
    """The error is raised inside executor/ (as ExecutorStep's name check is), here through a
    frame of generated code ('<string>'): the line named is the last real frame outside."""
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    kind, error, tb = _raise_through("<string>", INSIDE)
    line = tb.tb_lineno
    step_errors._one_line_step_errors(kind, error, tb, previous=lambda *args: None)
    assert capsys.readouterr().err == f"error: tests/executor/test_mutants_main.py:{line}: bad name\n"


def test_the_script_frame_named_is_the_last_one_outside_the_executor(capsys, tmp_path):
    script = str(tmp_path / "script.py")
    kind, error, tb = _raise_through(script, INSIDE)
    step_errors._one_line_step_errors(kind, error, tb.tb_next, previous=lambda *args: None)
    assert capsys.readouterr().err == f"error: {script}:2: bad name\n"


def test_a_traceback_entirely_inside_the_executor_names_no_line(capsys):
    kind, error, tb = _raise_through(INSIDE)
    step_errors._one_line_step_errors(kind, error, tb.tb_next, previous=lambda *args: None)
    assert capsys.readouterr().err == "error: bad name\n"


def test_other_exceptions_go_to_the_previous_hook(capsys):
    called = []
    kind, error, tb = _raise_from_here(RuntimeError("other"))
    step_errors._one_line_step_errors(kind, error, tb, previous=lambda *args: called.append(args))
    assert called == [(kind, error, tb)]
    assert capsys.readouterr().err == ""


# -- flags -------------------------------------------------------------------------------------


def test_plain_values_read_as_yaml_would():
    assert main._plain_int("0") == 0
    assert main._plain_int("42") == 42
    for text in ("00", "07", "-1", "+1", "1.0", "", "١", "1_0"):
        assert main._plain_int(text) is None, text
    assert main._plain_float("0.5") == 0.5
    assert main._plain_float("5.") == 5.0
    assert main._plain_float("30") == 30.0
    assert main._plain_float("0") == 0.0
    for text in ("00.5", "01", ".5", "", "1e3", "1.2.3", "-1", "١.٥", "nan"):
        assert main._plain_float(text) is None, text
    assert main._plain_bool("TRUE") is True and main._plain_bool("False") is False
    assert main._plain_bool("yes") is None and main._plain_bool("tRue") is None


def test_parse_plain_reads_both_spellings_and_refuses_the_rest():
    config = main._parse_plain(["--backend", "local", "--dry_run=true", "--max_concurrent", "3"])
    assert config == main.ExecutorMainConfig(backend="local", dry_run=True, max_concurrent=3)
    assert main._parse_plain(["--lease_poll=2.5"]) == main.ExecutorMainConfig(lease_poll=2.5)
    assert main._parse_plain(["--max_concurrent", "1", "--max_concurrent", "2"]) is None
    assert main._parse_plain(["--dry_run"]) is None  # no value
    assert main._parse_plain(["-x", "1"]) is None
    assert main._parse_plain(["--unknown", "1"]) is None
    assert main._parse_plain(["--max_concurrent", "many"]) is None


def test_parse_flags_combines_run_only_with_the_other_flags():
    config = main.parse_flags(["--prefix", "/p/q", "--run_only", "a.*", "--dry_run", "true"])
    assert config == main.ExecutorMainConfig(prefix="/p/q", run_only=["a.*"], dry_run=True)
    config = main.parse_flags(["--run_only=x=y", "--max_concurrent=1"])
    assert config.run_only == ["x=y"] and config.max_concurrent == 1
    assert main.parse_flags([]) == main.ExecutorMainConfig()


def test_parse_flags_refuses_an_invalid_run_only_regex():
    with pytest.raises(main.UsageError) as caught:
        main.parse_flags(["--run_only", "("])
    assert str(caught.value).startswith("--run_only: invalid regular expression '('")


def test_max_concurrent_of_1_is_accepted_and_0_refused():
    assert main.parse_flags(["--max_concurrent", "1"]).max_concurrent == 1
    with pytest.raises(main.UsageError, match=r"^--max_concurrent must be at least 1, got 0$"):
        main.parse_flags(["--max_concurrent", "0"])


def test_take_run_only_removes_it_and_keeps_everything_else():
    assert main._take_run_only(["--a", "1", "--run_only", "x", "--b"]) == (["--a", "1", "--b"], ["x"])
    assert main._take_run_only(["--run_only=a=b", "--c"]) == (["--c"], ["a=b"])
    assert main._take_run_only(["--run_only"]) == (["--run_only"], None)  # draccus words the error
    assert main._take_run_only(["--run_only", "a", "--run_only", "b"]) == ([], ["b"])  # last one wins


def test_parse_run_only_reads_a_regex_or_a_json_list():
    assert main._parse_run_only("a/.*") == ["a/.*"]
    assert main._parse_run_only('["a", "b"]') == ["a", "b"]
    assert main._parse_run_only('  ["a"]') == ["a"]
    assert main._parse_run_only("[ab]c") == ["[ab]c"]
    assert main._parse_run_only("[]") == []
    assert main._parse_run_only('{"a": 1}') == ['{"a": 1}']  # not a list: a regex
    for text in ('["a", 1]', "[1]", '[["nested"]]', ' ["a", null]'):
        with pytest.raises(main.UsageError) as caught:
            main._parse_run_only(text)
        assert str(caught.value) == (
            f'--run_only {text!r}: expected a regex or a JSON list of regexes, e.g. \'["a/.*", "b"]\''
        )


def test_argparse_message_keeps_the_last_message_line():
    stderr = "usage: x [-h]\n\nx: error: unrecognized arguments: --y\n\n"
    assert main._argparse_message(stderr) == "unrecognized arguments: --y (see --help)"
    assert main._argparse_message("") == "invalid arguments (see --help)"
    assert main._argparse_message("just text") == "just text (see --help)"


def test_help_exits_0(capsys):
    with pytest.raises(SystemExit) as caught:
        main.parse_flags(["--help"])
    assert caught.value.code == 0
    assert "--lease_timeout" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max_concurrent", "1.5"], "--max_concurrent: couldn't parse '1.5' into an int"),
        (["--dry_run", "maybe"], "--dry_run: "),
        (["--lease_timeout", "soon"], "--lease_timeout: "),
    ],
)
def test_a_value_draccus_cannot_decode_names_the_flag_and_what_it_expects(argv, message):
    with pytest.raises(main.UsageError) as caught:
        main.parse_flags(argv)
    text = str(caught.value)
    assert text.startswith(message)
    expected = {
        "--max_concurrent": "a whole number",
        "--dry_run": "true or false",
        "--lease_timeout": "a number of seconds",
    }
    assert text.endswith(f"(expected {expected[argv[0]]})")
    assert "\n" not in text


def test_a_config_file_with_unknown_keys_is_refused_in_one_line(tmp_path):
    path = tmp_path / "flags.yaml"
    path.write_text("no_such_key: 1\n")
    with pytest.raises(main.UsageError) as caught:
        main.parse_flags(["--config_path", str(path)])
    text = str(caught.value)
    assert "\n" not in text and text.endswith("(see --help)")
    assert "no_such_key" in text


def test_a_config_file_sets_flags(tmp_path):
    path = tmp_path / "flags.yaml"
    path.write_text("prefix: /from/file\nmax_concurrent: 2\n")
    config = main.parse_flags(["--config_path", str(path)])
    assert (config.prefix, config.max_concurrent) == ("/from/file", 2)


def test_lease_flags_name_themselves_in_errors():
    config = main.ExecutorMainConfig(lease_timeout=5.0, lease_heartbeat=5.0)
    with pytest.raises(main.UsageError) as caught:
        main.lease_config_of(config)
    assert str(caught.value).startswith("--lease_heartbeat (5s) must be smaller than --lease_timeout (5s): ")
    lease = main.lease_config_of(
        main.ExecutorMainConfig(lease_timeout=30.0, lease_heartbeat=2.0, lease_poll=1.0)
    )
    assert (lease.timeout, lease.heartbeat_interval, lease.poll_interval) == (30.0, 2.0, 1.0)


# -- messages are flushed at once (stdout to a pipe is block-buffered) -----------------------------


class QuietExecutor:
    """Stands in for Executor: runs nothing, prints nothing, has a manifest path."""

    def __init__(self, *args, **kwargs):
        self.executor_info_path = "/p/experiments/x.json"

    def run(self, *args, **kwargs):
        pass


def buffered_streams(monkeypatch):
    """sys.stdout / sys.stderr as block-buffered text streams; returns their raw bytes."""
    out, err = io.BytesIO(), io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding="utf-8"))
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(err, encoding="utf-8"))
    return out, err


def test_the_no_prefix_notice_and_the_manifest_line_are_flushed_at_once(monkeypatch, tmp_path):
    """Printed before the steps' own output: without a flush they would show up after it, or
    never, if the script is killed, when stdout is a pipe (a CI log, `| tee`)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(main, "Executor", QuietExecutor)
    monkeypatch.setattr(sys, "argv", ["experiment.py"])
    out, _ = buffered_streams(monkeypatch)
    main.executor_main([])
    text = out.getvalue().decode()
    assert "No --prefix and no $MARIN_PREFIX: writing under" in text
    assert text.endswith("Experiment manifest: /p/experiments/x.json\n")


def test_the_no_prefix_notice_alone_is_flushed(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(main, "Executor", QuietExecutor)
    monkeypatch.setattr(sys, "argv", ["experiment.py", "--dry_run", "true"])
    out, _ = buffered_streams(monkeypatch)
    main.executor_main([])
    assert (
        out.getvalue().decode()
        == f"No --prefix and no $MARIN_PREFIX: writing under {tmp_path / 'marin-output'}\n"
    )


def test_the_error_line_is_flushed_before_exiting(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["experiment.py", "--prefix", str(tmp_path), "--max_concurrent", "0"])
    _, err = buffered_streams(monkeypatch)
    with pytest.raises(SystemExit):
        main.executor_main([])
    assert err.getvalue().decode() == "error: --max_concurrent must be at least 1, got 0\n"


def test_the_step_declaration_error_line_is_flushed(monkeypatch):
    _, err = buffered_streams(monkeypatch)
    kind, error, tb = _raise_through(INSIDE)
    step_errors._one_line_step_errors(kind, error, tb.tb_next, previous=lambda *args: None)
    assert err.getvalue().decode() == "error: bad name\n"


# -- more of the excepthook and the flag messages ----------------------------------------------------


def test_the_last_frame_outside_the_executor_wins_over_earlier_ones(capsys, tmp_path):
    """script -> executor -> a helper module -> executor: the helper's line is named (the
    walk goes on to the innermost frame, it does not stop at the first one outside)."""
    script, helper = str(tmp_path / "script.py"), str(tmp_path / "helper.py")
    kind, error, tb = _raise_through(script, INSIDE, helper, INSIDE)
    step_errors._one_line_step_errors(kind, error, tb.tb_next, previous=lambda *args: None)
    assert capsys.readouterr().err == f"error: {helper}:2: bad name\n"


def test_an_unreadable_config_file_is_named_in_the_message(tmp_path):
    missing = str(tmp_path / "no-such-flags.yaml")
    with pytest.raises(main.UsageError) as caught:
        main.parse_flags(["--config_path", missing])
    text = str(caught.value)
    assert text.startswith(f"cannot read the flags in {missing}: FileNotFoundError: ")
    assert "\n" not in text


def test_an_argparse_error_keeps_everything_after_its_first_error_marker():
    with pytest.raises(main.UsageError) as caught:
        main.parse_flags(["--no_such_flag", "a: error: b"])
    assert str(caught.value) == "unrecognized arguments: --no_such_flag a: error: b (see --help)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--dry_run", "{a: 1}"],
            "--dry_run: couldn't parse '{'a': 1}' into a bool (expected true or false)",
        ),
        (
            ["--lease_poll", "{a: 1}"],
            "--lease_poll: couldn't parse '{'a': 1}' into a float (expected a number of seconds)",
        ),
    ],
)
def test_a_decoding_message_keeps_colons_inside_the_value(argv, message):
    with pytest.raises(main.UsageError) as caught:
        main.parse_flags(argv)
    assert str(caught.value) == message


def test_a_config_value_of_the_wrong_kind_for_a_list_flag_expects_nothing_named(tmp_path):
    path = tmp_path / "flags.yaml"
    path.write_text("run_only: 5\n")
    with pytest.raises(main.UsageError) as caught:
        main.parse_flags(["--config_path", str(path)])
    assert str(caught.value) == (
        "--run_only: list[str]: The given value='5' is not of a valid input for a list type"
    )


def test_a_decoding_error_without_a_message_says_invalid_value():
    import draccus

    for message in ("", "  \n "):
        error = draccus.utils.DecodingError(("dry_run",), message)
        assert main._decoding_message(error) == "--dry_run: invalid value (expected true or false)"


def test_a_config_error_without_a_message_still_names_its_type(monkeypatch):
    import draccus

    def parse(**kwargs):
        raise RuntimeError()

    monkeypatch.setattr(draccus, "parse", parse)
    with pytest.raises(main.UsageError) as caught:
        main.parse_flags(["--config_path", "flags.yaml"])
    assert str(caught.value) == "cannot read the flags in flags.yaml: RuntimeError: "


# -- --backend and --ray_address ---------------------------------------------------------------


def test_backend_flags_reach_the_executor(monkeypatch, tmp_path):
    captured = {}

    class Spy(QuietExecutor):
        def __init__(self, *args, **kwargs):
            captured.update(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(main, "Executor", Spy)
    argv = ["x.py", "--prefix", str(tmp_path), "--backend", "ray", "--ray_address", "10.0.0.2:6379"]
    monkeypatch.setattr(sys, "argv", argv)
    main.executor_main([])
    assert captured["backend"] == "ray"
    assert captured["ray_address"] == "10.0.0.2:6379"


def test_backend_of_names_the_flag_and_the_choices():
    assert main.backend_of(main.ExecutorMainConfig(backend="ray")) == "ray"
    assert main.backend_of(main.ExecutorMainConfig()) == "local"
    with pytest.raises(main.UsageError) as caught:
        main.backend_of(main.ExecutorMainConfig(backend="nope"))
    assert str(caught.value) == "--backend='nope': unknown backend; use one of local, ray"


def test_plain_words_are_letters_yaml_reads_as_strings():
    assert main._plain_word("ray") == "ray"
    assert main._plain_word("Local") == "Local"
    for text in ("yes", "No", "ON", "null", "y", "ray2", "é", "", "a-b"):
        assert main._plain_word(text) is None, text


def test_plain_addresses_are_host_port_or_auto():
    for text in ("10.0.0.2:6379", "ray://10.0.0.2:10001", "Head.example:6379", "ray://Head-1:1", "auto"):
        assert main._plain_address(text) == text
    for text in ("head", "head:", "AUTO", "ray://head", "1:123456", "http://h:1"):
        assert main._plain_address(text) is None, text


def test_a_list_where_a_number_belongs_is_named_without_draccus_internals():
    with pytest.raises(main.UsageError) as caught:
        main.parse_flags(["--max_concurrent", "[1]"])
    assert str(caught.value) == "--max_concurrent: couldn't parse '[1]' (expected a whole number)"
