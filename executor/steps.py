"""Step declarations: the values an experiment script builds.

These are plain immutable values. Nothing here touches storage or computes a hash;
`executor.graph` turns a list of steps into a resolved DAG.

The names and signatures follow Marin's executor so that a Marin experiment script
ports by changing only its imports:

- `ExecutorStep(name, fn, config)`: one unit of cached work. `fn(config)` is called with
  the config after every placeholder in it has been replaced by a concrete path.
- `InputName(step, name)`: "the output of `step`, sub-path `name`". `step / "sub"`,
  `step.cd("sub")` and `output_path_of(step, "sub")` all build one.
- `InputName.hardcoded(path)`: an input that is not produced by a step. A relative
  path is taken relative to the prefix, so the experiment stays prefix-independent.
- `.nonblocking()`: the input's path is filled in and its version counts, but the
  step does not wait for (or run) the producer.
- `this_output_path(sub)` / `THIS_OUTPUT_PATH`: the step's own output directory.
- `versioned(v)`: mark a config value as part of the step's identity (its hash).

A step's name is checked when the step is built (see `check_step_name`): it becomes a
path under the prefix, so it must be one unambiguously. So are the sub-paths given to
`step / "sub"`, `output_path_of(step, "sub")` and `this_output_path("sub")` (see
`sub_path_problem`): relative, without '.', '..' or empty parts, so that no input or
output leads out of its step's output directory. So are a hard-coded input path (see
`hardcoded_path_problem`: a relative one stays under the prefix), a step's `description` (a
string, at most `MAX_DESCRIPTION_CHARS`) and `pip_dependency_groups` (a list of strings), and
what `output_path_of` is given (a step). Mistakes raise `StepDefinitionError`.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable

from executor.records import dataclass
from executor.step_errors import StepDefinitionError

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    from typing import Any, Generic, TypeVar

    from executor.resources import ResourceConfig

    ConfigT = TypeVar("ConfigT")
    T = TypeVar("T")
else:
    ConfigT = T = "T"  # (only subscripted below)

    class Generic:
        """`typing.Generic` to type checkers; at run time only what users write with it:
        `ExecutorStep[TrainConfig]` in annotations (a `types.GenericAlias`)."""

        __slots__ = ()
        __class_getitem__ = classmethod(types.GenericAlias)


RESERVED_FIRST_PARTS = ("experiments",)
"""`<prefix>/experiments/` holds the experiment manifests: no step output goes there."""

_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
"""The characters of a name part."""


MAX_NAME_PART = 255
"""Longest name part, in bytes: what most filesystems allow for one path component (NAME_MAX)."""

MAX_LAST_NAME_PART = MAX_NAME_PART - 9
"""Longest last part: its directory is `<part>-<8 hex digits of the version hash>`."""


def _is_valid_name(name: str) -> bool:
    """Every name `_name_problem` accepts, with string methods only (the check runs for every
    step built; a regular expression would be compiled at every import)."""
    if (
        not name.isascii()
        or not name.replace("/", "a").replace("_", "a").replace("-", "a").replace(".", "a").isalnum()
    ):
        return False  # (isalnum of ASCII text: letters and digits only)
    wrapped = f"/{name}/"
    if "//" in wrapped or "/./" in wrapped or "/../" in wrapped:
        return False  # empty, leading or trailing '/', '//', or a '.' or '..' part
    if len(name) > MAX_LAST_NAME_PART and _long_part(name) is not None:
        return False
    # (Any case: on a case-insensitive filesystem, macOS's default, `Experiments/` is `experiments/`.)
    folded = name.lower()
    return folded not in RESERVED_FIRST_PARTS and not folded.startswith(_RESERVED_DIRS)


def _long_part(name: str) -> str | None:
    """Why a part of `name` is too long for a directory name; None when none is. (Callers check
    the characters first: a name is ASCII, so its characters are its bytes.)"""
    *parents, last = name.split("/")
    for part in parents:
        if len(part) > MAX_NAME_PART:
            return f"the part {part[:20]!r}... is {len(part)} bytes, over the {MAX_NAME_PART} a directory name may have"
    if len(last) > MAX_LAST_NAME_PART:
        return (
            f"its last part {last[:20]!r}... is {len(last)} bytes: with '-' and the 8-digit hash added it "
            f"would be over the {MAX_NAME_PART} a directory name may have (at most {MAX_LAST_NAME_PART})"
        )
    return None


_RESERVED_DIRS = tuple(f"{part}/" for part in RESERVED_FIRST_PARTS)


def check_step_name(name: Any) -> None:
    """Raise StepDefinitionError unless `name` is a clean relative path (see `_name_problem`)."""
    if type(name) is str and _is_valid_name(name):
        return
    if not isinstance(name, str):
        raise StepDefinitionError(f"step name must be a string, got {type(name).__name__} {name!r}")
    problem = _name_problem(name)
    if problem is not None:  # (None only for a str subclass the fast path skipped)
        raise StepDefinitionError(
            f"step name {name!r} is invalid: {problem}. A name is parts of letters, digits, '_', '-' "
            "and '.' joined by single '/' (e.g. 'tokenized/stdlib'); its output goes to "
            "<prefix>/<name>-<hash>"
        )


def _name_problem(name: str) -> str | None:
    if not name:
        return "it is empty"
    if name.startswith("/"):
        return "it starts with '/' (names are relative to the prefix; use override_output_path to write elsewhere)"
    if name.endswith("/"):
        return "it ends with '/'"
    parts = name.split("/")
    if "" in parts:
        return "it contains '//'"
    for part in parts:
        if part in (".", ".."):
            return f"it has the part {part!r}, which is not a directory name"
        if not set(part) <= _NAME_CHARS:
            bad = "".join(sorted(set(part) - _NAME_CHARS))
            return f"it contains {bad!r}"
    too_long = _long_part(name)
    if too_long is not None:
        return too_long
    if parts[0].lower() in RESERVED_FIRST_PARTS:
        reserved = parts[0].lower()
        same = "" if parts[0] == reserved else " (the same directory on a case-insensitive filesystem)"
        return (
            f"'{parts[0]}' is reserved: <prefix>/{reserved}/ holds the experiment manifests{same}; "
            "rename the step"
        )
    return None


MAX_DESCRIPTION_CHARS = 1 << 16
"""Longest `description` (65,536 characters): it is recorded in the step's `.executor_info` and in
every experiment manifest; a few lines describe a step, a longer text belongs in a file."""


def shown(value: Any, limit: int = 60) -> str:
    """`value`'s type and a repr cut to `limit` characters, for messages."""
    text = repr(value)
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    kind = type(value).__name__
    return text if value is None or text.startswith(kind) else f"{kind} {text}"


def description_fits(description: Any) -> bool:
    """Whether a step's (or an experiment's) description can be recorded: None, or a string of
    at most MAX_DESCRIPTION_CHARS (it goes into `.executor_info` and every manifest as JSON)."""
    return description is None or (type(description) is str and len(description) <= MAX_DESCRIPTION_CHARS)


def _check_description_and_groups(step: ExecutorStep) -> None:
    """Raise StepDefinitionError unless `description` is None or a string of at most
    MAX_DESCRIPTION_CHARS, and `pip_dependency_groups` None or a list (or tuple) of strings.
    (Both are recorded as JSON: anything else failed the run when its manifest was written.)"""
    description = step.description
    if description is not None:
        if not isinstance(description, str):
            raise StepDefinitionError(
                f"step {step.name!r}: description must be a string or None, got {shown(description)}; "
                "describe the step in a few words of text"
            )
        if len(description) > MAX_DESCRIPTION_CHARS:
            raise StepDefinitionError(
                f"step {step.name!r}: description is {len(description):,} characters, over the limit of "
                f"{MAX_DESCRIPTION_CHARS:,}: it is recorded in the step's .executor_info and in every "
                "experiment manifest. Describe the step in a few lines and keep longer text in a file"
            )
    groups = step.pip_dependency_groups
    if groups is None:
        return
    if not isinstance(groups, (list, tuple)):
        got = shown(groups)
    else:
        bad = [group for group in groups if not isinstance(group, str)]
        if not bad:
            return
        got = f"a list holding {shown(bad[0])}"
    raise StepDefinitionError(
        f"step {step.name!r}: pip_dependency_groups must be None or a list of dependency group names "
        f"(strings), like ['tokenize'], got {got}"
    )


_HARDCODED_FORM = (
    "give a path relative to the prefix, without '.', '..' or empty parts (like 'raw/dclm'), or an "
    "absolute path or URL"
)


def hardcoded_path_problem(path: Any) -> str | None:
    """Why `path` cannot be a hard-coded input path; None when it can.

    A string; absolute paths and URLs are taken as written, a relative path is joined to the
    prefix, so it may not have a '..' part (`../x` would read outside the prefix), nor a '.' or
    empty part (the same rules as a sub-path). A trailing '/' is kept as written.
    """
    if not isinstance(path, str):
        return f"the path must be a string, got {type(path).__name__}"
    if not path:
        return "the path is empty"
    if path.startswith("/") or "://" in path:
        return None
    wrapped = f"/{path.rstrip('/')}/"
    if "/../" in wrapped:
        return "the relative path has a '..' part, which leads out of the prefix"
    if "/./" in wrapped:
        return "the relative path has a '.' part"
    if "//" in wrapped:
        return "the relative path has an empty part ('//')"
    return None


def check_hardcoded_path(path: Any, label: str | None = None, where: str = "") -> None:
    """Raise StepDefinitionError unless `path` may be a hard-coded input path (see
    `hardcoded_path_problem`). `label`: how the message names it (`InputName.hardcoded(path)`)."""
    problem = hardcoded_path_problem(path)
    if problem is not None:
        label = label if label is not None else f"InputName.hardcoded({path!r})"
        raise StepDefinitionError(f"{where}{label}: {problem}: {_HARDCODED_FORM}")


def _not_a_step(value: Any) -> str:
    """The message for `output_path_of(value)` with a value that is not an ExecutorStep."""
    if isinstance(value, InputName) and value.step is not None:
        hint = (
            "it is already an input; for a path inside a step's output write "
            "output_path_of(step, 'sub/path') or step / 'sub'"
        )
    elif isinstance(value, str):
        hint = "pass the step itself (what ExecutorStep(...) returned), not its name or path"
    elif value is None:
        hint = "the step is None (does the function that should make it return it?)"
    else:
        hint = "pass the step itself (what ExecutorStep(...) returned)"
    return f"output_path_of() takes an ExecutorStep, got {shown(value)}: {hint}"


def _join(base: str | None, sub: str | None) -> str | None:
    if not base:
        return sub or None
    if not sub:
        return base
    return f"{base.rstrip('/')}/{sub.lstrip('/')}"


_SUB_PATH_FORM = (
    "like 'data/part-0', 'tokenizer/' or 'data/*.jsonl.gz' (no leading '/', and no '.', '..' or empty parts)"
)


def sub_path_problem(name: Any) -> str | None:
    """Why `name` cannot be a sub-path inside an output directory; None when it can.

    A sub-path is None or a string relative to the directory: no leading '/' (nor a URL), and
    no '', '.' or '..' part, any of which would name something else than a path inside it
    (`DEP[0]//etc/passwd`, `out/../../x`). Trailing '/'s are kept as written ("tokenizer/"),
    and "" is the directory itself, as None is.
    """
    if name is None:
        return None
    if not isinstance(name, str):
        return f"must be a string, got {type(name).__name__} {name!r}"
    if not name:
        return None
    if name.startswith("/"):
        return "is absolute (starts with '/')"
    wrapped = f"/{name.rstrip('/')}/"
    if "/../" in wrapped:
        return "has a '..' part, which leads out of the output directory"
    if "/./" in wrapped:
        return "has a '.' part"
    if "//" in wrapped:
        return "has an empty part ('//'; a URL is not a sub-path)"
    return None


def check_input_sub_path(step: ExecutorStep, name: Any, where: str = "") -> None:
    """Raise StepDefinitionError unless `name` is a sub-path `step`'s output may have (see
    `sub_path_problem`); `where` (e.g. "step 'b', field 'x': ") starts the message."""
    problem = sub_path_problem(name)
    if problem is not None:
        shown = f" {name!r}" if isinstance(name, str) else ""
        raise StepDefinitionError(
            f"{where}the sub-path{shown} of the output of step {step.name!r} {problem}: give a path "
            f"relative to that output directory, {_SUB_PATH_FORM}"
        )


def check_output_sub_path(name: Any, where: str = "") -> None:
    """Raise StepDefinitionError unless `name` is a sub-path `this_output_path(name)` may have."""
    problem = sub_path_problem(name)
    if problem is not None:
        shown = f"this_output_path({name!r})" if isinstance(name, str) else "this_output_path()"
        raise StepDefinitionError(
            f"{where}{shown}: the sub-path {problem}: give a path relative to the step's own output "
            f"directory, {_SUB_PATH_FORM}"
        )


# eq=False: steps are identified by object identity during graph collection (their
# configs usually hold lists and dicts, so value hashing is impossible anyway); two
# steps that are the same *by value* collapse later because their versions are equal.
@dataclass(frozen=True, eq=False)
class ExecutorStep(Generic[ConfigT]):
    """One cached unit of work: `fn(config)` writing under its output path."""

    name: str
    """Human-readable name; may contain '/' (e.g. 'tokenized/stdlib'). The output goes to
    `<prefix>/<name>-<hash>`."""

    fn: Callable[[ConfigT], Any]
    """The step function. Called with the config after placeholders are filled in."""

    config: ConfigT
    """A dataclass instance (or None). Fields wrapped in `versioned()` and the inputs
    (`InputName`s) determine the step's version."""

    description: str | None = None
    """Free text shown in plans and recorded in `.executor_info` (at most MAX_DESCRIPTION_CHARS)."""

    override_output_path: str | None = None
    """Write here instead of `<prefix>/<name>-<hash>`; relative paths are under the prefix."""

    pip_dependency_groups: list[str] | None = None
    """Optional-dependency groups the step needs (used by remote backends): a list of names."""

    resources: ResourceConfig | dict[str, Any] | None = None
    """What the step asks the cluster for: a `ResourceConfig` (e.g.
    `ResourceConfig.with_tpu("v4-8")`), a plain dict (kept as written), or None for a light
    step run in the driver. Never part of the version; recorded in `.executor_info`."""

    def __post_init__(self):
        check_step_name(self.name)
        if self.resources is not None:
            _check_resources(self)
        if not description_fits(self.description) or self.pip_dependency_groups is not None:
            _check_description_and_groups(self)

    def cd(self, name: str) -> InputName:
        """The sub-path `name` of this step's output, as an input for another step."""
        check_input_sub_path(self, name)
        return InputName(self, name)

    def __truediv__(self, name: str) -> InputName:
        return self.cd(name)

    def as_input_name(self) -> InputName:
        """This step's whole output as an input (Marin's name for `output_path_of(step)`)."""
        return InputName(self, None)

    def nonblocking(self) -> InputName:
        """This step's output as an input that does not wait for the step to run."""
        return InputName(self, None, block_on_step=False)

    def with_output_path(self, output_path: str) -> ExecutorStep[ConfigT]:
        """A copy of this step that writes to `output_path`."""
        return dataclasses.replace(self, override_output_path=output_path)

    def __repr__(self) -> str:
        return f"ExecutorStep(name={self.name!r})"


def _check_resources(step: ExecutorStep) -> None:
    """Refuse a `resources` value that is not None, a dict or a ResourceConfig; turn a recorded
    ResourceConfig (`{"__type__": "ResourceConfig", ...}` from `.executor_info`) back into one."""
    from executor.resources import ResourceConfig  # (loaded by the first step that asks for resources)

    resources = step.resources
    if type(resources) is ResourceConfig or (
        type(resources) is dict
        and "__type__" not in resources
        and "cpu" not in resources
        and "gpu" not in resources
    ):
        return
    try:
        normalized = ResourceConfig.from_value(resources)
    except ValueError as error:
        raise StepDefinitionError(f"step {step.name!r}: {error}") from None
    if normalized is not resources:
        object.__setattr__(step, "resources", normalized)


@dataclass(frozen=True)
class InputName:
    """A path inside another step's output (or a hard-coded path when `step` is None)."""

    step: ExecutorStep | None
    """The producing step, or None for a hard-coded path."""

    name: str | None
    """Sub-path inside the step's output (or the whole path when `step` is None)."""

    block_on_step: bool = True
    """Whether the consumer waits for the producer (and runs it if needed)."""

    def cd(self, name: str) -> InputName:
        if name is not None and not isinstance(name, str):
            owner = f"step {self.step.name!r}" if self.step is not None else repr(self.name)
            raise StepDefinitionError(
                f"a sub-path of {owner} must be a string, got {type(name).__name__} {name!r}"
            )
        joined = _join(self.name, name)
        if self.step is not None:
            check_input_sub_path(self.step, joined)
        else:
            check_hardcoded_path(joined, f"InputName.hardcoded({self.name!r}).cd({name!r}) gives {joined!r}")
        return dataclasses.replace(self, name=joined)

    def __truediv__(self, name: str) -> InputName:
        return self.cd(name)

    def nonblocking(self) -> InputName:
        return dataclasses.replace(self, block_on_step=False)

    @staticmethod
    def hardcoded(path: str) -> InputName:
        """An input path not produced by any step (relative paths are under the prefix; see
        `hardcoded_path_problem`)."""
        check_hardcoded_path(path)
        return InputName(None, path)

    def __repr__(self) -> str:
        owner = self.step.name if self.step is not None else "<hardcoded>"
        flag = "" if self.block_on_step else ", nonblocking"
        return f"InputName({owner!r}, {self.name!r}{flag})"


def output_path_of(step: ExecutorStep, name: str | None = None) -> InputName:
    """The output path of `step` (optionally a sub-path), as an input for another step."""
    if not isinstance(step, ExecutorStep):
        raise StepDefinitionError(_not_a_step(step))
    check_input_sub_path(step, name)
    return InputName(step, name)


def get_executor_step(value: ExecutorStep | InputName) -> ExecutorStep:
    """The step behind a step or a (non-hardcoded) input."""
    if isinstance(value, ExecutorStep):
        return value
    if isinstance(value, InputName) and value.step is not None:
        return value.step
    raise StepDefinitionError(f"{value!r} does not refer to a step")


@dataclass(frozen=True)
class OutputName:
    """Placeholder for the running step's own output path (or a sub-path of it)."""

    name: str | None
    """Sub-path inside the step's output directory, or None for the directory itself."""


def this_output_path(name: str | None = None) -> OutputName:
    """The step's own output path (or `name` under it), filled in at run time."""
    if name is None:
        return THIS_OUTPUT_PATH  # (equal to a new one, and immutable: one object serves every step)
    check_output_sub_path(name)
    return OutputName(name)


THIS_OUTPUT_PATH = OutputName(None)


@dataclass(frozen=True)
class VersionedValue(Generic[T]):
    """A config value that is part of the step's version (its hash)."""

    value: T


def versioned(value: T) -> VersionedValue[T]:
    """Mark `value` as versioned: changing it changes the step's hash and output path."""
    if isinstance(value, VersionedValue):
        raise StepDefinitionError(f"versioned() was given a value that is already versioned: {value!r}")
    if isinstance(value, (InputName, ExecutorStep, OutputName)):
        raise StepDefinitionError(
            f"versioned() cannot wrap {type(value).__name__} {value!r}: inputs are always part of "
            "the version (as their producer's version), and the output path is derived from it"
        )
    return VersionedValue(value)


def ensure_versioned(value: T | VersionedValue[T]) -> VersionedValue[T]:
    """`versioned(value)` unless it already is."""
    return value if isinstance(value, VersionedValue) else versioned(value)


def unwrap_versioned_value(value: Any) -> Any:
    """The plain value of a possibly versioned value."""
    return value.value if isinstance(value, VersionedValue) else value


DEFAULT_MIRROR_BUDGET_GB = 10.0
"""Marin's default transfer budget for a mirrored path."""


@dataclass(frozen=True)
class MirroredValue(Generic[T]):
    """A path under the prefix that the step reads, copied there from another storage
    (`$MARIN_MIRROR_SOURCES`) when absent; see `mirrored` and `executor.mirror`."""

    value: T | VersionedValue[T]
    """The path relative to the prefix, or `versioned(...)` of it (then it is in the hash)."""

    budget_gb: float = DEFAULT_MIRROR_BUDGET_GB
    """Most gigabytes (10**9 bytes) one run may copy for it; never part of the version."""

    @property
    def relative_path(self) -> str:
        return unwrap_versioned_value(self.value)


def mirrored(
    value: str | VersionedValue[str], budget_gb: float = DEFAULT_MIRROR_BUDGET_GB
) -> MirroredValue[str]:
    """Marin's `mirrored()`: a path relative to the prefix that is the same everywhere.

    The step sees `<prefix>/<path>`. Before it runs, a path missing there (or a directory
    missing some of its files) is copied from the first of `$MARIN_MIRROR_SOURCES` (other
    prefixes: buckets in other regions, a colleague's tree, a local disk) that holds it, at
    most `budget_gb` per run. Like Marin's, the version looks through it: the path is
    hashed only when given as `versioned(...)`, and the budget never is.
    """
    path = unwrap_versioned_value(value)
    if isinstance(value, (MirroredValue, InputName, ExecutorStep, OutputName)) or not isinstance(path, str):
        raise StepDefinitionError(
            f"mirrored() takes a path relative to the prefix (a str, or versioned(str)), got {value!r}"
        )
    parts = path.strip("/").split("/")
    if path.startswith("/") or "://" in path or any(part in ("", ".", "..") for part in parts):
        raise StepDefinitionError(
            f"mirrored({path!r}): give a path relative to the prefix, like 'raw/dclm', without a "
            "scheme, a leading '/', or '.', '..' or empty parts"
        )
    if (
        isinstance(budget_gb, bool)
        or not isinstance(budget_gb, (int, float))
        or not 0 < budget_gb < float("inf")
    ):
        raise StepDefinitionError(
            f"mirrored({path!r}): budget_gb must be a positive number of gigabytes, got {budget_gb!r}"
        )
    clean = path.rstrip("/")
    return MirroredValue(
        VersionedValue(clean) if isinstance(value, VersionedValue) else clean, float(budget_gb)
    )
