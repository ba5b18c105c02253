"""Mutation testing of the executor and the data operations (mutmut 3), per module.

Not part of the default test run: it takes tens of minutes. It answers "would our tests
notice if this line were wrong?" by running, for every small change mutmut makes to a
function (a flipped comparison, a dropped argument, a constant off by one), the tests
that call that function, and counting the changes no test notices (survivors).

    .venv/bin/pip install mutmut                      # 3.x
    .venv/bin/python bench/mutation.py                # every target, HEAD, 2 workers
    .venv/bin/python bench/mutation.py executor dedup --commit HEAD --max-children 2
    .venv/bin/python bench/mutation.py executor/lease.py --survivors   # print survivors' diffs

Each target runs in its own scratch copy (`git archive <commit>` under `--workdir`), so
the working tree is never touched and edits made meanwhile do not leak into a run. The
copy gets the `[tool.mutmut]` section of pyproject.toml with the target's own
`only_mutate` and test selection (TARGETS below: the few test files that exercise the
module; mutmut then runs, per mutant, only the tests that reach the mutated function).

Kill rate = detected / (mutants - equivalent), where detected counts killed, timed-out
and crashed mutants, and a mutant no selected test reaches counts as a survivor.
Equivalent mutants (no behaviour changes, so no test can kill them) are listed in
EQUIVALENT with the reason; they are matched by function and mutated line, not by
mutmut's numbering, which shifts when code changes. See docs/testing.md.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import zlib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Runs in subprocesses of the tests. mutmut's trampolines read pyproject.toml from the
# working directory while they record which tests reach which function ("stats"); a
# test that starts a subprocess in a temporary directory would crash there. Such a
# subprocess runs the original code during stats (it could not report hits anyway) and
# the mutant under test afterwards (MUTANT_UNDER_TEST is inherited).
# mutmut's fork server ignores SIGINT ("the parent owns shutdown"), and a process started with
# SIGINT ignored keeps ignoring it: the drivers the Ctrl-C tests start in subprocesses never
# saw their Ctrl-C and the stats run timed out there. They get SIGINT as from a shell.
SITECUSTOMIZE = """\
import os
import signal
if os.environ.get("MUTANT_UNDER_TEST") == "stats" and not os.path.exists("pyproject.toml"):
    os.environ["MUTANT_UNDER_TEST"] = ""
if os.environ.get("MUTANT_UNDER_TEST") is not None and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
"""


@dataclass(frozen=True)
class Target:
    files: tuple[str, ...]
    """Source files to mutate (globs relative to the repository root)."""

    tests: tuple[str, ...]
    """Test files (or directories) whose tests may kill its mutants."""

    select: str = ""
    """A pytest -k expression that leaves out slow tests which add nothing here."""

    ignore: tuple[str, ...] = ()
    """Test files left out: ones that only run subprocesses teach mutmut nothing (it cannot see
    which functions a subprocess reaches) and cost minutes in its set-up runs."""

    isolation: str = "fork"
    """mutmut's process_isolation: "forkserver" where forking a process that has imported the
    tests' libraries deadlocks (JAX/Levanter threads)."""

    exclude: tuple[str, ...] = ()
    """Source files matched by `files` that are not mutated (mutmut's do_not_mutate)."""

    timeout_constant: float = 1.0
    """Seconds mutmut adds to each mutant's expected test time before calling it a timeout. Raise
    it where one test pays a module fixture's set-up that the time estimate charged to another."""


# test_untrusted_trees reads crafted output trees through executor.template and executor.tree.
_EXECUTOR_TESTS = ("tests/executor", "tests/marin/test_untrusted_trees.py")
# s3 runs the store contract against SeaweedFS (seconds to start, same code path as memory://).
# The script-line tests check which frame raised, and mutmut's trampolines add frames.
# A cached re-run's imports are checked in a subprocess, which imports the mutated copy: its
# trampolines bring mutmut, and with it `typing` and `threading`, into every process.
# (The drivers test_console_and_signals.py starts as subprocesses run with the mutated copy
# and its lease keepers under `python -S`: `ship_mutmut` puts mutmut beside that copy.)
_EXECUTOR_SELECT = (
    "not s3 and not test_an_invalid_step_name_at_the_top_of_a_script"
    " and not test_a_bad_declaration_at_the_top_of_a_script_is_one_line_with_its_place"
    " and not test_steps_that_log_are_shown_and_a_cached_rerun_never_imports_logging"
)
# Subprocess-only: the same CLI cases run in this process in test_mutation_guards.py.
# test_durable.py starts and kills whole drivers (experiment scripts in subprocesses): during
# mutmut's stats phase those run the trampolined copy, whose output never reached the test
# (its waits timed out and the run stopped); the hosted path is also run in-process by
# test_backends.py. test_heavy_interrupt_cleanup.py interrupts such drivers too (its driver
# exited at once in the stats run); the local backend's tests cover its temporary files.
_EXECUTOR_IGNORE = (
    "tests/executor/test_bad_cli.py",
    "tests/executor/test_main.py",
    "tests/executor/test_durable.py",
    "tests/executor/test_heavy_interrupt_cleanup.py",
)

TARGETS: dict[str, Target] = {
    # lease_keeper.py's process side runs in a process of its own, where mutmut's stats cannot
    # see which tests reach it: its mutants would all count as reached by no test. It is left
    # unmutated (see docs/testing.md).
    "executor": Target(
        ("executor/*.py",),
        _EXECUTOR_TESTS,
        _EXECUTOR_SELECT,
        _EXECUTOR_IGNORE,
        # _record_methods.py is generated (executor.records): its factories run at import, where
        # mutmut sees no test reach them; tests/executor/test_records.py pins the generator.
        exclude=("executor/lease_keeper.py", "executor/_record_methods.py"),
    ),
    # The backends alone (`executor/*.py` above covers them too: fnmatch's `*` crosses `/`). Their
    # code runs mostly in other processes (the local backend's child and heartbeat, the step
    # host, Ray actors); tests/executor/test_mutants_backends_*.py call it in this process.
    "backends": Target(("executor/backends/*.py",), _EXECUTOR_TESTS, _EXECUTOR_SELECT, _EXECUTOR_IGNORE),
    "safety": Target(
        ("marin/web/safety.py",),
        ("tests/marin/test_safety_mutants.py", "tests/marin/test_web.py"),
    ),
    "dedup": Target(
        ("operations/dedup.py",),
        ("tests/operations/test_dedup.py", "tests/operations/test_mutation_guards.py"),
    ),
    "filter": Target(
        ("operations/filter.py",),
        ("tests/operations/test_filter.py", "tests/operations/test_mutation_guards.py"),
    ),
    "tokenize": Target(
        ("operations/tokenize.py",),
        ("tests/operations/test_tokenize.py", "tests/operations/test_mutation_guards.py"),
        # The Ray builder test starts a Ray cluster per mutant; the in-process builder runs
        # the same build_caches / lm_data_config code.
        "not ray_builder",
        # A mutant's first Levanter test builds the module's caches (tens of CPU seconds), and
        # a fork of a process that has imported JAX can deadlock (no CPU used, so no timeout).
        isolation="forkserver",
        timeout_constant=120.0,
    ),
}
"""Named targets. A path like `executor/lease.py` is also a target: the executor's tests on that file."""

_CACHE_KEY = (
    "only the key of PrefixGuard's per-request cache of resolved directories changes: a miss recomputes"
)
_UTF8_DEFAULT = "unquote decodes UTF-8 by default"

_WALK_CACHE = (
    "the per-class verdicts are kept only for speed: without them each is worked out again, the same"
)
_TOO_DEEP_FIRST = (
    "depth only decides the too-deep refusal, which map_markers (same MAX_DEPTH, same counting) "
    "made in _collect before this walk"
)

_MARKER_VALUE = (
    "builder.concrete reads neither the path nor the depth, and a marker's value is a path string "
    "or a versioned value that _VersionBuilder.add encoded strictly at the same depth: strict or "
    "not, the same encoding, and never too deep"
)

EQUIVALENT: dict[tuple[str, str], str] = {
    ("_encode_mapped", "walk = None"): _WALK_CACHE,
    ("_encode_mapped", "walk = _DATACLASS_WALKS.get(None)"): _WALK_CACHE,
    (
        "_encode_mapped",
        "return encode(obj, path, None, depth)",
    ): "strict is only tested for truth: None as False",
    ("_encode_mapped", "return encode(obj, path, False, )"): _TOO_DEEP_FIRST,
    ("_encode_mapped", "return encode(on_marker(obj, path, depth), None, False, depth)"): (
        "the path only names a field in an error, and a marker's value raises none here: a path "
        "string, or a versioned value that _VersionBuilder.add encoded strictly already"
    ),
    ("encode_mapped", 'return _encode_mapped(obj, on_marker, "", 0, [True])'): (
        "the flag is set afresh at each dataclass and read only after its fields: its first value is never read"
    ),
    ("_holds_marker", "found.append(None)"): "only whether anything was found is read",
    ("encode_mapped", "return _encode_mapped(obj, on_marker, None, 0, [False])"): (
        "the root's path is only tested for truth (None as ''), except under a root list, which "
        "no step's config is (validate_declaration)"
    ),
    **{
        ("_encode_mapped", line): _MARKER_VALUE
        for line in (
            "return encode(on_marker(obj, path, depth), path, None, depth)",
            "return encode(on_marker(obj, path, depth), False, depth)",
            "return encode(on_marker(obj, path, depth), path, depth)",
            "return encode(on_marker(obj, path, depth), path, False, )",
            "return encode(on_marker(obj, None, depth), path, False, depth)",
            "return encode(on_marker(obj, path, None), path, False, depth)",
            "return encode(on_marker(obj, path, depth), path, True, depth)",
        )
    },
    ("_encode_mapped", 'item = _encode_mapped(item, on_marker, f"{path}[{index}]", depth - 1, state)'): (
        "a smaller depth refuses less, and map_markers refused whatever is too deep before this walk"
    ),
    ("_encode_mapped", "text = encode_key(key, None, out, path, False)"): (
        "the mapping only rides on the error (UnencodableValueError.value), never in its message"
    ),
    (
        "_encode_mapped",
        "text = encode_key(key, obj, out, path, None)",
    ): "strict is only tested for truth: None as False",
    **{
        (
            "_encode_mapped",
            line,
        ): "a smaller depth refuses less, and map_markers refused whatever is too deep before this walk"
        for line in (
            'value = _encode_mapped(value, on_marker, f"{path}.{text}" if path else text, depth - 1, state)',
            "depth -= 1",
            "return UNBUILT if _holds_marker(obj) else encode(obj, path, False, )",
        )
    },
    (
        "_encode_mapped",
        'value = _encode_mapped(value, on_marker, f"{path}.{text}" if (path) or True else text, depth + 1, state)',
    ): ("a dict is never the root (a step's config is a dataclass): its path is never empty"),
    ("_encode_mapped", "dataclasses.is_dataclass(obj) or not isinstance(obj, type)"): (
        "_holds_marker is False for anything but a container or a dataclass (map_markers returns "
        "other objects as they are, and leaves sets unchanged): the same encode follows, later"
    ),
    ("_encode_mapped", "return UNBUILT if _holds_marker(obj) else encode(obj, path, None, depth)"): (
        "strict is only tested for truth: None as False"
    ),
    **{
        ("_encode_mapped", line): (
            "a fast path: a field (or a marker's value) not known to be a leaf goes through "
            "_encode_mapped (or encode), which returns the same"
        )
        for line in (
            "value_kind = None",
            "value_kind = type(None)",
            "if value_kind is str or value_kind is int or value_kind is bool and value is None:",
            "if value_kind is str or value_kind is int and value_kind is bool or value is None:",
            "if not (value_kind is str or value_kind is int or value_kind is bool and value is None):",
            "if not (value_kind is str and value_kind is int or value_kind is bool or value is None):",
            "if value_kind is str and value_kind is int or value_kind is bool or value is None:",
            "if not (value_kind is str or value_kind is int and value_kind is bool or value is None):",
        )
    },
    **{
        ("_encode_mapped", line): _MARKER_VALUE
        for line in ("value = on_marker(value, None, depth)", "value = on_marker(value, child, None)")
    },
    ("PrefixGuard._real", 'key = "XX/XX".join(parts[: index + 1])'): _CACHE_KEY,
    (
        "_sample_key",
        'return int.from_bytes(hashlib.blake2b(document_id.encode("utf-8"), digest_size=8).digest(), )',
    ): ("int.from_bytes reads big-endian by default (Python 3.11+)"),
    ("_merge_samples", 'by_rule.setdefault(sample["rule"], None).append(sample)'): (
        "every sample's rule is a key already (by_rule starts with all configured rules)"
    ),
    ("PrefixGuard._real", "cached = self._resolved.get(None)"): _CACHE_KEY,
    ("PrefixGuard._real", "cached = None"): _CACHE_KEY,
    ("PrefixGuard._real", "self._resolved[key] = None"): _CACHE_KEY,
    ("PrefixGuard._real", 'current = self.local_root or "XXXX"'): "_real runs only when local_root is set",
    (
        "PrefixGuard.__init__",
        "self.store = None",
    ): "PrefixGuard.store is read only in __init__ (to find the local root)",
    ("decode_path", 'decoded = unquote(raw_path, encoding=None, errors="strict")'): _UTF8_DEFAULT,
    ("decode_path", 'decoded = unquote(raw_path, errors="strict")'): _UTF8_DEFAULT,
    # executor/logs.py
    (
        "_open_temp",
        'return tempfile.NamedTemporaryFile("w+", encoding="utf-8", suffix=None, delete=False)  # noqa: SIM115',
    ): "only the name of the step log's local buffer changes (a temporary file, deleted after the upload)",
    (
        "_open_temp",
        'return tempfile.NamedTemporaryFile("w+", encoding="utf-8", delete=False)  # noqa: SIM115',
    ): "only the name of the step log's local buffer changes (a temporary file, deleted after the upload)",
    (
        "_open_temp",
        'return tempfile.NamedTemporaryFile("w+", encoding="utf-8", suffix="XX.logXX", delete=False)  # noqa: SIM115',
    ): "only the name of the step log's local buffer changes (a temporary file, deleted after the upload)",
    (
        "_open_temp",
        'return tempfile.NamedTemporaryFile("w+", encoding="utf-8", suffix=".LOG", delete=False)  # noqa: SIM115',
    ): "only the name of the step log's local buffer changes (a temporary file, deleted after the upload)",
    (
        "_open_temp",
        'return tempfile.NamedTemporaryFile("w+", encoding="utf-8", suffix=".log", delete=None)  # noqa: SIM115',
    ): "delete=None is falsy like False: the buffer is kept for the upload either way",
    ("_uninstall", '_handler = ""'): (
        "_handler is read only by _uninstall after an _install has set it again; '' and None are never seen"
    ),
    # executor/steps.py: _is_valid_name is a fast path. A name it refuses is checked again by
    # _name_problem, which gives the same verdict (pinned by test_the_fast_name_check_agrees_with_the_explained_one),
    # so a mutant that only makes it refuse more names changes nothing but speed.
    (
        "_is_valid_name",
        'or not name.replace("/", "XXaXX").replace("_", "a").replace("-", "a").replace(".", "a").isalnum()',
    ): "only a fast path changes: _name_problem re-checks every name it refuses, with the same verdict",
    (
        "_is_valid_name",
        'or not name.replace("/", "A").replace("_", "a").replace("-", "a").replace(".", "a").isalnum()',
    ): "only a fast path changes: _name_problem re-checks every name it refuses, with the same verdict",
    (
        "_is_valid_name",
        'or not name.replace("/", "a").replace("XX_XX", "a").replace("-", "a").replace(".", "a").isalnum()',
    ): "only a fast path changes: _name_problem re-checks every name it refuses, with the same verdict",
    (
        "_is_valid_name",
        'or not name.replace("/", "a").replace("_", "XXaXX").replace("-", "a").replace(".", "a").isalnum()',
    ): "only a fast path changes: _name_problem re-checks every name it refuses, with the same verdict",
    (
        "_is_valid_name",
        'or not name.replace("/", "a").replace("_", "A").replace("-", "a").replace(".", "a").isalnum()',
    ): "only a fast path changes: _name_problem re-checks every name it refuses, with the same verdict",
    (
        "_is_valid_name",
        'or not name.replace("/", "a").replace("_", "a").replace("-", "XXaXX").replace(".", "a").isalnum()',
    ): "only a fast path changes: _name_problem re-checks every name it refuses, with the same verdict",
    (
        "_is_valid_name",
        'or not name.replace("/", "a").replace("_", "a").replace("-", "A").replace(".", "a").isalnum()',
    ): "only a fast path changes: _name_problem re-checks every name it refuses, with the same verdict",
    (
        "_is_valid_name",
        'or not name.replace("/", "a").replace("_", "a").replace("-", "a").replace(".", "XXaXX").isalnum()',
    ): "only a fast path changes: _name_problem re-checks every name it refuses, with the same verdict",
    (
        "_is_valid_name",
        'or not name.replace("/", "a").replace("_", "a").replace("-", "a").replace(".", "A").isalnum()',
    ): "only a fast path changes: _name_problem re-checks every name it refuses, with the same verdict",
    (
        "check_step_name",
        "if type(None) is str and _is_valid_name(name):",
    ): "only a fast path changes: _name_problem re-checks every name it refuses, with the same verdict",
    (
        "_check_resources",
        'if type(resources) is ResourceConfig and (type(resources) is dict and "__type__" not in resources):',
    ): "only the early return is skipped: ResourceConfig.from_value returns a ResourceConfig or a plain dict as it is",
    (
        "_check_resources",
        'if type(None) is ResourceConfig or (type(resources) is dict and "__type__" not in resources):',
    ): "only the early return is skipped: ResourceConfig.from_value returns a ResourceConfig or a plain dict as it is",
    (
        "_check_resources",
        'if type(resources) is ResourceConfig or (type(None) is dict and "__type__" not in resources):',
    ): "only the early return is skipped: ResourceConfig.from_value returns a ResourceConfig or a plain dict as it is",
    # executor/tree.py
    (
        "StatusEvent.from_json",
        "return StatusEvent(date=date, status=Status.SUCCESS, worker=worker, extra=extra)",
    ): "message defaults to None",
    (
        "StatusEvent.from_json",
        "for key, value in zip(_STRING_FIELDS, strings, strict=None):",
    ): "both tuples always have 5 items, so `strict` never fires",
    (
        "StatusEvent.from_json",
        "for key, value in zip(_STRING_FIELDS, strings, ):",
    ): "both tuples always have 5 items, so `strict` never fires",
    (
        "read_last_status",
        'newline = data.rfind(b"\\n", 0, len(data.rstrip()))',
    ): "only the last line is parsed: cutting the tail at its last newline instead of its first keeps that line",
    (
        "read_last_status",
        "if newline > 0:",
    ): "a tail starting with a newline is then read again, longer: the same last line, one read more",
    (
        "read_last_status",
        "if newline >= 1:",
    ): "a tail starting with a newline is then read again, longer: the same last line, one read more",
    (
        "_read_tail",
        "local = None",
    ): "LocalStore's fs (fsspec's local filesystem) reads the same bytes and raises the same errors; only the syscalls differ",
    ("_read_tail", "return None, False"): "callers test the data for None before looking at `whole`",
    (
        "_read_tail",
        "return data, limit is None or info.st_size < limit",
    ): "a tail of exactly the file's size is then cut at its first newline or read again whole: the same last line",
    (
        "StatusEvent.from_json",
        "fast = None",
    ): "only the fast path for the runner's SUCCESS lines is skipped: json.loads reads them to the same event",
    (
        "StatusEvent.from_json",
        "for key, value in zip(_STRING_FIELDS, strings, strict=False):",
    ): "both tuples always have 5 items, so `strict` never fires",
    (
        "utc_now_iso",
        "if cached[1] != second:  # strftime once per second, not once per status line",
    ): "only the per-second cache is disabled (a str never equals an int): the text is recomputed, the same",
    (
        "read_last_status",
        "local = None",
    ): "only the one-read fast path for local files is skipped: _read_tail reads the same last line",
    ("read_last_status", 'newline = data.find(b"\\n", None, len(data.rstrip()))'): "a start of None is 0",
    (
        "read_last_status",
        'newline = data.find(b"\\n", 1, len(data.rstrip()))',
    ): "a newline at 0 is then missed and the tail read again, longer: the same last line, one read more",
    (
        "_read_tail",
        "raise IsADirectoryError(None)",
    ): "the IsADirectoryError is caught below and replaced by a StatusFileError naming the path",
    ("_read_tail", "while chunk := os.pread(fd, 2 << 20, start):"): "only the read chunk size changes",
    ("_read_tail", "while chunk := os.pread(fd, 1 << 21, start):"): "only the read chunk size changes",
    ("_plain", "return encode(value, strict=None)"): "strict=None is falsy like False",
    # executor/main.py
    (
        "_decoding_message",
        'reason = reason.split(": ", 1)[-1] if reason.startswith(("int:", "float:", "bool:", "XXstr:XX")) else reason',
    ): "no flag's value fails to decode as a str (draccus makes any YAML value a string), so no reason starts with 'str:'",
    (
        "_decoding_message",
        'reason = reason.split(": ", 1)[-1] if reason.startswith(("int:", "float:", "bool:", "STR:")) else reason',
    ): "no flag's value fails to decode as a str (draccus makes any YAML value a string), so no reason starts with 'str:'",
    (
        "_describe_os_error",
        'where = f" on {error.filename}" if getattr(error, "filename", ) else ""',
    ): "every OSError has a `filename` attribute (None when unset)",
    (
        "parse_flags",
        "config = None",
    ): "only the fast path is skipped: draccus parses every flag list _parse_plain accepts to the same config",
    (
        "_decoding_message",
        'flag = "XX.XX".join(str(part) for part in error.key_path)',
    ): "ExecutorMainConfig is flat: a key path has one part, so the separator is never used",
    (
        "_decoding_message",
        'reason = reason.split(None, 1)[-1] if reason.startswith(("int:", "float:", "bool:", "str:")) else reason',
    ): "draccus writes '<type>: <reason>': splitting at the first whitespace or at ': ' gives the same reason",
    (
        "_decoding_message",
        'reason = reason.split(": ", 1)[+1] if reason.startswith(("int:", "float:", "bool:", "str:")) else reason',
    ): "draccus writes '<type>: <reason>': the split has exactly two parts, so [1] is [-1]",
    (
        "_decoding_message",
        'reason = reason.split(": ", 1)[-1] if reason.startswith(("int:", "float:", "XXbool:XX", "str:")) else reason',
    ): "no bool flag is Optional (a union), so draccus never prefixes a reason with 'bool:'",
    (
        "_decoding_message",
        'reason = reason.split(": ", 1)[-1] if reason.startswith(("int:", "float:", "BOOL:", "str:")) else reason',
    ): "no bool flag is Optional (a union), so draccus never prefixes a reason with 'bool:'",
    # (function or Class.method, the mutated line, stripped) -> why no test can tell the mutant from the original
    ("map_markers", "if all(new is old for new, old in zip(items, obj, strict=None)):"): (
        "`items` is built from `obj`, so the lengths always match and `strict` never fires"
    ),
    ("map_markers", "if all(new is old for new, old in zip(items, obj, )):"): (
        "`items` is built from `obj`, so the lengths always match and `strict` never fires"
    ),
    ("_collect", "inputs = inputs_cache.get(None)"): (
        "only a cache: a step's markers and inputs are found again, the same each time (the walk is "
        "deterministic and raised the first time if it raises at all)"
    ),
    ("_is_valid_name", "if len(name) >= MAX_LAST_NAME_PART and _long_part(name) is not None:"): (
        "a name exactly MAX_LAST_NAME_PART long has no part over the limits, so _long_part returns None"
    ),
    ("LocalStore.read_bytes", "while chunk := os.read(fd, 1 << 17):"): (
        "the loop reads to the end in chunks of any size"
    ),
    ("map_markers", "child_kind = None"): (
        "only a shortcut: a leaf child then goes through map_markers, which returns it as it is, and "
        "a marker child through map_markers's own isinstance check to the same callback"
    ),
    # executor/lease.py
    ("LeaseManager.try_acquire", "if current is not None and not self.is_stale(record, ):"): (
        "is_stale without `now` reads the clock itself, microseconds after `now` was read"
    ),
    ("LeaseManager.try_acquire", "if current is not None and not self.is_stale(record, None):"): (
        "is_stale with now=None reads the clock itself, microseconds after `now` was read"
    ),
    ("LeaseManager.confirm", "written = self._written.get(output_path, 1.0)"): (
        "_written is set whenever _held is, and confirm returns before using `written` when _held "
        "has no entry"
    ),
    ("LeaseManager.release", "self._written.pop(None, None)"): (
        "a stale _written entry is never read: confirm needs _held first, and try_acquire rewrites it"
    ),
    ("LeaseManager.close", "self._thread.join(timeout=self.config.heartbeat_interval + 6)"): (
        "the join bound only matters if the heartbeat thread hangs; it wakes at once when _stop is set"
    ),
    # executor/store.py
    ("Store.list_dir", 'name = entry["name"].rstrip("/").rsplit("/", 1)[+1]'): (
        "fsspec names a listed child by its full path, so the split has exactly two parts: [1] is [-1]"
    ),
    # executor/runner.py
    ("Runner._run_holding_lease", "if self.leases.was_lost(None) or not self.leases.confirm(path):"): (
        "a lease marked lost is no longer held, so confirm(path) is False for it anyway"
    ),
    # executor/plan.py
    ("make_plan", "dep_names = [names.get(p, ) for p in step.dependencies]"): (
        "every dependency of a resolved step is a step of the graph, so `names` always has it"
    ),
    ("_plan_step", "if lease is not None and not leases.is_stale(lease, ):"): (
        "is_stale without `now` reads the clock itself, milliseconds after make_plan read `now`"
    ),
    ("make_plan", "now = None"): (
        "`now` only reaches is_stale, which reads the clock itself when given None, milliseconds later"
    ),
}


# executor/template.py: encode_template threads the field path (`path`) down to nested calls, but
# nothing it returns reads it and it raises nothing, so a mutant that changes only the path is
# equivalent. A MirroredValue holds a str or versioned(str) (mirrored() refuses anything else), so
# encoding it never calls output_path_of.
_ENCODE_PATH = (
    "encode_template's `path` is only passed down: nothing it returns reads it, and it raises nothing"
)
_MIRRORED_PATH = "a MirroredValue holds a str or versioned(str), so encoding it never calls output_path_of"
_LOCALS = "'<locals>' is not an identifier, so the second test refuses it anyway, with the same message"
EQUIVALENT.update(
    {
        ("TrustedCode.resolve", 'if part == "<LOCALS>" or not part.isidentifier():'): _LOCALS,
        ("TrustedCode.resolve", 'if part == "XX<locals>XX" or not part.isidentifier():'): _LOCALS,
        ("encode_template", 'return f"{path}.{key}" if (path) and False else key'): _ENCODE_PATH,
        ("encode_template", 'return f"{path}.{key}" if (path) or True else key'): _ENCODE_PATH,
        (
            "encode_template",
            'return {"__versioned__": encode_template(value.value, output_path_of, None)}',
        ): _ENCODE_PATH,
        (
            "encode_template",
            'return {"__versioned__": encode_template(value.value, output_path_of, )}',
        ): _ENCODE_PATH,
        (
            "encode_template",
            '"__mirrored__": encode_template(value.value, output_path_of, None),',
        ): _ENCODE_PATH,
        ("encode_template", '"__mirrored__": encode_template(value.value, output_path_of, ),'): _ENCODE_PATH,
        (
            "encode_template",
            "f.name: encode_template(getattr(value, f.name), output_path_of, None)",
        ): _ENCODE_PATH,
        (
            "encode_template",
            "f.name: encode_template(getattr(value, f.name), output_path_of, )",
        ): _ENCODE_PATH,
        (
            "encode_template",
            "f.name: encode_template(getattr(value, f.name), output_path_of, child(None))",
        ): _ENCODE_PATH,
        (
            "encode_template",
            '"__tuple__": [encode_template(v, output_path_of, None) for i, v in enumerate(value)]',
        ): _ENCODE_PATH,
        (
            "encode_template",
            '"__tuple__": [encode_template(v, output_path_of, ) for i, v in enumerate(value)]',
        ): _ENCODE_PATH,
        (
            "encode_template",
            "return [encode_template(v, output_path_of, None) for i, v in enumerate(value)]",
        ): _ENCODE_PATH,
        (
            "encode_template",
            "return [encode_template(v, output_path_of, ) for i, v in enumerate(value)]",
        ): _ENCODE_PATH,
        (
            "encode_template",
            "items = [encode_template(v, output_path_of, None) for v in value]",
        ): _ENCODE_PATH,
        ("encode_template", "items = [encode_template(v, output_path_of, ) for v in value]"): _ENCODE_PATH,
        (
            "encode_template",
            '"__dict__": [[k, encode_template(v, output_path_of, None)] for k, v in value.items()]',
        ): _ENCODE_PATH,
        (
            "encode_template",
            '"__dict__": [[k, encode_template(v, output_path_of, )] for k, v in value.items()]',
        ): _ENCODE_PATH,
        (
            "encode_template",
            '"__dict__": [[k, encode_template(v, output_path_of, child(None))] for k, v in value.items()]',
        ): _ENCODE_PATH,
        (
            "encode_template",
            "return {k: encode_template(v, output_path_of, None) for k, v in value.items()}",
        ): _ENCODE_PATH,
        (
            "encode_template",
            "return {k: encode_template(v, output_path_of, ) for k, v in value.items()}",
        ): _ENCODE_PATH,
        (
            "encode_template",
            "return {k: encode_template(v, output_path_of, child(None)) for k, v in value.items()}",
        ): _ENCODE_PATH,
        (
            "encode_template",
            "[encode_template(k, output_path_of, None), encode_template(v, output_path_of, child(str(k)))]",
        ): _ENCODE_PATH,
        (
            "encode_template",
            "[encode_template(k, output_path_of, ), encode_template(v, output_path_of, child(str(k)))]",
        ): _ENCODE_PATH,
        (
            "encode_template",
            "[encode_template(k, output_path_of, path), encode_template(v, output_path_of, None)]",
        ): _ENCODE_PATH,
        (
            "encode_template",
            "[encode_template(k, output_path_of, path), encode_template(v, output_path_of, )]",
        ): _ENCODE_PATH,
        (
            "encode_template",
            "[encode_template(k, output_path_of, path), encode_template(v, output_path_of, child(None))]",
        ): _ENCODE_PATH,
        (
            "encode_template",
            "[encode_template(k, output_path_of, path), encode_template(v, output_path_of, child(str(None)))]",
        ): _ENCODE_PATH,
        ("encode_template", '"__mirrored__": encode_template(value.value, None, path),'): _MIRRORED_PATH,
        ("encode_template", '"__mirrored__": encode_template(value.value, path),'): _MIRRORED_PATH,
    }
)


# executor/backends
_MKSTEMP = (
    "only the names of the child's payload and result files change (temporary files it is given by path)"
)
_PEERS_ZIP = "_Peers is built from the gang's member actors and their pending results: always as many of each"
_NOT_TPU = "only CpuConfig and GpuConfig are not TPUs, and neither has a host_count: the default 1 is used either way"
EQUIVALENT.update(
    {
        # child.py / local.py: the result is JSON with ensure_ascii (json.dump's default): ASCII in any encoding
        (
            "main",
            'with open(temp, "w", encoding=None) as handle:',
        ): "json.dump writes ASCII only (ensure_ascii)",
        ("_read_result", "with open(result_path, encoding=None) as handle:"): (
            "the child writes its result with json.dump's ensure_ascii: ASCII reads the same in any encoding"
        ),
        # heartbeat.py
        ("main", "signal.signal(signal.SIGTERM, lambda *_: stop.append(None))"): (
            "`while not stop` tests the list, and [None] is as non-empty as [True]"
        ),
        (
            "_die_with_parent",
            "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG",
        ): ("dlopen(NULL) finds libc's prctl among the process's global symbols: the same call"),
        # host.py
        ("run_hosted", 'gang_lost = ""'): "gang_lost is only tested for truth, and '' is as false as None",
        ("_start_heartbeat", '"bytes": mine.decode("LATIN-1"),'): "codec names are case-insensitive",
        # local.py
        ("request_of", 'kind = getattr(device, "kind", "XXcpuXX")'): (
            "a device without `kind` is then neither 'tpu' nor 'gpu': no GPUs, as for 'cpu'"
        ),
        ("request_of", 'kind = getattr(device, "kind", "CPU")'): (
            "a device without `kind` is then neither 'tpu' nor 'gpu': no GPUs, as for 'cpu'"
        ),
        # __init__.py
        (
            "child_env",
            'env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", None)) if p)',
        ): ("a missing PYTHONPATH is dropped by `if p` whether it reads as '' or None"),
        # ray_cluster.py
        (
            "_choices",
            'hosts = getattr(device, "host_count", 1) if (device.kind == "tpu") or True else 1',
        ): _NOT_TPU,
        ("_choices", 'hosts = getattr(device, "host_count", 2) if device.kind == "tpu" else 1'): (
            "TpuConfig always has host_count: the default is never used"
        ),
        ("StepHost.coordinator_address", "with socket.socket(socket.AF_INET, ) as probe:"): (
            "SOCK_STREAM is socket.socket's default type"
        ),
        ("Runner._next_startable", "return ready[0] if (ready) or True else None"): (
            "called only while `ready or running`: with nothing running, `ready` is never empty"
        ),
        ("_reserve_slices", "selector: dict[str, str] = None"): (
            "the selector is only tested for truth (`if selector:`), and None is as false as {}"
        ),
        ("_reserve_slices", "for actor, info in zip(actors, infos, ):"): (
            "`infos` are the values of one get_info call per actor: always as many as `actors`"
        ),
        ("_Peers.lost", "for actor, result in zip(self.actors, self.results, ):"): _PEERS_ZIP,
        ("_Peers.lost", "for actor, result in zip(self.actors, self.results, strict=None):"): _PEERS_ZIP,
        ("_Peers.lost", "for actor, result in zip(self.actors, self.results, strict=False):"): _PEERS_ZIP,
    }
)


# executor/plan.py
_STATUS_ZIP = "`flat` is built from `steps` (one status per step, in order): always as many of each"
EQUIVALENT.update(
    {
        (
            "_read_statuses",
            "return {step.output_path: event for step, event in zip(steps, flat, strict=False)}",
        ): _STATUS_ZIP,
        (
            "_read_statuses",
            "return {step.output_path: event for step, event in zip(steps, flat, strict=None)}",
        ): _STATUS_ZIP,
        (
            "_read_statuses",
            "return {step.output_path: event for step, event in zip(steps, flat, )}",
        ): _STATUS_ZIP,
    }
)


EQUIVALENT_PATTERNS: list[tuple[str, str]] = [
    # (regex, why): a one-line mutant whose old and new lines differ only inside matches of
    # the regex changes nothing a test can observe.
    (r'\b(desc|description)=("[^"]*"|None)', "only the label of a progress bar (tqdm / map_shards) changes"),
    (r"\bleave=(False|True|None)", "only whether a finished progress bar stays on screen changes"),
    (r'"(utf-8|UTF-8)"', "codec names are case-insensitive: 'UTF-8' is 'utf-8'"),
    (r"tempfile\.mkstemp\(.*\)", _MKSTEMP),
]


def equivalent_reason(function: str, removed: list[str], added: list[str]) -> str | None:
    """Why the mutant (its removed and added lines, stripped) is equivalent, or None."""
    for line in added:
        if (function, line) in EQUIVALENT:
            return EQUIVALENT[(function, line)]
    if len(removed) != 1 or len(added) != 1:
        return None
    for pattern, why in EQUIVALENT_PATTERNS:
        if re.search(pattern, removed[0]) and re.sub(pattern, "_", removed[0]) == re.sub(
            pattern, "_", added[0]
        ):
            return why
    return None


def target_for(name: str) -> Target:
    if name in TARGETS:
        return TARGETS[name]
    if name.startswith("executor/") and name.endswith(".py"):
        return Target((name,), _EXECUTOR_TESTS, _EXECUTOR_SELECT, _EXECUTOR_IGNORE)
    raise SystemExit(f"unknown target {name!r}: use one of {', '.join(TARGETS)} or executor/<file>.py")


@dataclass
class Report:
    name: str
    commit: str
    mutants: int = 0
    killed: int = 0
    timeout: int = 0
    crashed: int = 0
    survived: list[str] = field(default_factory=list)
    no_tests: list[str] = field(default_factory=list)
    not_checked: int = 0
    unchecked: list[str] = field(default_factory=list)
    timeouts: list[str] = field(default_factory=list)
    sample: int = 1
    equivalent: dict[str, str] = field(default_factory=dict)
    per_file: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0
    diffs: dict[str, str] = field(default_factory=dict)

    @property
    def detected(self) -> int:
        return self.killed + self.timeout + self.crashed

    @property
    def rate(self) -> float:
        denominator = self.mutants - len(self.equivalent) - self.not_checked
        return self.detected / denominator if denominator else 1.0

    def line(self) -> str:
        return (
            f"{self.name}: {self.rate:.1%} killed ({self.detected} of "
            f"{self.mutants - len(self.equivalent) - self.not_checked}; {self.killed} killed, "
            f"{self.timeout} timeout, {self.crashed} crashed, {len(self.survived)} survived, "
            f"{len(self.no_tests)} reached by no test, {len(self.equivalent)} equivalent excluded, "
            f"{self.not_checked} not checked) in {self.seconds:.0f} s at {self.commit[:10]}"
            + (f"; 1-in-{self.sample} sample" if self.sample > 1 else "")
        )


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()


def prepare(workdir: Path, commit: str, target: Target, reuse: bool = False) -> None:
    """A copy of the repository at `commit` with the target's mutmut configuration.

    Fresh unless `reuse`: then the files of `commit` replace those of an earlier run's copy
    and its `mutants/` (mutmut's cache of verdicts and of which tests reach what) is kept.
    """
    if workdir.exists() and not reuse:
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("executor", "operations", "marin", "tests", "experiments", "bench"):
        if reuse and (workdir / name).exists():
            shutil.rmtree(workdir / name)  # files deleted since must not linger
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(workdir)], input=archive, check=True)
    (workdir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    shipped = ship_mutmut(workdir)
    pyproject = (workdir / "pyproject.toml").read_text()
    base = tomllib.loads(pyproject).get("tool", {}).get("mutmut", {})
    # Drop the committed section; write the target's (same keys, target-specific values).
    pyproject = re.sub(r"\n\[tool\.mutmut\]\n(?:(?!\n\[).)*", "\n", pyproject, flags=re.S)
    settings = {
        "source_paths": base.get("source_paths", ["executor", "operations", "marin"]),
        "only_mutate": list(target.files),
        "do_not_mutate": list(target.exclude),
        "also_copy": ["sitecustomize.py", *shipped, *base.get("also_copy", ["experiments", "bench"])],
        # Test files added later are skipped at commits that lack them ("before" runs).
        "pytest_add_cli_args_test_selection": [t for t in target.tests if (workdir / t).exists()],
        "pytest_add_cli_args": [
            *base.get("pytest_add_cli_args", ["-p", "no:cacheprovider"]),
            *(["-k", target.select] if target.select else []),
            *(f"--ignore={path}" for path in target.ignore),
        ],
        "timeout_multiplier": base.get("timeout_multiplier", 10.0),
        "timeout_constant": target.timeout_constant,
        "process_isolation": target.isolation,
    }
    lines = ["", "[tool.mutmut]"] + [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    (workdir / "pyproject.toml").write_text(pyproject.rstrip() + "\n" + "\n".join(lines) + "\n")


def ship_mutmut(workdir: Path) -> list[str]:
    """Copy mutmut itself (package and metadata) into `workdir`; the names, for `also_copy`.

    A mutated module imports mutmut's trampolines. Tests that start a driver in a subprocess
    set PYTHONPATH to the mutated copy, and that driver's lease keeper runs under `python -S`
    (no site-packages): without mutmut beside the copy, the keeper died on its first import,
    every lease of that driver was "lost to another driver", and mutmut's stats run failed on
    whichever such test came first (docs/testing.md, fifteenth session). The copy under
    `mutants/` is the installed mutmut, byte for byte.
    """
    import importlib.metadata

    distribution = importlib.metadata.distribution("mutmut")
    site = Path(distribution.locate_file(""))
    names = []
    metadata_dir = next(str(f.parent) for f in distribution.files or () if f.name == "METADATA")
    for name in ("mutmut", metadata_dir):
        source = site / name
        if (workdir / name).exists():
            shutil.rmtree(workdir / name)
        shutil.copytree(source, workdir / name, ignore=shutil.ignore_patterns("__pycache__"))
        names.append(name)
    return names


def write_timeout_constant(workdir: Path, target: Target) -> None:
    """Set the target's timeout_constant and process_isolation in the copy's [tool.mutmut] section."""
    path = workdir / "pyproject.toml"
    text = re.sub(r"\n(timeout_constant|process_isolation) = [^\n]*", "", path.read_text())
    path.write_text(
        text.rstrip()
        + f"\ntimeout_constant = {json.dumps(target.timeout_constant)}"
        + f"\nprocess_isolation = {json.dumps(target.isolation)}\n"
    )


def mutmut_binary() -> str:
    candidate = Path(sys.executable).parent / "mutmut"
    if not candidate.exists():
        raise SystemExit("mutmut is not installed: .venv/bin/pip install mutmut")
    return str(candidate)


def _mutmut_env(workdir: Path, **extra: str) -> dict[str, str]:
    """The environment for mutmut and the tests it runs.

    The mutated copy (`<workdir>/mutants`) goes first on PYTHONPATH: a test that starts Python
    in a subprocess without setting PYTHONPATH imported `executor` through the editable install,
    i.e. from the working tree -- edits made there meanwhile leaked into the run (found when an
    uncommitted change failed mutmut's stats run, fifteenth session). site-packages goes on it
    too: the lease keeper runs under `python -S` (no site) and imports executor.store and
    executor.tree, whose mutated copies import mutmut's trampolines; -S ignores site but not
    PYTHONPATH. (Tests that set PYTHONPATH to the copy themselves find mutmut beside it:
    `ship_mutmut`.)
    """
    import sysconfig

    path = [
        str(workdir / "mutants"),
        sysconfig.get_paths()["purelib"],
        *filter(None, [os.environ.get("PYTHONPATH")]),
    ]
    return {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": os.pathsep.join(path), **extra}


def run_mutmut(
    workdir: Path, max_children: int, timeout: float, log: Path, mutants: list[str] | None = None
) -> bool:
    """Run mutmut in `workdir` (only `mutants`, when given); False when it ran out of time."""
    env = _mutmut_env(workdir)
    with open(log, "a") as out:
        process = subprocess.Popen(
            [
                "nice",
                "-n",
                "10",
                mutmut_binary(),
                "run",
                "--max-children",
                str(max_children),
                *(mutants or []),
            ],
            cwd=workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 15)
            process.wait()
            return False
    return process.returncode == 0


STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", None: "not checked"}
TIMEOUT_CODES = {24, -24, 36, 152, 255}
CRASH_CODES = {-9, -11}


def function_sources(path: Path) -> dict[str, str]:
    tree = ast.parse(path.read_text())
    text = path.read_text().splitlines()
    return {
        node.name: "\n".join(text[node.lineno - 1 : node.end_lineno])
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def mutant_diff(sources: dict[str, str], mutant: str) -> tuple[str, list[str]]:
    """(original function name, the mutated lines) of `mutant` (a `module.x_fn__mutmut_N` name)."""
    local = mutant.rsplit(".", 1)[-1]
    original = re.sub(r"__mutmut_\d+$", "__mutmut_orig", local)
    before, after = sources.get(original, ""), sources.get(local, "")
    lines = [
        line
        for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and line[:3] not in ("+++", "---") and "__mutmut_" not in line  # not the def line
    ]
    parts = re.sub(r"__mutmut_\d+$", "", local).split("ǁ")  # x_fn, or x, Class, method
    function = parts[0].removeprefix("x_") if len(parts) == 1 else ".".join(parts[1:])
    return function, lines


def in_sample(mutant: str, sample: int) -> bool:
    """A 1-in-`sample` selection by a hash of the mutant's name: stable across runs, and
    spread over small functions as well as large ones."""
    return sample == 1 or zlib.crc32(mutant.encode()) % sample == 0


def run_direct(workdir: Path, target: Target, names: list[str], max_children: int, timeout: float) -> None:
    """Test `names` without mutmut's runner: per mutant, pytest on the test files that reach its
    function (mutmut's recorded stats), in a fresh process with MUTANT_UNDER_TEST set. Results
    go into mutmut's .meta files, so `collect` reads them as usual.

    A fallback for when mutmut's in-process runner refuses a test selection (it reported a
    usage error, exit 4, for this project's executor suite while the same tests pass alone).
    """
    from concurrent.futures import ThreadPoolExecutor

    mutants = workdir / "mutants"
    recorded = json.loads((mutants / "mutmut-stats.json").read_text())
    stats, durations = recorded["tests_by_mangled_function_name"], recorded["duration_by_test"]
    extra = [*(["-k", target.select] if target.select else []), *(f"--ignore={p}" for p in target.ignore)]
    listing = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            *extra,
            *target.tests,
        ],
        cwd=mutants,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    existing = {line.strip() for line in listing if "::" in line}

    def one(mutant: str) -> tuple[str, int]:
        function = re.sub(r"__mutmut_\d+$", "", mutant)
        tests = sorted(
            (t for t in stats.get(function, ()) if t in existing), key=lambda t: durations.get(t, 0)
        )
        if not tests:
            return mutant, 33
        env = _mutmut_env(workdir, MUTANT_UNDER_TEST=mutant)
        command = ["nice", "-n", "10", sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
        try:
            result = subprocess.run(
                [*command, *tests], cwd=mutants, env=env, capture_output=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return mutant, 36
        code = result.returncode
        return mutant, {0: 0, 5: 5, 4: 4}.get(code, 1)

    with ThreadPoolExecutor(max_workers=max_children) as pool:
        results = dict(pool.map(one, names))
    for meta in (workdir / "mutants").rglob("*.py.meta"):
        data = json.loads(meta.read_text())
        codes = data.get("exit_code_by_key", {})
        changed = {k: results[k] for k in codes if k in results}
        if changed:
            codes.update(changed)
            meta.write_text(json.dumps(data, indent=4))


def collect(workdir: Path, name: str, commit: str, sample: int = 1) -> Report:
    report = Report(name=name, commit=commit, sample=sample)
    for meta in sorted((workdir / "mutants").rglob("*.py.meta")):
        source_file = str(meta.relative_to(workdir / "mutants"))[: -len(".meta")]
        data = json.loads(meta.read_text())
        codes = data.get("exit_code_by_key", {})
        if not codes:
            continue
        sources = function_sources(meta.with_suffix(""))
        counts = {"mutants": 0, "detected": 0, "equivalent": 0}
        for mutant, code in codes.items():
            if not in_sample(mutant, sample):
                continue
            report.mutants += 1
            function, lines = mutant_diff(sources, mutant)
            added = [line[1:].strip() for line in lines if line.startswith("+")]
            removed = [line[1:].strip() for line in lines if line.startswith("-")]
            reason = equivalent_reason(function, removed, added)
            if code is not None or reason is not None:
                counts["mutants"] += 1
            if reason is not None:
                report.equivalent[mutant] = reason
                counts["equivalent"] += 1
                continue
            if code in TIMEOUT_CODES:
                report.timeout += 1
                report.timeouts.append(mutant)
            elif code in CRASH_CODES:
                report.crashed += 1
            elif STATUS.get(code, "suspicious") == "killed":
                report.killed += 1
            elif code is None:
                report.not_checked += 1
                report.unchecked.append(mutant)
                continue
            else:
                (report.no_tests if STATUS.get(code) == "no tests" else report.survived).append(mutant)
                report.diffs[mutant] = f"{source_file} {function}:\n" + "\n".join(lines)
                continue
            counts["detected"] += 1
        report.per_file[source_file] = counts
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("targets", nargs="*", default=["safety", "filter", "dedup", "tokenize", "executor"])
    parser.add_argument("--commit", default="HEAD", help="commit to test (default HEAD)")
    parser.add_argument("--max-children", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per target (default 3600)")
    parser.add_argument("--workdir", default="/tmp/marin-mutation", help="scratch directory")
    parser.add_argument("--survivors", action="store_true", help="print each survivor's diff")
    parser.add_argument("--collect-only", action="store_true", help="re-read the results of an earlier run")
    parser.add_argument("--json", help="also write the reports here")
    parser.add_argument(
        "--sample",
        type=int,
        default=1,
        help="test a 1-in-N sample of the mutants (chosen by a hash of their names)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="finish an interrupted run in --workdir (same code): test only the unchecked mutants",
    )
    parser.add_argument(
        "--retest-timeouts",
        action="store_true",
        help="with --resume: test the timed-out mutants again (after raising the target's timeout)",
    )
    parser.add_argument(
        "--direct",
        action="store_true",
        help="with --resume: run each mutant's tests in a fresh pytest process instead of mutmut's runner",
    )
    parser.add_argument("--direct-timeout", type=float, default=300, help="seconds per mutant with --direct")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="incremental: keep an earlier run's verdicts in --workdir; mutmut re-tests the functions "
        "that changed, and every survivor is re-tested against the current tests",
    )
    args = parser.parse_args(argv)

    commit = git("rev-parse", args.commit)
    reports = []
    for name in args.targets:
        target = target_for(name)
        workdir = Path(args.workdir) / name.replace("/", "_").removesuffix(".py")
        started = time.time()
        finished = True
        if not args.collect_only:
            reuse = args.reuse and (workdir / "mutants").exists()
            log = workdir / "mutmut.log"
            if args.resume:
                # Finish an interrupted run on the same code: only what is still unchecked (and
                # the timeouts, with --retest-timeouts).
                earlier = collect(workdir, name, commit, args.sample)
                todo = earlier.unchecked + (earlier.timeouts if args.retest_timeouts else [])
                if args.retest_timeouts:
                    write_timeout_constant(workdir, target)
                if todo and args.direct:
                    run_direct(workdir, target, todo, args.max_children, args.direct_timeout)
                elif todo:
                    finished = run_mutmut(workdir, args.max_children, args.timeout, log, todo)
            else:
                prepare(workdir, commit, target, reuse=reuse)
                # Generate the mutants (only those of changed functions, when reusing) and learn
                # which tests reach what; mutmut then stops with "nothing matches". (Also without
                # a sample: on a fresh copy, mutmut 3.8's stats run in the process that has just
                # generated the mutants failed to import `tests.executor` from its conftest, and
                # the whole run ended after 5 s with nothing tested; a second `mutmut run` works.)
                run_mutmut(workdir, args.max_children, args.timeout, log, ["no-such-mutant"])
                earlier = collect(workdir, name, commit, args.sample)
                todo = earlier.unchecked + (earlier.survived + earlier.no_tests if reuse else [])
                remaining = args.timeout - (time.time() - started)
                if todo and remaining > 0:
                    finished = run_mutmut(workdir, args.max_children, remaining, log, todo)
        report = collect(workdir, name, commit, args.sample)
        report.seconds = time.time() - started
        reports.append(report)
        print(report.line() + ("" if finished else "  [stopped at --timeout]"), flush=True)
        for source_file, counts in report.per_file.items():
            checked = counts["mutants"] - counts["equivalent"]
            rate = counts["detected"] / checked if checked else 1.0
            print(f"    {source_file}: {rate:.1%} of {checked}", flush=True)
        if args.survivors:
            for mutant in report.survived + report.no_tests:
                tag = " (reached by no test)" if mutant in report.no_tests else ""
                print(f"\n  {mutant}{tag}\n    " + report.diffs[mutant].replace("\n", "\n    "))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                [
                    {
                        "target": r.name,
                        "commit": r.commit,
                        "rate": r.rate,
                        "mutants": r.mutants,
                        "killed": r.killed,
                        "timeout": r.timeout,
                        "crashed": r.crashed,
                        "survived": r.survived,
                        "no_tests": r.no_tests,
                        "equivalent": r.equivalent,
                        "not_checked": r.not_checked,
                        "timeouts": r.timeouts,
                        "sample": r.sample,
                        "per_file": r.per_file,
                        "diffs": r.diffs,
                    }
                    for r in reports
                ],
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
