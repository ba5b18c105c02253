"""From step declarations to a resolved, versioned DAG.

This is where a step gets its identity. The *version* of a step is the JSON value

    {"name": <step name>,
     "config": {<dotted field path>: <value>, ...},
     "dependencies": [<version hash of each upstream step>, ...]}

where `config` holds

- every value wrapped in `versioned()`, under its field path (`model.hidden_dim`);
- every input, as the placeholder `DEP[i]` or `DEP[i]/sub/path`, where `i` indexes
  `dependencies` (so the input's *version*, not its location, is what counts);
- every hard-coded input path, as written.

Nothing else enters it: unversioned fields (worker counts, log cadence) can change
without invalidating outputs, and the prefix never appears, so the same experiment
run under two prefixes (two regions, a laptop and a cluster) has the same versions.
Dependencies count whether they are blocking or not, and transitively: an upstream
change changes every downstream hash.

The version hash is the SHA-256 of the canonical JSON of the version. The output path
is `<prefix>/<name>-<first 8 hex digits>`. Eight digits (32 bits) keep paths short
enough to read and type; a collision needs two versions *of the same name*, and even
with 10,000 versions of one name its probability is about 1%. Should one ever happen
the executor notices (the stored version differs) and refuses to reuse the output
instead of silently returning the wrong data. Marin uses 6 hex digits of MD5.

Steps whose versions are equal collapse into one (the same step built twice by a
helper function); two steps that are *not* interchangeable but resolve to one output
path are an error, and so is an output directory inside another step's output or
inside `<prefix>/experiments/` (where the experiment manifests go).

Limits (`executor.fingerprint`): configs nest at most 100 containers deep and a step's
version encodes to at most 1 MiB; beyond either the step is refused, naming the field.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field

from executor.fingerprint import (
    MAX_DEPTH,
    MAX_VERSION_BYTES,
    UnencodableValueError,
    ValueTooDeepError,
    canonical_json,
    encode,
    sha256_hex,
    short_path,
)
from executor.lazy_logging import LazyLogger
from executor.records import dataclass, record
from executor.steps import (
    RESERVED_FIRST_PARTS,
    ExecutorStep,
    InputName,
    MirroredValue,
    OutputName,
    StepDefinitionError,  # defined in executor.resources; `from executor.graph import` keeps working
    VersionedValue,
    check_hardcoded_path,
    check_input_sub_path,
    check_output_sub_path,
    shown,
)
from executor.walker import UNBUILT, encode_mapped, map_markers

TYPE_CHECKING = False  # (`typing` only for type checkers: importing it costs every start ~2 ms)
if TYPE_CHECKING:
    from typing import Any

logger = LazyLogger(__name__)

HASH_LENGTH = 8
"""Hex digits of the version hash used in output paths (see the module docstring)."""


def join_path(base: str, sub: str | None) -> str:
    """`base/sub` for local paths and URLs alike (no normalisation of `base`)."""
    if not sub:
        return base
    return f"{base.rstrip('/')}/{sub.lstrip('/')}"


def is_absolute_path(path: str) -> bool:
    return path.startswith("/") or "://" in path


def storage_of(path: str) -> str:
    """The storage a path is on: "file" for local paths (with or without `file://`), else its scheme."""
    return path.split("://", 1)[0] if "://" in path and not path.startswith("file://") else "file"


def fn_qualname(fn: Any) -> str:
    """`module:qualname` of a step function (what `.executor_info` records)."""
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{qualname}"


@dataclass(frozen=True)
class Mirror:
    """A `mirrored()` path of a step's config, made present before the step runs (`executor.mirror`)."""

    field: str
    """The config field holding it (dotted path)."""

    relative_path: str
    """The path relative to the prefix, as given to `mirrored()`."""

    path: str
    """`<prefix>/<relative_path>`: what the step sees."""

    budget_gb: float
    """Most gigabytes one run may copy for it."""


class _computed_once:
    """`functools.cached_property` without its lock (Python 3.11 takes an RLock on every first
    read: a tenth of planning a cached step). The value is a pure function of the frozen step,
    so two threads computing it at once store equal values."""

    def __init__(self, compute):
        self.compute = compute
        self.name = compute.__name__
        self.__doc__ = compute.__doc__

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value


@dataclass(frozen=True, eq=False)
class ResolvedStep:
    """A step with its version, output path and concrete config. Immutable."""

    step: ExecutorStep
    """The declaration (the first one, when several collapsed into this step)."""

    name: str
    version: dict
    """The version value described in the module docstring."""

    version_hash: str
    """Full SHA-256 hex digest of the canonical JSON of `version`."""

    output_path: str
    config: Any
    """The config with every placeholder replaced by a concrete path (what `fn` gets). Built on
    first read where `resolve` could digest it without building it (`_config_or_digest`)."""

    blocking_deps: tuple[str, ...]
    """Output paths of the upstream steps this one waits for."""

    nonblocking_deps: tuple[str, ...]
    """Output paths of upstream steps whose paths are used without waiting for them."""

    mirrors: tuple[Mirror, ...] = ()
    """The `mirrored()` paths of the config, in field order."""

    @property
    def dependencies(self) -> tuple[str, ...]:
        return self.blocking_deps + self.nonblocking_deps

    @_computed_once
    def config_record(self) -> Any:
        """The concrete config as JSON primitives, as recorded in `.executor_info`."""
        return self._encode_config()

    @_computed_once
    def config_as_recorded(self) -> tuple[Any, dict[str, str]]:
        """`config_record` as `.executor_info` and the experiment manifest record it: without
        class names, and the class names by field (`executor.tree.split_config_types`). Made
        once: a cold run records it three times (its `.executor_info`, the manifest before
        and after the run)."""
        from executor.tree import split_config_types

        return split_config_types(self.config_record)

    @_computed_once
    def config_digest(self) -> str:
        """Hash of the whole concrete config, versioned or not (for the reuse warning)."""
        # The record is not kept for this: a cached re-run digests every step's config and
        # records none of them (kept, it was ~0.5 KB more per step of a plan's memory).
        record = self.__dict__.get("config_record")
        return sha256_hex(canonical_json(self._encode_config() if record is None else record))

    def _encode_config(self) -> Any:
        try:
            return encode(self.config, strict=False)
        except UnencodableValueError as error:
            raise _unencodable_config(self.name, error) from None

    @property
    def fn_name(self) -> str:
        return fn_qualname(self.step.fn)


class _ConfigOnFirstRead:
    """`ResolvedStep.config` of a step `resolve` made without it (`_config_or_digest`): built
    on first read, from the declaration and the `_VersionBuilder` kept for it until then.
    Two threads reading it at once may each build one; the first stored is kept."""

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        attributes = instance.__dict__
        builder = attributes.get("_builder")
        if builder is None:  # (another thread built it meanwhile)
            return attributes["config"]
        config = attributes.setdefault("config", _concrete_config(instance.step, builder))
        attributes.pop("_builder", None)
        return config


ResolvedStep.config = _ConfigOnFirstRead()  # (after the class: not a default of the field)


@dataclass(frozen=True)
class StepGraph:
    """The resolved DAG: steps in topological order, keyed by output path."""

    prefix: str
    steps: tuple[ResolvedStep, ...]
    """Topological order: every step comes after all of its dependencies."""

    by_declaration: dict[int, ResolvedStep] = field(repr=False)
    """id(ExecutorStep) -> resolved step, for every declaration seen (collapsed ones too)."""

    declarations: tuple[ExecutorStep, ...] = field(repr=False)
    """Every declaration seen, in topological order (keeps the ids above alive)."""

    @functools.cached_property
    def by_path(self) -> dict[str, ResolvedStep]:
        return {step.output_path: step for step in self.steps}

    @functools.cached_property
    def names_by_path(self) -> dict[str, str]:
        return {step.output_path: step.name for step in self.steps}

    def resolved(self, step: ExecutorStep) -> ResolvedStep:
        return self.by_declaration[id(step)]


def validate_declaration(step: Any, fn_kinds: dict[int, str | None] | None = None) -> None:
    """Raise StepDefinitionError if `step` cannot be a step at all. `fn_kinds`: what
    `_fn_problem` said of each function so far, by id (steps share functions; the caller keeps
    the functions alive while the dict is in use)."""
    if not isinstance(step, ExecutorStep):
        raise StepDefinitionError(f"expected an ExecutorStep, got {type(step).__name__}: {step!r}")
    # The name was checked when the step was built (ExecutorStep.__post_init__).
    fn = step.fn
    if fn_kinds is not None and id(fn) in fn_kinds:
        problem = fn_kinds[id(fn)]
    else:
        if not callable(fn):
            swapped = (
                " (are fn and config swapped? it is ExecutorStep(name, fn, config))"
                if callable(step.config) and _is_dataclass_instance(fn)
                else ""
            )
            raise StepDefinitionError(
                f"step {step.name!r}: fn must be callable, got {type(fn).__name__}{swapped}: give the "
                "function to call with the config, fn(config)"
            )
        problem = _fn_problem(fn)
        if fn_kinds is not None:
            fn_kinds[id(fn)] = problem
    if problem is not None:
        raise StepDefinitionError(f"step {step.name!r}: fn {fn_qualname(step.fn)} {problem}")
    override = step.override_output_path
    if override is not None and not isinstance(override, str):
        raise StepDefinitionError(
            f"step {step.name!r}: override_output_path must be a string, got {shown(override)}: give the "
            "path as text (relative paths are under the prefix)"
        )
    if override is not None and not _is_clean_path(override):
        raise StepDefinitionError(
            f"step {step.name!r}: override_output_path {override!r} is invalid: give a non-empty path "
            "without '.', '..' or empty parts (relative paths are under the prefix)"
        )
    config = step.config
    if isinstance(config, _PATH_MARKERS) or (
        isinstance(config, VersionedValue) and not _is_dataclass_instance(config.value)
    ):
        # They are dataclasses too, but fn would get a path (or a bare value) instead of a config.
        what = f"the ExecutorStep {config.name!r}" if isinstance(config, ExecutorStep) else repr(config)
        gets = "the bare value" if isinstance(config, VersionedValue) else "a path string"
        raise StepDefinitionError(
            f"step {step.name!r}: config is {what}, not a config dataclass instance, so fn would get "
            f"{gets}. Put it in a field of a (frozen) config dataclass, e.g. "
            "config=MyConfig(input_path=output_path_of(step), output_path=this_output_path())"
        )
    if config is not None and not _is_dataclass_instance(config):
        raise StepDefinitionError(
            f"step {step.name!r}: config must be a dataclass instance or None, got {type(config).__name__}; "
            "wrap the values in a (frozen) dataclass"
        )


_PATH_MARKERS = (ExecutorStep, InputName, OutputName, MirroredValue)
"""Markers that are dataclasses but would reach `fn` as a path string if used as the config."""

_NOT_PLAIN_FLAGS = (
    (inspect.CO_ASYNC_GENERATOR, "an async generator function"),
    (inspect.CO_COROUTINE, "an async function"),
    (inspect.CO_GENERATOR, "a generator function"),
)


def _is_dataclass_instance(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _fn_problem(fn: Any) -> str | None:
    """Why the callable `fn` cannot be a step function (the rest of a message that starts with
    `fn module:qualname`); None when it can: not a generator or async function
    (`_not_plain_function`), and callable with one positional argument, as `fn(config)`."""
    kind = _not_plain_function(fn)
    if kind is not None:
        return (
            f"is {kind}: calling it would only create {'a coroutine' if 'async' in kind else 'a generator'} "
            "and run none of its body. Use a plain function (def, without yield) that does the work "
            "before it returns"
        )
    if _surely_takes_one_argument(fn):
        return None
    try:
        # Not through `__wrapped__`: a decorator may well take other arguments than what it wraps.
        signature = inspect.signature(fn, follow_wrapped=False)
    except (TypeError, ValueError):
        return None  # (a builtin without a signature: it says so itself when called)
    try:
        signature.bind(None)
    except TypeError as error:
        qualname = getattr(fn, "__qualname__", "")
        method = ""
        if list(signature.parameters)[:1] == ["self"] and "." in qualname:
            owner, _, attribute = qualname.rpartition(".")
            method = f" (a method taken from its class: pass it from an instance, {owner}().{attribute})"
        return (
            f"{signature} cannot be called as fn(config) ({error}){method}: the executor calls it with the "
            "step's config as its one argument; define it as def f(config) (other parameters need defaults)"
        )
    return None


def _surely_takes_one_argument(fn: Any) -> bool:
    """Whether `fn` -- a Python function, a bound method of one or a functools.partial of one
    without keywords -- can be called with one positional argument, read from its code object
    (`inspect.signature` costs 10-30 us, and a sweep may make a function per step). False when
    it cannot, or when `fn` is anything else: `inspect.signature` decides then."""
    bound = 0
    if type(fn) is functools.partial and not fn.keywords:
        bound, fn = len(fn.args), fn.func
    if type(fn) is types.MethodType:
        bound, fn = bound + 1, fn.__func__
    if type(fn) is not types.FunctionType:
        return False
    code = fn.__code__
    if code.co_kwonlyargcount > len(fn.__kwdefaults__ or ()):
        return False  # a keyword-only parameter without a default
    count = code.co_argcount
    if count <= bound:
        return bool(code.co_flags & inspect.CO_VARARGS)
    return count - len(fn.__defaults__ or ()) <= bound + 1


def _not_plain_function(fn: Any) -> str | None:
    """What kind of function `fn` is when calling it returns a generator or coroutine without
    running its body ("a generator function", "an async function", "an async generator
    function"), directly, through functools.partial, as a bound method or as a callable
    object's __call__; None for anything else."""
    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.ismethod(target):
        target = target.__func__
    if not inspect.isfunction(target) and not isinstance(target, type):
        target = inspect.getattr_static(type(target), "__call__", None)  # a callable object
    if not inspect.isfunction(target):
        return None  # a class, a builtin, a C extension's callable: runs when called
    flags = target.__code__.co_flags
    for flag, kind in _NOT_PLAIN_FLAGS:
        if flags & flag:
            return kind
    return None


def _is_clean_path(path: str) -> bool:
    """Non-empty, and no '', '.' or '..' part (a trailing '/' is allowed)."""
    parts = path.split("://", 1)[-1].rstrip("/").split("/")
    if parts[0] == "" and not path.startswith("//"):
        parts = parts[1:]  # an absolute local path
    return bool(parts) and not any(part in ("", ".", "..") for part in parts)


Marker = tuple[object, str, int]
"""A marker found in a step's config: (marker, field path, depth), in walk order."""


def _find_markers(step: ExecutorStep) -> list[Marker]:
    """Every marker in `step`'s config, in field order (one walk, shared by collection and versioning)."""
    found: list[Marker] = []

    def visit(marker: Any, path: str, depth: int) -> Any:
        found.append((marker, path, depth))
        return marker

    try:
        map_markers(step.config, visit)
    except StepDefinitionError:
        raise
    except ValueError as error:  # the walker's refusals: too deep, a placeholder in an init=False field
        raise StepDefinitionError(f"step {step.name!r}: {error}") from None
    return found


def _upstream(markers: list[Marker], step: ExecutorStep) -> list[ExecutorStep]:
    """The upstream steps the markers of `step` refer to, in field order."""
    found = []
    for marker, path, _ in markers:
        if isinstance(marker, ExecutorStep):
            found.append(marker)
        elif isinstance(marker, InputName) and marker.step is not None:
            if not isinstance(marker.step, ExecutorStep):  # InputName(...) built around something else
                raise StepDefinitionError(
                    f"step {step.name!r}, field {path!r}: the input's step is {shown(marker.step)}, not an "
                    "ExecutorStep; write output_path_of(step) (or step / 'sub') with the step itself"
                )
            found.append(marker.step)
    return found


def collect_steps(roots: Iterable[ExecutorStep]) -> list[ExecutorStep]:
    """All steps reachable from `roots`, dependencies first. Raises on a cycle.

    Iterative, so a 10,000-step chain does not hit Python's recursion limit.
    """
    return _collect(roots)[0]


def _collect(roots: Iterable[ExecutorStep]) -> tuple[list[ExecutorStep], dict[int, list[Marker]]]:
    """`collect_steps`, and the markers of each step by id."""
    order: list[ExecutorStep] = []
    state: dict[int, int] = {}  # id -> 1 while on the stack, 2 when done
    inputs_cache: dict[int, list[ExecutorStep]] = {}
    markers: dict[int, list[Marker]] = {}
    fn_kinds: dict[int, str | None] = {}
    for root in roots:
        validate_declaration(root, fn_kinds)
        if state.get(id(root)) == 2:
            continue
        stack: list[tuple[ExecutorStep, int]] = [(root, 0)]
        path: list[ExecutorStep] = [root]
        state[id(root)] = 1
        while stack:
            node, index = stack[-1]
            inputs = inputs_cache.get(id(node))
            if inputs is None:
                found = markers[id(node)] = _find_markers(node)
                inputs = inputs_cache[id(node)] = _upstream(found, node)
            if index < len(inputs):
                stack[-1] = (node, index + 1)
                child = inputs[index]
                child_state = state.get(id(child))
                if child_state == 2:
                    continue
                if child_state == 1:
                    start = next(i for i, s in enumerate(path) if s is child)
                    cycle = " -> ".join(s.name for s in [*path[start:], child])
                    raise StepDefinitionError(f"dependency cycle: {cycle}")
                validate_declaration(child, fn_kinds)
                state[id(child)] = 1
                stack.append((child, 0))
                path.append(child)
            else:
                stack.pop()
                path.pop()
                state[id(node)] = 2
                order.append(node)
    return order, markers


class _VersionBuilder:
    """Mutable scratch space for resolving one step; discarded after resolution."""

    __slots__ = (
        "step",
        "prefix",
        "resolved",
        "config_version",
        "dep_hashes",
        "dep_paths",
        "blocking",
        "output_path",
        "mirrors",
    )

    def __init__(self, step: ExecutorStep, prefix: str, resolved: dict[int, ResolvedStep]):
        self.step = step
        self.prefix = prefix
        self.resolved = resolved
        self.config_version: dict[str, Any] = {}
        self.dep_hashes: list[str] = []
        self.dep_paths: list[str] = []
        self.blocking: dict[str, bool] = {}
        self.output_path: str | None = None  # known only once the version is
        self.mirrors: list[Mirror] = []

    def dep_index(self, upstream: ResolvedStep, block: bool) -> int:
        if upstream.output_path in self.blocking:
            self.blocking[upstream.output_path] |= block
            return self.dep_paths.index(upstream.output_path)
        self.dep_hashes.append(upstream.version_hash)
        self.dep_paths.append(upstream.output_path)
        self.blocking[upstream.output_path] = block
        return len(self.dep_paths) - 1

    def record(self, path: str, value: Any) -> None:
        if path in self.config_version:
            raise StepDefinitionError(
                f"step {self.step.name!r}: two versioned values or inputs map to the field path {path!r} "
                "(dict keys like 1 and '1', or keys containing '.'); use distinct string keys without '.'"
            )
        self.config_version[path] = value

    def add(self, marker: Any, path: str, depth: int) -> None:
        """Record a marker of the step's config in its version."""
        if isinstance(marker, ExecutorStep):
            marker = InputName(marker, None)
        if isinstance(marker, InputName):
            if marker.step is not None and marker.name:
                # Refused where `step / "sub"` is made; InputName(step, "sub") itself is not checked.
                check_input_sub_path(marker.step, marker.name, f"step {self.step.name!r}, field {path!r}: ")
            if marker.step is None:
                # Refused by InputName.hardcoded(); InputName(None, path) itself is not checked.
                check_hardcoded_path(
                    marker.name,
                    f"the hard-coded path {marker.name!r}",
                    f"step {self.step.name!r}, field {path!r}: ",
                )
                self.record(path, marker.name)
                return
            upstream = self.resolved[id(marker.step)]
            index = self.dep_index(upstream, marker.block_on_step)
            self.record(path, f"DEP[{index}]" + (f"/{marker.name}" if marker.name else ""))
            return
        if isinstance(marker, VersionedValue):
            try:
                encoded = encode(marker.value, path, depth=depth)  # one depth limit for the whole config
            except ValueTooDeepError as error:
                raise StepDefinitionError(
                    f"step {self.step.name!r}: versioned field {path!r} is nested more than {MAX_DEPTH} "
                    f"levels deep (at {short_path(error.field_path)}); flatten it, or version a digest "
                    "of it instead"
                ) from None
            except UnencodableValueError as error:
                raise StepDefinitionError(f"step {self.step.name!r}: versioned {error}") from None
            self.record(path, encoded)
            return
        if isinstance(marker, MirroredValue):
            # As in Marin, the version looks through it: only a versioned path counts.
            if isinstance(marker.value, VersionedValue):
                self.record(path, marker.relative_path)
            self.mirrors.append(
                Mirror(
                    path, marker.relative_path, join_path(self.prefix, marker.relative_path), marker.budget_gb
                )
            )
            return
        if not isinstance(marker, OutputName):
            raise AssertionError(f"unexpected marker {marker!r}")
        if marker.name:  # refused by this_output_path(); OutputName(name) itself is not checked
            check_output_sub_path(marker.name, f"step {self.step.name!r}, field {path!r}: ")

    def concrete(self, marker: Any, path: str, depth: int) -> Any:
        """Walker callback, once the output path is known: the marker's concrete value."""
        if isinstance(marker, VersionedValue):
            return marker.value
        if isinstance(marker, OutputName):
            return join_path(self.output_path, marker.name)
        if isinstance(marker, MirroredValue):
            return join_path(self.prefix, marker.relative_path)
        if isinstance(marker, ExecutorStep):
            return self.resolved[id(marker)].output_path
        if marker.step is None:  # an InputName with a hard-coded path
            return marker.name if is_absolute_path(marker.name) else join_path(self.prefix, marker.name)
        return join_path(self.resolved[id(marker.step)].output_path, marker.name)


def resolve(roots: Sequence[ExecutorStep], prefix: str) -> StepGraph:
    """Collect, version and place every step reachable from `roots`."""
    declarations, markers = _collect(roots)
    resolved: dict[int, ResolvedStep] = {}
    by_path: dict[str, ResolvedStep] = {}
    unique: list[ResolvedStep] = []
    for step in declarations:
        builder = _VersionBuilder(step, prefix, resolved)
        for marker, path, depth in markers[id(step)]:
            builder.add(marker, path, depth)
        version = {"name": step.name, "config": builder.config_version, "dependencies": builder.dep_hashes}
        try:
            version_json = canonical_json(version)
            if len(version_json) > MAX_VERSION_BYTES // 4 and len(version_json.encode()) > MAX_VERSION_BYTES:
                _refuse_large_version(step, builder.config_version, len(version_json.encode()))
            version_hash = sha256_hex(version_json)
        except (ValueError, UnicodeError) as error:  # see _refuse_unencodable
            if isinstance(error, StepDefinitionError):
                raise
            _refuse_unencodable(step, builder.config_version, error)
        default_path = join_path(prefix, f"{step.name}-{version_hash[:HASH_LENGTH]}")
        output_path = default_path
        if step.override_output_path is not None:
            override = step.override_output_path
            if storage_of(override) != storage_of(prefix):
                # Everything of a run goes through the prefix's storage: a foo:// path would be
                # written as a local directory named "foo:".
                raise StepDefinitionError(
                    f"step {step.name!r}: override_output_path {override!r} is on {storage_of(override)}://, "
                    f"not on the prefix's storage ({prefix}); give a path relative to the prefix or on "
                    "the same storage"
                )
            output_path = override if is_absolute_path(override) else join_path(prefix, override)
            output_path = output_path.rstrip("/")
            if output_path != default_path:
                logger.warning(
                    "step %r: override_output_path %s differs from the versioned path %s; "
                    "changes to its versioned config will not change where it is written",
                    step.name,
                    output_path,
                    default_path,
                )
        builder.output_path = output_path
        blocking = builder.blocking
        # `record`, not the constructor: this runs for every step of every run (the frozen
        # `__init__` sets each of the nine fields through object.__setattr__).
        candidate = record(
            ResolvedStep,
            {
                "step": step,
                "name": step.name,
                "version": version,
                "version_hash": version_hash,
                "output_path": output_path,
                "blocking_deps": tuple([p for p in builder.dep_paths if blocking[p]]),
                "nonblocking_deps": tuple([p for p in builder.dep_paths if not blocking[p]]),
                "mirrors": tuple(builder.mirrors),
                **_config_or_digest(step, builder, bool(markers[id(step)])),
            },
        )
        existing = by_path.get(output_path)
        if existing is not None:
            _check_interchangeable(existing, candidate)
            resolved[id(step)] = existing
            continue
        resolved[id(step)] = by_path[output_path] = candidate
        unique.append(candidate)
    _check_output_dirs(unique, prefix)
    return StepGraph(
        prefix=prefix, steps=tuple(unique), by_declaration=resolved, declarations=tuple(declarations)
    )


def _config_or_digest(step: ExecutorStep, builder: _VersionBuilder, has_markers: bool) -> dict[str, Any]:
    """The concrete config for `ResolvedStep`; or, where its encoding can be had without it
    (`encode_mapped`), only its digest, and what builds it when it is first read (a cached
    re-run reads none of them)."""
    if not has_markers:
        return {"config": step.config}
    try:
        encoded = encode_mapped(step.config, builder.concrete)
    except UnencodableValueError as error:
        raise _unencodable_config(step.name, error) from None
    if encoded is UNBUILT:
        return {"config": _concrete_config(step, builder)}
    return {"config_digest": sha256_hex(canonical_json(encoded)), "_builder": builder}


def _unencodable_config(name: str, error: UnencodableValueError) -> StepDefinitionError:
    """A config the lenient encoder refuses: nested too deeply (in a set), or a dict whose keys
    collide once encoded as strings."""
    return StepDefinitionError(f"step {name!r}: config {error}")


def _concrete_config(step: ExecutorStep, builder: _VersionBuilder) -> Any:
    """The config with every marker replaced by its concrete value (one walk)."""
    try:
        return map_markers(step.config, builder.concrete)
    except ValueError as error:  # a placeholder in an init=False field
        raise StepDefinitionError(f"step {step.name!r}: {error}") from None


def _refuse_unencodable(step: ExecutorStep, config_version: dict[str, Any], error: Exception) -> None:
    """A versioned value JSON cannot write (an integer of more than 4,300 digits) or UTF-8
    cannot encode (a lone surrogate, "\\ud800"): refused, naming the first such field."""
    for path, value in config_version.items():
        try:
            sha256_hex(canonical_json(value))
        except (ValueError, UnicodeError):
            where = f"versioned field {path!r}"
            break
    else:
        where = "its version"
    raise StepDefinitionError(
        f"step {step.name!r}: {where} cannot be encoded for hashing ({type(error).__name__}: {error}). "
        "Version a value that can be written as JSON text: a big integer as a string or a digest, "
        "text as valid Unicode"
    ) from None


def _refuse_large_version(step: ExecutorStep, config_version: dict[str, Any], size: int) -> None:
    sizes = {path: len(canonical_json(value).encode()) for path, value in config_version.items()}
    largest = max(sizes, key=sizes.get) if sizes else None
    where = f"versioned field {largest!r} encodes to {sizes[largest]:,} bytes" if largest else "its inputs"
    raise StepDefinitionError(
        f"step {step.name!r}: its version is {size:,} bytes of JSON, over the limit of "
        f"{MAX_VERSION_BYTES:,} ({where}). Version something small that identifies the value "
        "instead (a path to the data, a digest of it, a count), and keep the value itself unversioned"
    )


def _check_output_dirs(steps: Sequence[ResolvedStep], prefix: str) -> None:
    """No step writes inside another step's output, or inside `<prefix>/experiments/`."""
    by_path = {step.output_path: step for step in steps}
    reserved = [join_path(prefix, part) for part in RESERVED_FIRST_PARTS]
    shortest = min(map(len, by_path), default=0)
    for step in steps:
        path = step.output_path
        for directory in reserved:
            if path == directory or path.startswith(directory + "/") or directory.startswith(path + "/"):
                raise StepDefinitionError(
                    f"step {step.name!r} writes to {path}, which collides with {directory}/ where the "
                    "experiment manifests go; change its override_output_path"
                )
        outer = enclosing_output(by_path, path.rpartition("/")[0], shortest)
        if outer is not None:
            raise StepDefinitionError(
                f"step {step.name!r} writes to {path}, inside the output of step {outer.name!r} "
                f"({outer.output_path}): their files and status would mix. Rename {step.name!r} "
                "(or change its override_output_path) so that it writes next to it"
            )


def enclosing_output(
    by_path: Mapping[str, ResolvedStep], path: str, shortest: int = 1
) -> ResolvedStep | None:
    """The step whose output directory is `path` or a directory above it (None if none is).
    `shortest`: no output path in `by_path` is shorter (the walk up stops there)."""
    cut = len(path)
    while cut >= shortest and cut > 0:
        step = by_path.get(path[:cut])
        if step is not None:
            return step
        cut = path.rfind("/", 0, cut)
    return None


def _check_interchangeable(kept: ResolvedStep, other: ResolvedStep) -> None:
    """Two declarations landed on one output path: fine if they are the same step."""
    problems = []
    if kept.version_hash != other.version_hash:
        problems.append("different versions")
    if kept.step.fn is not other.step.fn:
        problems.append(f"different functions ({kept.fn_name} vs {other.fn_name})")
    if kept.config_digest != other.config_digest:
        from executor.diffing import diff_flat, flatten  # (loaded only to explain a difference)

        changed = [
            entry.field for entry in diff_flat(flatten(kept.config_record), flatten(other.config_record))
        ]
        # With equal versions only unversioned fields can differ; otherwise say no more than "config".
        kind = "unversioned config fields" if kept.version_hash == other.version_hash else "config fields"
        problems.append(f"different {kind}: " + ", ".join(changed))
    if problems:
        raise StepDefinitionError(
            f"steps {kept.name!r} and {other.name!r} both resolve to the output path {kept.output_path} "
            f"but have {'; '.join(problems)}. Give one a different name, version the field that tells "
            "them apart, or remove the override_output_path"
        )
