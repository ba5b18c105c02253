"""`executor_main`'s flags without draccus: plain flags read exactly as draccus reads them,
and path flags exactly as given (draccus would read them as YAML)."""

import os

import pytest

from executor import main
from tests.executor.steps_for_tests import modules_loaded_by

PLAIN = [
    [],
    ["--dry_run", "true", "--force_run_failed", "False"],
    ["--dry_run=TRUE"],
    ["--max_concurrent", "4"],
    ["--max_concurrent", "0"],  # read as 0, then refused by the range check
    ["--lease_timeout", "30", "--lease_heartbeat", "0.5", "--lease_poll", "5."],
    ["--lease_timeout", "0"],
]

NOT_PLAIN = [
    ["--prefix", "/tmp/out"],  # path flags are taken out before (parse_flags: _take_paths)
    ["--pre", "/x"],  # argparse takes abbreviations
    ["--dry_run", "yes"],
    ["--dry_run", "1"],
    ["--max_concurrent", "010"],  # YAML 1.1: octal
    ["--max_concurrent", "1_000"],
    ["--lease_timeout", "1e3"],
    ["--lease_timeout", ".5"],
    ["--lease_timeout", "010.5"],
    ["--prefix"],
    ["--help"],
    ["-h"],
    ["--config_path", "flags.yaml"],
    ["--", "x"],
]


@pytest.mark.parametrize("argv", PLAIN)
def test_plain_flags_parse_as_draccus_parses_them(argv):
    parsed = main._parse_plain(argv)
    assert parsed is not None
    assert parsed == main._parse_with_draccus(argv)


@pytest.mark.parametrize("argv", NOT_PLAIN)
def test_anything_else_is_left_to_draccus(argv):
    assert main._parse_plain(argv) is None


def test_a_script_with_plain_flags_does_not_import_draccus(tmp_path):
    code = "from executor.main import parse_flags\nparse_flags(['--prefix', '/tmp/x', '--dry_run', 'true', '--max_concurrent', '2'])"
    assert modules_loaded_by(code, ("draccus", "yaml")) == []


PATHS = [
    (["--prefix", "/tmp/out"], "/tmp/out", None),
    (
        ["--prefix=s3://bucket/out", "--executor_info_base_path", "./experiments/x"],
        "s3://bucket/out",
        "./experiments/x",
    ),
    (["--prefix", "/a=b/c@d+e~f-g.h"], "/a=b/c@d+e~f-g.h", None),
    # YAML would read these as True, False, 16, None, a mapping: a prefix is taken as written.
    (["--prefix", "yes"], "yes", None),
    (["--prefix", "no", "--dry_run", "true"], "no", None),
    (["--prefix=0x10"], "0x10", None),
    (["--prefix", "null", "--executor_info_base_path", "~"], "null", "~"),
    (["--prefix", "0x10/a:"], "0x10/a:", None),
    (["--prefix", "/a b"], "/a b", None),
    (["--pre", "on"], "on", None),  # an abbreviation argparse would take
    (["--e=off", "--p", "n"], "n", "off"),
]


@pytest.mark.parametrize(("argv", "prefix", "base"), PATHS)
def test_path_flags_are_taken_as_written(argv, prefix, base):
    config = main.parse_flags(argv)
    assert (config.prefix, config.executor_info_base_path) == (prefix, base)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prefix", ""], "--prefix is empty"),
        (["--prefix="], "--prefix is empty"),
        (["--executor_info_base_path", " "], "--executor_info_base_path is empty"),
        (["--prefix", "/a", "--prefix", "/b"], "--prefix given twice ('/a' and '/b')"),
        (["--prefix"], "--prefix: expected a directory or a URL"),
        (["--prefix", "--dry_run", "true"], "--prefix: expected a directory or a URL"),
        (
            ["--run_only", "--prefix", "fl"],
            "--run_only: expected a regex or a JSON list of regexes, got the flag --prefix",
        ),
    ],
)
def test_bad_path_flags_are_usage_errors(argv, message):
    with pytest.raises(main.UsageError) as refused:
        main.parse_flags(argv)
    assert message in str(refused.value)


@pytest.mark.parametrize("base", ["foo://y", "s3://bucket/manifests"])
def test_manifests_on_another_storage_than_the_prefix_are_a_usage_error(tmp_path, monkeypatch, capsys, base):
    """They are written with the prefix's storage: `foo://y` became a local directory `foo:`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        "sys.argv", ["exp.py", "--prefix", str(tmp_path / "p"), "--executor_info_base_path", base]
    )
    with pytest.raises(SystemExit) as exited:
        main.executor_main([])
    assert exited.value.code == main.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"error: --executor_info_base_path {base!r} is on {base.split('://')[0]}://")
    assert os.listdir(tmp_path) == []


def test_manifests_inside_a_step_output_are_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """Removing the output (gc, a failed step's `rm -r`) would take the manifests along."""
    from executor import Executor, ExecutorStep, this_output_path
    from tests.executor.steps_for_tests import WriteConfig, write_value

    step = ExecutorStep(name="a", fn=write_value, config=WriteConfig(output_path=this_output_path()))
    prefix = tmp_path / "p"
    output = Executor(str(prefix), console=False).run([step], dry_run=True).rows[0].output_path
    for base in (output, f"{output}/manifests/deeper"):
        monkeypatch.setattr(
            "sys.argv", ["exp.py", "--prefix", str(prefix), "--executor_info_base_path", base]
        )
        with pytest.raises(SystemExit) as exited:
            main.executor_main([step])
        assert exited.value.code == main.EXIT_USAGE  # a usage error (exit 1 before the twenty-second session)
        err = capsys.readouterr().err
        assert f"error: --executor_info_base_path {base} is inside the output of step 'a' ({output})" in err
        assert not os.path.exists(prefix)
    # Next to the outputs (the prefix itself) is fine: manifests are files, outputs directories.
    monkeypatch.setattr(
        "sys.argv", ["exp.py", "--prefix", str(prefix), "--executor_info_base_path", str(prefix)]
    )
    main.executor_main([step])
    assert os.path.isdir(output) and any(name.endswith(".json") for name in os.listdir(prefix))
