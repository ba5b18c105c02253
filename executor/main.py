"""`executor_main`: the command line of every experiment script (draccus, as in Marin).

    python experiments/my_study.py --prefix /data/marin --dry_run true
    python experiments/my_study.py --run_only 'tokenized/.*' --max_concurrent 4
    python experiments/my_study.py --lease_timeout 600 --lease_heartbeat 60   # slow storage

The prefix defaults to `$MARIN_PREFIX`, then to `./marin-output`. Lease timing defaults
to `$MARIN_LEASE_TIMEOUT`, `$MARIN_LEASE_HEARTBEAT` and `$MARIN_LEASE_POLL` (seconds),
then to `LeaseConfig`'s defaults.

Every error is one line on stderr, `error: ...`, naming the flag, file or step to fix;
never a traceback. Exit codes:

    0  the run (or dry run) finished
    1  the run failed: a bad step declaration, a step that failed, an unreadable status
       file, storage failing after the client's retries
    2  usage: a bad flag or flag value, an empty --prefix or $MARIN_PREFIX, a --config_path
       file that is not a mapping of flag: value, an unknown storage scheme, an invalid lease
       timing, --executor_info_base_path overlapping a step's output
    130  interrupted (Ctrl-C)

A step declared wrongly at the top of a script (an invalid name is refused when the
`ExecutorStep` is built, before `executor_main` runs) also prints one line, with the
script's file and line, through a `sys.excepthook` that handles StepDefinitionError only.

draccus is imported only when the flags need it (`--help`, `--config_path`, a value that
is not plain, an error to word): `import executor` and a script run with plain flags (or
none) stay cheap.
"""

# No `from __future__ import annotations`: draccus reads the config annotation at run time.
# `X | None`, not `typing.Optional[X]`: draccus (>= 0.11.5) reads both alike (same --help,
# same parsing: tests/executor/test_flags.py), and `typing` costs a cached re-run ~2 ms to import.

import contextlib
import dataclasses
import io
import json
import os
import sys

from executor.console import settle_stdout, write_or_drop
from executor.executor import Executor, sigterm_interrupts
from executor.graph import storage_of
from executor.lazy_logging import configure_when_used
from executor.lease import LeaseConfig
from executor.outcomes import ExecutorRunError
from executor.plan import RunOnlyError, compile_run_only
from executor.records import dataclass
from executor.step_errors import StepDefinitionError
from executor.steps import ExecutorStep, InputName

DEFAULT_PREFIX = "./marin-output"

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class ExecutorMainConfig:
    """Flags shared by every experiment script."""

    prefix: str | None = None
    """Where outputs go: a local directory or an fsspec URL (s3://, gs://). Default: $MARIN_PREFIX,
    else ./marin-output. An empty one (flag or variable) is refused."""

    executor_info_base_path: str | None = None
    """Where experiment manifests go. Default: <prefix>/experiments. Not inside a step's output,
    nor holding one (the prefix itself, or above it, is fine)."""

    dry_run: bool = False
    """Print the plan (what would run, and why) without running or writing anything."""

    force_run_failed: bool = True
    """Re-run steps that failed before (otherwise they are an error)."""

    run_only: list[str] | None = None
    """Regexes (matched anywhere in a step name, `re.search`): run only these steps and the blocking
    dependencies they need that have not succeeded. One regex, or a list: '["a/.*", "b"]'."""

    max_concurrent: int | None = None
    """At most this many steps run at once in the driver (default 32). Number flags take plain
    decimal digits, as the MARIN_LEASE_* variables do (no underscores)."""

    lease_timeout: float | None = None
    """Seconds without a heartbeat after which another driver takes a step's lease over.
    Default: $MARIN_LEASE_TIMEOUT, else 60. Raise it on slow storage."""

    lease_heartbeat: float | None = None
    """Seconds between lease heartbeats; must be smaller than the timeout. Default:
    $MARIN_LEASE_HEARTBEAT, else 10."""

    lease_poll: float | None = None
    """Seconds between checks on a step another driver is running. Default: $MARIN_LEASE_POLL,
    else 5."""

    backend: str | None = None
    """Where steps with resources run: local (a subprocess each, admitted by this machine's CPUs
    and GPUs) or ray (Ray tasks). Default: $MARIN_BACKEND, else local. Light steps always run
    in the driver."""

    ray_address: str | None = None
    """The Ray cluster for --backend ray (e.g. 10.0.0.2:6379, or auto). Default: $RAY_ADDRESS,
    else a local Ray started for this run."""

    max_retries: int | None = None
    """How often a heavy step whose process or node was lost (killed, preempted) is submitted
    again; each attempt shows in its status history. Default 2. A step that raises is not
    retried."""


_LEASE_FLAGS = {
    "timeout": "lease_timeout",
    "heartbeat_interval": "lease_heartbeat",
    "poll_interval": "lease_poll",
}
"""LeaseConfig field -> flag."""


class UsageError(ValueError):
    """A bad flag or flag value: exit code 2."""


def resolve_prefix(prefix: str | None) -> str:
    """`--prefix`, else `$MARIN_PREFIX`, else ./marin-output; UsageError when the one given is empty.

    Empty (or only spaces) is refused, never read as "not given": `--prefix "$OUT"` or
    `MARIN_PREFIX=$OUT` with `OUT` unset would point the command (`marin gc --yes`
    included) at another tree. Experiment scripts and every `marin` command read it here."""
    if prefix is not None:
        if not prefix.strip():
            raise UsageError("--prefix is empty: give a directory or a URL (s3://bucket/path)")
        return prefix
    from_env = os.environ.get("MARIN_PREFIX")
    if from_env is not None:
        if not from_env.strip():
            raise UsageError(
                "MARIN_PREFIX is set but empty: set it to a directory or a URL (s3://bucket/path), "
                f"or unset it to use {DEFAULT_PREFIX}"
            )
        return from_env
    return DEFAULT_PREFIX


def executor_main(steps: list[ExecutorStep | InputName], description: str | None = None):
    """Run `steps` with the flags given on the command line (see ExecutorMainConfig). Returns the Executor.

    Exits (SystemExit) with one `error: ...` line on stderr when something is wrong; see the
    module docstring for the exit codes.
    """
    try:
        config = parse_flags(sys.argv[1:])
        lease_config = lease_config_of(config)
        backend = backend_of(config)
        prefix = resolve_prefix(config.prefix)
    except UsageError as error:
        _exit(str(error), EXIT_USAGE)
    # (`logging` itself is imported only once something logs: see executor.lazy_logging.)
    configure_when_used(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    base = config.executor_info_base_path
    if base is not None and storage_of(base) != storage_of(prefix):
        _exit(
            f"--executor_info_base_path {base!r} is on {storage_of(base)}://, not on the prefix's "
            f"storage ({prefix}): experiment manifests are written there with the prefix's storage",
            EXIT_USAGE,
        )
    try:
        executor = Executor(
            prefix,
            config.executor_info_base_path,
            description=description,
            lease_config=lease_config,
            backend=backend,
            ray_address=config.ray_address,
            **({} if config.max_retries is None else {"max_retries": config.max_retries}),
        )
    except StepDefinitionError as error:  # the script's own mistake (its description), as a step's
        _exit(str(error), EXIT_FAILED)
    except ValueError as error:  # an empty prefix
        _exit(str(error), EXIT_USAGE)
    except OSError as error:  # StoreError: no filesystem for the prefix's scheme
        _exit(str(error), EXIT_USAGE)
    if base is not None:
        try:
            _refuse_manifests_among_outputs(steps, prefix, base)
        except UsageError as error:
            _exit(str(error), EXIT_USAGE)
        except KeyboardInterrupt:  # (resolving a large graph takes a moment)
            _exit("interrupted", EXIT_INTERRUPTED)
    if config.prefix is None and "MARIN_PREFIX" not in os.environ:
        write_or_drop(
            sys.stdout, f"No --prefix and no $MARIN_PREFIX: writing under {os.path.abspath(prefix)}\n"
        )
    try:
        # From here, not only once the run starts its steps: SIGTERM while the plan waits out
        # a storage client's retries ended the process by the signal (143, no message).
        with sigterm_interrupts():
            plan = executor.run(
                steps,
                dry_run=config.dry_run,
                run_only=config.run_only,
                force_run_failed=config.force_run_failed,
                max_concurrent=config.max_concurrent,
            )
    except RunOnlyError as error:  # an invalid pattern (parse_flags checks them first)
        _exit(f"--{error}" if str(error).startswith("run_only") else str(error), EXIT_USAGE)
    except (ExecutorRunError, ValueError) as error:  # StepDefinitionError, StatusFileError, ...
        _exit(str(error), EXIT_FAILED)
    except OSError as error:  # storage failing after the client's retries
        _exit(_describe_os_error(error), EXIT_FAILED)
    except KeyboardInterrupt:
        _exit("interrupted", EXIT_INTERRUPTED)
    if config.dry_run:
        _exit_if_the_plan_has_errors(plan)
    elif executor.executor_info_path:
        write_or_drop(sys.stdout, f"Experiment manifest: {executor.executor_info_path}\n")
    settle_stdout()
    return executor


def _exit_if_the_plan_has_errors(plan) -> None:
    """A dry run whose plan has error rows exits 1, as the run itself would: a script or CI
    job that checks an experiment with `--dry_run true` must not read "fine" from it. The
    rows above already say, each, what to do."""
    from executor.plan import Action

    failing = [row.name for row in (plan.rows if plan is not None else ()) if row.action == Action.ERROR]
    if failing:
        shown = ", ".join(failing[:10]) + (f", ... ({len(failing)} in all)" if len(failing) > 10 else "")
        _exit(
            f"dry run: {len(failing)} step(s) would fail: {shown}; each error row above says what to do",
            EXIT_FAILED,
        )


def _refuse_manifests_among_outputs(steps, prefix: str, base: str) -> None:
    """UsageError when `--executor_info_base_path` and a step's output overlap, naming both.

    Inside a step's output, removing the output (`marin gc`, `rm -r` of a failed step) would
    take the manifests along (the run itself refuses that too, but as a failed run, exit 1).
    Holding a step's output, the directory is no longer the manifests' own, as
    `<prefix>/experiments` is (no step may write there): refused too, unless it is the prefix
    or a directory above it, where manifests sit beside the outputs as files.

    Resolves the graph once more (only when the flag is given); a graph that does not
    resolve is left to the run, which reports it in its own words."""
    import logging

    from executor.graph import enclosing_output, resolve
    from executor.store import normalize_prefix

    prefix, base = normalize_prefix(prefix), normalize_prefix(base)
    quiet = logging.getLogger("executor.graph")  # (its warnings come again from the run)
    was_disabled, quiet.disabled = quiet.disabled, True
    try:
        roots = [step.step if isinstance(step, InputName) else step for step in steps]
        graph = resolve([step for step in roots if isinstance(step, ExecutorStep)], prefix)
    except Exception:
        return
    finally:
        quiet.disabled = was_disabled
    outer = enclosing_output(graph.by_path, base)
    if outer is not None:
        raise UsageError(
            f"--executor_info_base_path {base} is inside the output of step {outer.name!r} "
            f"({outer.output_path}): removing that output would take the manifests along; put "
            "the manifests outside every step's output"
        )
    if _is_within(prefix, base):  # the prefix or above it: manifests beside the outputs
        return
    for step in graph.steps:
        if _is_within(step.output_path, base):
            raise UsageError(
                f"--executor_info_base_path {base} holds the output of step {step.name!r} "
                f"({step.output_path}): the manifests need a directory of their own, as "
                "<prefix>/experiments is; put them where no step writes, or rename the step"
            )


def _is_within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _exit(message: str, code: int):
    settle_stdout()  # a closed stdout (`| head`) must not turn this exit status into 120
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def _describe_os_error(error: OSError) -> str:
    from executor.store import StoreError

    if isinstance(error, StoreError):
        return str(error)  # already names the file or prefix
    where = f" on {error.filename}" if getattr(error, "filename", None) else ""
    return f"storage failed{where}: {type(error).__name__}: {error}"


# -- flags --------------------------------------------------------------------------------


def parse_flags(argv: list[str]) -> ExecutorMainConfig:
    """The flags in `argv`, checked; UsageError with a one-line message otherwise.

    `--help` prints the flags and exits 0. draccus parses them (and writes the help and
    the error messages), except when every flag is one `_parse_plain` reads exactly as
    draccus would: then draccus is not even imported (~0.2 s of every script's start).
    """
    _refuse_repeated_flags(argv)
    argv, run_only = _take_run_only(argv)
    argv, paths = _take_paths(argv)
    config = _parse_plain(argv)
    if config is None:
        config = _numbers_as_written(argv, _parse_with_draccus(argv))
    if run_only is not None:
        config = dataclasses.replace(config, run_only=run_only)
    if paths:
        config = dataclasses.replace(config, **paths)
    try:
        compile_run_only(config.run_only)
    except RunOnlyError as error:
        raise UsageError(f"--{error}") from None
    if config.max_concurrent is not None and config.max_concurrent < 1:
        raise UsageError(f"--max_concurrent must be at least 1, got {config.max_concurrent}")
    if config.max_retries is not None and config.max_retries < 0:
        raise UsageError(f"--max_retries must be at least 0, got {config.max_retries}")
    return config


def _parse_with_draccus(argv: list[str]) -> ExecutorMainConfig:
    import draccus  # here, not at the top: `import executor` must stay cheap

    argv = _checked_config_file(argv)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):  # argparse prints usage + message on errors
            config = draccus.parse(config_class=ExecutorMainConfig, args=argv)
    except SystemExit as exit_:
        if not exit_.code:
            raise  # --help
        raise UsageError(_argparse_message(captured.getvalue())) from None
    except draccus.utils.DecodingError as error:
        raise UsageError(_decoding_message(error)) from None
    except Exception as error:  # a --config_path file draccus cannot read
        # draccus wraps YAML's own error in "Failed to load config from <_io.TextIOWrapper ...>".
        cause = error.__cause__ or error
        why = " ".join(str(cause).split())[:300]
        where = _flag_value(argv, "config_path")
        raise UsageError(
            f"cannot read the flags{f' in {where}' if where else ''}: {type(cause).__name__}: {why}"
        ) from None
    return config


def _checked_config_file(argv: list[str]) -> list[str]:
    """`argv` without `--config_path FILE` when FILE is empty (no flags from it); UsageError
    when FILE holds something other than a mapping of flag: value.

    draccus failed on both with its own internals (`AttributeError: 'NoneType' object has no
    attribute 'copy'`). The file is read here as draccus reads it (its loader, chosen by the
    extension); a file that cannot be read or parsed is left to draccus, whose error is worded
    in `_parse_with_draccus`."""
    from draccus import cfgparsing

    for index, arg in enumerate(argv):
        flag, equals, path = arg.partition("=")
        if not flag.startswith("--") or _full_flag(flag[2:]) != "config_path":
            continue
        if not equals:
            if index + 1 >= len(argv):
                return argv  # (argparse: "expected one argument")
            path = argv[index + 1]
        try:
            with open(path, encoding="utf-8") as handle:
                empty = not handle.read().strip()
                handle.seek(0)
                flags = None if empty else cfgparsing.load_config(handle, file=path)
        except Exception:
            return argv
        if flags is None:  # no text, only comments, `---` or `null`
            return argv[:index] + argv[index + (1 if equals else 2) :]
        if not isinstance(flags, dict):
            raise UsageError(
                f"--config_path {path} holds {_kind_of(flags)}, not a mapping of flag: value "
                "(one `flag: value` per line, e.g. `prefix: /data/marin`)"
            )
        return argv
    return argv


def _kind_of(value: object) -> str:
    if isinstance(value, bool):
        return f"the value {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


_NUMBER_FLAGS = {
    "max_concurrent": int,
    "max_retries": int,
    "lease_timeout": float,
    "lease_heartbeat": float,
    "lease_poll": float,
}


def _numbers_as_written(argv: list[str], config: ExecutorMainConfig) -> ExecutorMainConfig:
    """`config` with each number flag of `argv` read as written in plain ASCII decimals, as
    `$MARIN_LEASE_*` are read (`LeaseConfig.from_env`); UsageError naming the flag otherwise.

    draccus reads a value as YAML, then as Python: `1_0` was 10, `010` 8 (octal), `0x10`
    16, `1:30` 90, `True` 1, `٥` 5, `null` or ` ` no value at all, while the variables refuse
    all of these (and read `010` as 10). Values draccus refuses keep its message (it parsed
    first). Values from a `--config_path` file are YAML's own."""
    import re

    from executor.lease import _PLAIN_NUMBER

    changes = {}
    for name, kind in _NUMBER_FLAGS.items():
        text = _flag_value(argv, name)
        if text is None:
            continue
        if kind is int:
            if not re.fullmatch(r"[-+]?[0-9]+", text.strip()):
                raise UsageError(
                    f"--{name} {text!r} is not a whole number: write plain decimal digits, e.g. 4 "
                    "(no underscores)"
                )
            changes[name] = int(text)
        else:
            if not re.fullmatch(_PLAIN_NUMBER, text.strip()):
                raise UsageError(
                    f"--{name} {text!r} is not a number of seconds: write plain decimal digits, "
                    "e.g. 60, 0.5 or 1e3 (no underscores), as in MARIN_LEASE_*"
                )
            changes[name] = float(text)
    return dataclasses.replace(config, **changes) if changes else config


def _plain_word(text: str) -> str | None:
    return text if text.isascii() and text.isalpha() and text.lower() not in _YAML_WORDS else None


def _plain_address(text: str) -> str | None:
    # host:port, or ray://host:port: ':' followed by digits is a string to YAML only with
    # letters around it, so only these two shapes are read here; anything else goes to draccus.
    import re

    if re.fullmatch(r"(ray://)?[A-Za-z][A-Za-z0-9.-]*:[0-9]{1,5}|(ray://)?[0-9.]+:[0-9]{1,5}|auto", text):
        return text
    return None


_YAML_WORDS = {"yes", "no", "on", "off", "true", "false", "null", "y", "n", "none"}


def _plain_bool(text: str) -> bool | None:
    return _PLAIN_BOOLS.get(text)


def _plain_int(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and (text == "0" or text[0] != "0") else None


def _plain_float(text: str) -> float | None:
    whole, _, fraction = text.partition(".")
    digits = whole + fraction
    if digits.isascii() and digits.isdigit() and (whole == "0" or whole[:1] not in ("0", "")):
        return float(text)  # (YAML reads "010" as octal 8, so no leading zeros)
    return None


_PLAIN_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_PLAIN_PARSERS = {
    "dry_run": _plain_bool,
    "force_run_failed": _plain_bool,
    "max_concurrent": _plain_int,
    "lease_timeout": _plain_float,
    "lease_heartbeat": _plain_float,
    "lease_poll": _plain_float,
    "backend": _plain_word,
    "max_retries": _plain_int,
    "ray_address": _plain_address,
}
"""Flag -> reader of the values YAML (hence draccus) reads the same way; None for any other value."""


def _parse_plain(argv: list[str]) -> ExecutorMainConfig | None:
    """The flags without draccus, when each is `--flag value` or `--flag=value` with a plain value.

    None for anything else (`--help`, `--config_path`, an unknown or repeated flag, a value
    YAML reads otherwise or draccus refuses): draccus then parses, or writes the message.
    """
    values: dict = {}
    index = 0
    while index < len(argv):
        arg = argv[index]
        if not arg.startswith("--"):
            return None
        name, equals, text = arg[2:].partition("=")
        if not equals:
            if index + 1 >= len(argv):
                return None
            text = argv[index + 1]
            index += 1
        index += 1
        parse = _PLAIN_PARSERS.get(name)
        if parse is None or name in values:
            return None
        value = parse(text)
        if value is None:
            return None
        values[name] = value
    return ExecutorMainConfig(**values)


def lease_config_of(config: ExecutorMainConfig) -> LeaseConfig:
    """Lease timing from the flags, else `$MARIN_LEASE_*`, else the defaults; UsageError if invalid."""
    given = {field: getattr(config, flag) for field, flag in _LEASE_FLAGS.items()}
    try:
        return LeaseConfig.from_env(
            sources={field: f"--{flag}" for field, flag in _LEASE_FLAGS.items()}, **given
        )
    except ValueError as error:
        raise UsageError(str(error)) from None


def backend_of(config: ExecutorMainConfig) -> str:
    """--backend, else $MARIN_BACKEND, else local; UsageError naming the flag or variable."""
    from executor.backends import backend_name

    try:
        return backend_name(config.backend)
    except ValueError as error:
        raise UsageError(str(error)) from None


PATH_FLAGS = ("prefix", "executor_info_base_path")
"""Flags whose value is a path or URL, taken exactly as given (draccus reads values as YAML:
`--prefix no` would be 'False', `--prefix 0x10` '16', `--prefix null` no prefix at all)."""


def _take_paths(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Take the `PATH_FLAGS` out of `argv`: {flag: value}; UsageError for an empty value, a
    missing one, or a flag given twice (which one was meant?)."""
    rest: list[str] = []
    found: dict[str, str] = {}
    index = 0
    while index < len(argv):
        arg = argv[index]
        name, equals, text = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        name = _full_flag(name)
        if name not in PATH_FLAGS:
            rest.append(arg)
            index += 1
            continue
        if not equals:
            if index + 1 >= len(argv) or argv[index + 1].startswith("--"):
                raise UsageError(f"--{name}: expected a directory or a URL after it")
            text = argv[index + 1]
            index += 1
        index += 1
        if name in found:
            raise UsageError(f"--{name} given twice ({found[name]!r} and {text!r}): give it once")
        if not text.strip():
            raise UsageError(f"--{name} is empty: give a directory or a URL (s3://bucket/path)")
        found[name] = text
    return rest, found


def _refuse_repeated_flags(argv: list[str]) -> None:
    """UsageError for a flag given twice: argparse keeps the last (`--dry_run true --dry_run
    false` ran for real), and which one was meant cannot be known."""
    seen: set[str] = set()
    for arg in argv:
        if not arg.startswith("--") or arg == "--":
            continue
        name = _full_flag(arg[2:].partition("=")[0])
        if name in seen and name not in ("help", *PATH_FLAGS):  # (_take_paths names both values)
            raise UsageError(f"--{name} given twice: give it once")
        seen.add(name)


def _full_flag(name: str) -> str:
    """The flag `--name` stands for: argparse (hence draccus) takes any unambiguous start of
    a flag's name (`--pre` for `--prefix`)."""
    if not name:
        return name
    flags = [field.name for field in dataclasses.fields(ExecutorMainConfig)] + ["config_path", "help"]
    if name in flags:
        return name
    matches = [flag for flag in flags if flag.startswith(name)]
    return matches[0] if len(matches) == 1 else name


def _take_run_only(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """Take `--run_only` out of `argv` and parse it ourselves: one regex, or a JSON list of them.

    (draccus would read the value as YAML, which mangles regexes and fails on a lone '['.)
    """
    rest: list[str] = []
    run_only = None
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--run_only" and index + 1 < len(argv):
            if argv[index + 1].startswith("--"):  # `--run_only --prefix p`: the value was left out
                raise UsageError(
                    f"--run_only: expected a regex or a JSON list of regexes, got the flag {argv[index + 1]}"
                )
            run_only = _parse_run_only(argv[index + 1])
            index += 2
            continue
        if arg.startswith("--run_only="):
            run_only = _parse_run_only(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        index += 1
    return rest, run_only


def _parse_run_only(text: str) -> list[str]:
    if text.lstrip().startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None  # not JSON: a regex that starts with a character class, e.g. '[ab]c'
        except RecursionError:
            raise UsageError(
                f"--run_only: a JSON list nested too deeply ({len(text):,} characters)"
            ) from None
        if value is not None:
            if isinstance(value, list) and all(isinstance(item, str) for item in value):
                return value
            raise UsageError(
                f'--run_only {text!r}: expected a regex or a JSON list of regexes, e.g. \'["a/.*", "b"]\''
            )
    return [text]


def _flag_value(argv: list[str], name: str) -> str | None:
    """The value given to `--name` in `argv` (`--name value` or `--name=value`), if any."""
    for index, arg in enumerate(argv):
        flag, equals, value = arg.partition("=")
        if flag.startswith("--") and _full_flag(flag[2:]) == name:
            return value if equals else (argv[index + 1] if index + 1 < len(argv) else None)
    return None


def _argparse_message(stderr: str) -> str:
    """argparse's `prog: error: message` line, as `message (see --help)`."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "invalid arguments"
    message = last.split(": error: ", 1)[-1]
    return f"{message} (see --help)"


_EXPECTED = {bool: "true or false", int: "a whole number", float: "a number of seconds"}


def _decoding_message(error) -> str:
    """A draccus DecodingError as `--flag: could not parse 'value' (expected ...)`."""
    flag = ".".join(str(part) for part in error.key_path)
    detail = [line.strip() for line in str(error.message).splitlines() if line.strip()]
    reason = detail[-1] if detail else "invalid value"
    if not flag:  # about the config as a whole, e.g. unknown keys in a --config_path file
        return f"{reason} (see --help)"
    reason = reason.split(": ", 1)[-1] if reason.startswith(("int:", "float:", "bool:", "str:")) else reason
    if " missing " in reason and "required positional argument" in reason:
        # draccus's own TypeError for a YAML list or mapping where a number belongs: keep the
        # part that names the value, drop the call that failed inside draccus.
        reason = reason.split(": decode_", 1)[0].split(" into a ", 1)[0]
    fields = {field.name: field.type for field in dataclasses.fields(ExecutorMainConfig)}
    annotation = fields.get(flag)
    kinds = [kind for kind in _EXPECTED if annotation is kind or kind in getattr(annotation, "__args__", ())]
    expected = f" (expected {_EXPECTED[kinds[0]]})" if kinds else ""
    return f"--{flag}: {reason[:1].lower()}{reason[1:]}{expected}"
