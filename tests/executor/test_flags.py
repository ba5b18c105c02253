"""`executor_main`'s flags without draccus: plain flags read exactly as draccus reads them."""

import pytest

from executor import main
from tests.executor.steps_for_tests import modules_loaded_by

PLAIN = [
    [],
    ["--prefix", "/tmp/out"],
    ["--prefix=s3://bucket/out", "--executor_info_base_path", "./experiments/x"],
    ["--prefix", "/a=b/c@d+e~f-g.h"],
    ["--dry_run", "true", "--force_run_failed", "False"],
    ["--dry_run=TRUE"],
    ["--max_concurrent", "4"],
    ["--max_concurrent", "0"],  # read as 0, then refused by the range check
    ["--lease_timeout", "30", "--lease_heartbeat", "0.5", "--lease_poll", "5."],
    ["--lease_timeout", "0"],
]

NOT_PLAIN = [
    ["--prefix", "yes"],  # YAML: True, so draccus makes it 'True'
    ["--prefix", "0x10/a:"],  # a trailing ':' makes a YAML mapping
    ["--prefix", "/a b"],
    ["--prefix", "/a", "--prefix", "/b"],
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
