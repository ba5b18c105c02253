"""Small corners of several executor modules that the mutation sample found unpinned.

- executor.py: a failing event listener is logged naming the listener and the event; a
  hard-coded path among the steps is warned about word for word (and runs nothing);
- graph.py: `fn_qualname` of a callable without `__module__` (a method descriptor) uses its
  type's module;
- lease.py: `confirm` holds the swap lock of that lease (not another's) while it refreshes; a
  keeper gone while handing a lease over is logged word for word and the lease counts as lost;
- mirror.py: directory entries in a listing (object stores' directory markers) are not files;
  a root ending in "/" joins with one slash, and only "/" is stripped;
- provenance.py: without versioned `*.dist-info` names, versions come from the distributions'
  metadata, by lower-cased name;
- resources.py: `with_gpu` keeps its regions;
- run_records.py: `**` in the middle of a pattern matches any number of parts, none included;
- runner.py: an interrupted run logs a backend that could not stop a step, word for word, and
  marks the unfinished steps it could take back as failed ("interrupted"), not finished ones;
  a mirror's line is flushed as it is printed;
- template.py: an enum member that does not exist is refused naming the field;
- tree.py: typed configs are restored down to MAX_TYPED_DEPTH containers (dicts and lists
  alike) and not below; a lease holder's host may contain ":" (IPv6).
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import types
from pathlib import Path

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from executor import Executor, LeaseConfig
from executor.graph import Mirror, fn_qualname
from executor.lease import LeaseManager
from executor.lease_keeper import KeeperGone
from executor.mirror import SOURCES_VARIABLE, _files, _join
from executor.provenance import package_versions
from executor.resources import ResourceConfig
from executor.run_records import _matches
from executor.runner import Runner
from executor.steps import InputName
from executor.store import open_store
from executor.template import TemplateError, TrustedCode, decode_template
from executor.tree import (
    MAX_TYPED_DEPTH,
    LeaseRecord,
    Status,
    append_status,
    read_last_status,
    recorded_config,
)
from tests.executor.backend_stand_ins import FlushRecorder

REPO = str(Path(__file__).resolve().parents[2])
QUIET = LeaseConfig(heartbeat_interval=5.0, timeout=10.0, poll_interval=0.05)


# -- executor.py ---------------------------------------------------------------------------------


def _failing_listener(event):
    raise RuntimeError("listener broke")


def test_a_failing_listener_is_logged_naming_it_and_the_event(tmp_path, caplog):
    executor = Executor(str(tmp_path), console=False, listeners=[_failing_listener])
    event = object()
    executor._emit(event)
    (record,) = [r for r in caplog.records if r.name == "executor.executor"]
    assert record.getMessage() == f"event listener {_failing_listener!r} failed on {event!r}"
    assert record.exc_info[0] is RuntimeError
    assert executor.events == [event]


def test_a_hard_coded_path_among_the_steps_is_warned_about_and_runs_nothing(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="executor.executor")
    path = InputName.hardcoded("gs://bucket/raw/data")
    Executor(str(tmp_path), console=False, lease_config=QUIET).run([path])
    messages = [r.getMessage() for r in caplog.records if r.name == "executor.executor"]
    assert f"steps: {path!r} is a hard-coded path, not a step; nothing to run for it" in messages


# -- graph.py ------------------------------------------------------------------------------------


def test_the_qualname_of_a_callable_without_a_module_uses_its_type():
    assert not hasattr(str.upper, "__module__")
    assert fn_qualname(str.upper) == "builtins:str.upper"


# -- lease.py ------------------------------------------------------------------------------------


def test_confirm_refreshes_holding_the_swap_lock_of_that_lease_only(tmp_path):
    root = str(tmp_path / "prefix")
    manager = LeaseManager(open_store(root), QUIET, "w1")
    a, b = f"{root}/a", f"{root}/b"
    manager.try_acquire(a)
    manager.close()
    manager._written[a] -= QUIET.heartbeat_interval  # old enough to be refreshed
    seen = []
    real_refresh = manager.refresh

    def refresh(output_path):
        seen.append((manager._swap_lock(a)._is_owned(), manager._swap_lock(b)._is_owned()))
        return real_refresh(output_path)

    manager.refresh = refresh
    assert manager.confirm(a) is True
    assert seen == [(True, False)]


class _GoneKeeper:
    def send(self, *args):
        pass

    def ask(self, *args):
        raise KeeperGone("its socket closed")


def test_a_keeper_gone_while_handing_over_is_logged_and_the_lease_is_lost(tmp_path, caplog):
    root = str(tmp_path / "prefix")
    manager = LeaseManager(open_store(root), QUIET, "w1", keeper_prefix=root)
    manager._keeper_client = _GoneKeeper
    output = f"{root}/a"
    assert manager.try_acquire(output).acquired
    assert manager.hand_over(output) is None
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "executor.lease"]
    assert messages == [
        (
            logging.ERROR,
            f"the lease keeper is gone: its socket closed; treating the lease on {output} as lost",
        )
    ]


# -- mirror.py -----------------------------------------------------------------------------------


class _MarkerListing(MemoryFileSystem):
    """A store whose listing includes directories, as object stores list directory markers."""

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
        return super().find(path, maxdepth=maxdepth, withdirs=True, detail=detail, **kwargs)


def test_directory_entries_of_a_listing_are_not_files():
    fs = _MarkerListing()
    root = f"/mirror-markers-{os.getpid()}"
    fs.pipe({f"{root}/a.txt": b"alpha", f"{root}/sub/b.txt": b"be"})
    try:
        assert any(d["type"] == "directory" for d in fs.find(root, detail=True).values())
        assert _files(fs, root, "source") == {"a.txt": 5, "sub/b.txt": 2}
    finally:
        fs.rm(root, recursive=True)


def test_a_root_ending_in_a_slash_joins_with_one():
    assert _join("memory://mirror/raw/", "a/b.txt") == "memory://mirror/raw/a/b.txt"
    assert _join("/data/raw ", "a.txt") == "/data/raw /a.txt"
    assert _join("/data/raw/", "") == "/data/raw/"


# -- provenance.py -------------------------------------------------------------------------------


def test_versions_fall_back_to_the_distributions_metadata(tmp_path, monkeypatch):
    info = tmp_path / "Odd_Layout.dist-info"  # no version in the name
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: Odd_Layout\nVersion: 1.2.3\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert package_versions() == {"odd_layout": "1.2.3"}


# -- resources.py --------------------------------------------------------------------------------


def test_with_gpu_keeps_its_regions():
    config = ResourceConfig.with_gpu("H100", count=2, regions=["us-east5"])
    assert config.regions == ("us-east5",)
    assert ResourceConfig.with_gpu().regions is None


# -- run_records.py ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("relpath", "expected"),
    [("logs/run.txt", True), ("logs/a/b/run.txt", True), ("logs/a/other.txt", False), ("run.txt", False)],
)
def test_a_double_star_in_the_middle_matches_any_number_of_parts(relpath, expected):
    assert _matches("logs/**/run.txt", relpath) is expected


# -- runner.py -----------------------------------------------------------------------------------


class _Unstoppable:
    def cancel(self, output_path):
        raise RuntimeError("no such process")


def test_an_interrupt_marks_unfinished_steps_failed_and_logs_what_could_not_be_stopped(tmp_path, caplog):
    root = str(tmp_path / "prefix")
    store = open_store(root)
    leases = LeaseManager(store, QUIET, "w1")
    finished, unfinished = f"{root}/done", f"{root}/killed"
    append_status(store, finished, Status.SUCCESS, None, "w1/step:host:1:x")
    append_status(store, unfinished, Status.RUNNING, None, "w1/step:host:1:x")
    runner = Runner(None, store, leases, emit=lambda event: None, backend=_Unstoppable())
    try:
        runner._interrupt([finished, unfinished])
    finally:
        leases.close()
    errors = [r for r in caplog.records if r.name == "executor.runner" and r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [f"could not stop {finished}", f"could not stop {unfinished}"]
    assert all(r.exc_info[0] is RuntimeError for r in errors)
    assert read_last_status(store, finished).status == Status.SUCCESS
    last = read_last_status(store, unfinished)
    assert (last.status, last.message, last.worker) == (Status.FAILED, "interrupted", "w1")
    assert not leases.holds(unfinished)


def test_a_mirror_line_is_flushed_as_it_is_printed(tmp_path, monkeypatch):
    source, prefix = tmp_path / "source", tmp_path / "prefix"
    (source / "raw").mkdir(parents=True)
    (source / "raw" / "a.txt").write_text("alpha")
    monkeypatch.setenv(SOURCES_VARIABLE, str(source))
    row = types.SimpleNamespace(
        name="train", step=types.SimpleNamespace(mirrors=[Mirror("data", "raw", f"{prefix}/raw", 1.0)])
    )
    runner = Runner(None, open_store(str(prefix)), None, emit=lambda event: None)
    stdout = FlushRecorder()
    monkeypatch.setattr(sys, "stdout", stdout)
    assert runner._ensure_mirrors(row) is None
    monkeypatch.undo()
    assert stdout.getvalue().startswith("train: ")
    assert stdout.flushed and stdout.flushed[-1] == stdout.getvalue()
    assert (prefix / "raw" / "a.txt").read_text() == "alpha"


# -- template.py ---------------------------------------------------------------------------------


class Mode(enum.Enum):
    FAST = "fast"


def test_an_enum_member_that_does_not_exist_is_refused_naming_the_field():
    record = {"run": {"mode": {"__enum__": f"{__name__}:Mode", "name": "MISSING"}}}
    with pytest.raises(TemplateError) as refused:
        decode_template(record, lambda path: None, policy=TrustedCode(checkout=REPO))
    assert str(refused.value) == f"field 'run.mode': {__name__}:Mode has no member 'MISSING'"


# -- tree.py -------------------------------------------------------------------------------------


def _nested_dicts(levels):
    """A dict `levels` deep under the root, each typed, and the types by path."""
    value, paths = {"leaf": 1}, []
    for _ in range(levels):
        value = {"a": value}
    path = ""
    for _ in range(levels + 1):
        paths.append(path)
        path = f"{path}.a" if path else "a"
    return value, {p: "T" for p in paths}


def _typed_depths(restored, key):
    depths, depth = [], 0
    while isinstance(restored, (dict, list)):
        if isinstance(restored, dict):
            if "__type__" in restored:
                depths.append(depth)
            restored = restored.get(key)
        else:
            restored = restored[0]
        depth += 1
    return depths


def test_typed_dicts_are_restored_down_to_the_depth_limit_and_no_further():
    config, config_types = _nested_dicts(MAX_TYPED_DEPTH + 1)
    restored = recorded_config({"config": config, "config_types": config_types})
    assert _typed_depths(restored, "a") == list(range(MAX_TYPED_DEPTH + 1))


@pytest.mark.parametrize(("levels", "typed"), [(MAX_TYPED_DEPTH, True), (MAX_TYPED_DEPTH + 1, False)])
def test_typed_dicts_inside_lists_are_restored_down_to_the_depth_limit(levels, typed):
    value, path = {"x": 1}, ""
    for _ in range(levels):
        value = [value]
        path += "[0]"
    restored = recorded_config({"config": value, "config_types": {path: "T", "unused": "U"}})
    for _ in range(levels):
        restored = restored[0]
    assert ("__type__" in restored) is typed


def test_a_lease_holder_host_may_contain_colons():
    record = LeaseRecord(worker="w1/step:fe80::1:4321:ab12cd34", heartbeat=0.0)
    assert (record.host, record.pid) == ("fe80::1", 4321)
    plain = LeaseRecord(worker="node-3:77:ab12cd34", heartbeat=0.0)
    assert (plain.host, plain.pid) == ("node-3", 77)
