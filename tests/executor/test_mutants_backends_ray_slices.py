"""The Ray backend's TPU-slice reservation and placement (`executor.backends.ray_cluster`) without
a Ray cluster: candidates among `with_tpu([...])` alternatives, Levanter's `SliceActor`s (a
stand-in here), waiting for what was asked, the hosts' bundles and placement group, recording the
gang, and the actor's exit. tests/integration/test_ray_backend.py runs them on a real cluster.
"""

from __future__ import annotations

import importlib
import os
import time
import types

import pytest

from executor import ResourceConfig
from executor.backends import StepCancelled, StepFunctionError, StepRefused
from executor.backends import ray_cluster as rc
from executor.backends.ray_cluster import _choices
from executor.store import open_store
from executor.tree import read_info, write_info
from tests.executor.backend_stand_ins import node, resolved_interval_step, tpu_slice

_resolved = resolved_interval_step


# -- which slices -------------------------------------------------------------------------------------


def test_slice_candidates_are_the_chosen_then_later_placeable_alternatives():
    resources = ResourceConfig.with_tpu(["v4-32", "v4-8", "v4-64", "v4-16"])
    step = _resolved(resources)
    by_variant = {c.tpu: c for c in _choices(resources)}
    nodes = tpu_slice("a", 8, "v4-64") + tpu_slice("b", 2, "v4-16")
    chosen = by_variant["v4-32"]
    assert rc._slice_candidates(step, chosen, nodes) == [chosen, by_variant["v4-64"], by_variant["v4-16"]]
    # v4-8 is one host (no gang): never a candidate; nothing before the chosen one either
    assert rc._slice_candidates(step, by_variant["v4-64"], nodes) == [
        by_variant["v4-64"],
        by_variant["v4-16"],
    ]
    assert rc._slice_candidates(step, by_variant["v4-64"], tpu_slice("b", 2, "v4-16")[:1]) == [
        by_variant["v4-64"]
    ]


def test_host_bundles_drop_the_slice_head_once_slices_are_reserved():
    (pair,) = _choices(ResourceConfig.with_tpu("v4-8", slice_count=2))
    assert pair.bundles == ({"CPU": 1, "TPU": 4, "TPU-v4-8-head": 1},) * 2
    assert rc._host_bundles(pair, []) == pair.bundles
    piece = rc._Slice("s", "10.0.0.1", ("n0",))
    assert rc._host_bundles(pair, [piece, piece]) == ({"CPU": 1, "TPU": 4},) * 2
    (gpus,) = _choices(ResourceConfig(cpu=1, replicas=2))
    assert rc._host_bundles(gpus, [piece]) == gpus.bundles


def test_a_slice_record():
    assert rc._Slice("s-1", "10.0.0.9", ("n0", "n1")).record() == {
        "name": "s-1",
        "ip": "10.0.0.9",
        "nodes": ["n0", "n1"],
    }


def test_placement_deadline(monkeypatch):
    monkeypatch.delenv(rc.PLACEMENT_TIMEOUT_ENV, raising=False)
    assert rc._placement_deadline() is None
    monkeypatch.setenv(rc.PLACEMENT_TIMEOUT_ENV, "100")
    before = time.monotonic()
    deadline = rc._placement_deadline()
    assert before + 100 <= deadline <= time.monotonic() + 100


# -- waiting for what was asked --------------------------------------------------------------------------


def _waiting_ray(ready_after: int, nodes, values=None, error=None):
    import ray

    calls = []

    def wait(refs, num_returns=None, timeout=None):
        calls.append((list(refs), num_returns, timeout))
        return (list(refs) if len(calls) > ready_after else []), []

    def get(refs):
        if error is not None and refs:
            raise error
        return [values[r] for r in refs] if values else [None for _ in refs]

    return types.SimpleNamespace(
        wait=wait, get=get, nodes=lambda: nodes, calls=calls, exceptions=ray.exceptions
    )


def _pair():
    resources = ResourceConfig(cpu=1, replicas=2)
    (choice,) = _choices(resources)
    return _resolved(resources), choice


def test_wait_ready_returns_the_values_once_all_are_there(monkeypatch):
    monkeypatch.delenv(rc.WAIT_FOR_NODES_ENV, raising=False)
    step, choice = _pair()
    ray = _waiting_ray(2, [node(CPU=1), node(CPU=1)], values={"a": 1, "b": 2})
    assert rc._wait_ready(ray, step, choice, ["a", "b"], None, lambda p: False) == [1, 2]
    assert ray.calls == [(["a", "b"], 2, rc.PLACEMENT_POLL_S)] * 3


def test_wait_ready_reports_a_reservation_that_failed(monkeypatch):
    import ray

    step, choice = _pair()
    error = ray.exceptions.RayTaskError(
        "get_info", "Traceback ...\nRuntimeError: no TPU here", RuntimeError("x")
    )
    with pytest.raises(StepFunctionError) as caught:
        rc._wait_ready(_waiting_ray(0, [], error=error), step, choice, ["a"], None, lambda p: False)
    message = str(caught.value)
    assert type(caught.value) is StepFunctionError
    assert message.startswith(f"its gang ({rc._describe_choice(choice)}) could not be reserved: ")
    assert message.splitlines()[0].endswith(str(error).strip().splitlines()[-1])


def test_wait_ready_stops_when_cancelled():
    step, choice = _pair()
    asked = []
    with pytest.raises(StepCancelled, match="stopped while its gang waited for hosts"):
        rc._wait_ready(_waiting_ray(5, []), step, choice, ["a"], None, lambda p: asked.append(p) or True)
    assert asked == [step.output_path]


def test_wait_ready_refuses_a_gang_the_nodes_cannot_hold_unless_told_to_wait(monkeypatch):
    step, choice = _pair()
    monkeypatch.delenv(rc.WAIT_FOR_NODES_ENV, raising=False)
    with pytest.raises(StepRefused) as caught:
        rc._wait_ready(_waiting_ray(5, [node(CPU=1)]), step, choice, ["a"], None, lambda p: False)
    assert str(caught.value) == rc._unsatisfiable_message(step.name, [choice], [node(CPU=1)])
    for value in ("yes", "1", "true"):
        monkeypatch.setenv(rc.WAIT_FOR_NODES_ENV, value)
        ray = _waiting_ray(2, [node(CPU=1)])
        rc._wait_ready(ray, step, choice, ["a"], None, lambda p: False)
        assert len(ray.calls) == 3


def test_wait_ready_gives_up_at_the_deadline(monkeypatch):
    monkeypatch.delenv(rc.WAIT_FOR_NODES_ENV, raising=False)
    monkeypatch.setenv(rc.PLACEMENT_TIMEOUT_ENV, "12.5")
    step, choice = _pair()
    nodes = [node(CPU=1), node(CPU=1)]
    with pytest.raises(StepFunctionError) as caught:
        rc._wait_ready(_waiting_ray(99, nodes), step, choice, ["a"], time.monotonic() - 1, lambda p: False)
    assert str(caught.value) == (
        f"its gang ({rc._describe_choice(choice)}) was not placed within 12.5 s "
        "($MARIN_RAY_PLACEMENT_TIMEOUT); the hosts are busy"
    )
    ray = _waiting_ray(3, nodes)
    rc._wait_ready(ray, step, choice, ["a"], time.monotonic() + 60, lambda p: False)
    assert len(ray.calls) == 4


# -- reserving slices through Levanter ----------------------------------------------------------------------


class _Host:
    def __init__(self, index, node_id):
        self.actor_info = types.SimpleNamespace(worker_index=index, node_id=node_id)


class _SliceActors:
    """Stands in for levanter.infra.ray_tpu.SliceActor: `options(**o).remote()` makes one."""

    def __init__(self, hosts_per_slice, worker_ids=None, fail_listing=False):
        self.made = []
        self.hosts_per_slice = hosts_per_slice
        self.worker_ids = worker_ids
        self.fail_listing = fail_listing

    def options(self, **options):
        factory = self

        def remote():
            index = len(factory.made)
            ids = factory.worker_ids or list(range(factory.hosts_per_slice))
            actor = types.SimpleNamespace(
                options=options,
                get_info=types.SimpleNamespace(remote=lambda: ("info", index)),
                get_all_pool_members=types.SimpleNamespace(remote=lambda: ("members", index, ids)),
            )
            factory.made.append(actor)
            return actor

        return types.SimpleNamespace(remote=remote)


def _slice_ray(free, nodes, fail_listing=False):
    import ray

    def get(ref):
        if isinstance(ref, list):
            return [get(r) for r in ref]
        if ref[0] == "info":
            return types.SimpleNamespace(slice_name=f"slice-{ref[1]}", ip_address=f"10.1.0.{ref[1]}")
        if fail_listing:
            raise ray.exceptions.ActorDiedError()
        return [_Host(i, f"s{ref[1]}-n{i}") for i in reversed(ref[2])]

    return types.SimpleNamespace(
        available_resources=lambda: free,
        nodes=lambda: nodes,
        wait=lambda refs, num_returns=None, timeout=None: (list(refs), []),
        get=get,
        exceptions=ray.exceptions,
    )


def _with_levanter(monkeypatch, actors, vm_count=None):
    module = importlib.import_module("levanter.infra.ray_tpu")
    monkeypatch.setattr(module, "SliceActor", actors)
    if vm_count is not None:
        monkeypatch.setattr(
            module, "get_tpu_config", lambda variant: types.SimpleNamespace(vm_count=vm_count)
        )


def test_reserve_slices_takes_the_first_candidate_whose_heads_are_free(monkeypatch):
    resources = ResourceConfig.with_tpu(["v4-32", "v4-16"], slice_count=2)
    step = _resolved(resources)
    first, second = _choices(resources)
    actors = _SliceActors(hosts_per_slice=2)
    _with_levanter(monkeypatch, actors)
    nodes = tpu_slice("b", 2, "v4-16") + tpu_slice("a", 2, "v4-16")
    ray = _slice_ray({"TPU-v4-32-head": 1, "TPU-v4-16-head": 2}, nodes)
    gang = rc._Gang(groups=[], actors=[])
    choice, slices = rc._reserve_slices(ray, step, [first, second], gang, lambda p: False, None)
    assert choice is second
    assert gang.reservations == actors.made and len(actors.made) == 2
    tag = actors.made[0].options["name"].rsplit(":", 1)[1]
    for index, actor in enumerate(actors.made):
        assert actor.options == {
            "resources": {"TPU-v4-16-head": 1},
            "num_cpus": 0,
            "name": f"{rc._group_name(step)}:slice-{index}:{tag}",
            "namespace": rc.ACTOR_NAMESPACE,
            "lifetime": "detached",
            "max_restarts": 0,
            "label_selector": {
                rc.TPU_WORKER_LABEL: "0",
                rc.TPU_POD_TYPE_LABEL: "v4-16",
                rc.TPU_SLICE_LABEL: "in(a,b)",
            },
        }
    assert slices == [
        rc._Slice("slice-0", "10.1.0.0", ("s0-n0", "s0-n1")),  # hosts in worker order
        rc._Slice("slice-1", "10.1.0.1", ("s1-n0", "s1-n1")),
    ]


def test_reserve_slices_waits_for_the_preferred_one_when_none_is_free(monkeypatch):
    resources = ResourceConfig.with_tpu(["v4-32", "v4-16"])
    step = _resolved(resources)
    first, second = _choices(resources)
    actors = _SliceActors(hosts_per_slice=4)
    _with_levanter(monkeypatch, actors)
    ray = _slice_ray({"TPU-v4-16-head": 0.5}, [])  # no whole slice seen: no slice-name selector
    choice, slices = rc._reserve_slices(ray, step, [first, second], rc._Gang([], []), lambda p: False, None)
    assert choice is first
    assert actors.made[0].options["label_selector"] == {
        rc.TPU_WORKER_LABEL: "0",
        rc.TPU_POD_TYPE_LABEL: "v4-32",
    }
    assert [s.nodes for s in slices] == [("s0-n0", "s0-n1", "s0-n2", "s0-n3")]


def test_single_host_slices_need_no_selector(monkeypatch):
    resources = ResourceConfig.with_tpu("v4-8", slice_count=2)
    step = _resolved(resources)
    (choice,) = _choices(resources)
    actors = _SliceActors(hosts_per_slice=1)
    _with_levanter(monkeypatch, actors)
    got, slices = rc._reserve_slices(
        _slice_ray({}, []), step, [choice], rc._Gang([], []), lambda p: False, None
    )
    assert got is choice and len(slices) == 2
    assert all("label_selector" not in actor.options for actor in actors.made)


def test_a_slice_levanter_does_not_know_or_counts_differently_is_refused(monkeypatch):
    resources = ResourceConfig.with_tpu("v4-32")
    step = _resolved(resources)
    (choice,) = _choices(resources)
    _with_levanter(monkeypatch, _SliceActors(4), vm_count=8)
    with pytest.raises(StepRefused) as caught:
        rc._reserve_slices(_slice_ray({}, []), step, [choice], rc._Gang([], []), lambda p: False, None)
    assert str(caught.value) == (
        f"step 'train' asks for {choice.description}: Levanter counts 8 hosts in such a slice, this "
        "executor 4; one of the two TPU tables is wrong"
    )
    module = importlib.import_module("levanter.infra.ray_tpu")

    def unknown(variant):
        raise ValueError(variant)

    monkeypatch.setattr(module, "get_tpu_config", unknown)
    with pytest.raises(StepRefused) as caught:
        rc._reserve_slices(_slice_ray({}, []), step, [choice], rc._Gang([], []), lambda p: False, None)
    assert str(caught.value) == (
        f"step 'train' asks for {choice.description}, which Levanter's TPU table "
        "(levanter.infra.ray_tpu.TPU_CONFIGS) does not know: it cannot reserve such a slice"
    )


def test_slice_hosts_that_cannot_be_listed_or_are_not_workers_0_to_n(monkeypatch):
    resources = ResourceConfig.with_tpu("v4-32")
    step = _resolved(resources)
    (choice,) = _choices(resources)
    _with_levanter(monkeypatch, _SliceActors(4))
    with pytest.raises(StepFunctionError) as caught:
        rc._reserve_slices(
            _slice_ray({}, [], fail_listing=True), step, [choice], rc._Gang([], []), lambda p: False, None
        )
    assert str(caught.value) == "TPU slice slice-0: its hosts could not be listed (ActorDiedError)"
    _with_levanter(monkeypatch, _SliceActors(4, worker_ids=[0, 1, 2, 5]))
    with pytest.raises(StepFunctionError) as caught:
        rc._reserve_slices(_slice_ray({}, []), step, [choice], rc._Gang([], []), lambda p: False, None)
    assert str(caught.value) == (
        "TPU slice slice-0: Levanter reserved hosts with worker ids [0, 1, 2, 5], not 0..3"
    )


# -- the hosts' placement group -----------------------------------------------------------------------------


def test_place_pins_each_process_to_its_slice_host(monkeypatch):
    pg = importlib.import_module("ray.util.placement_group")
    made = []

    class Group:
        def ready(self):
            return "ready"

    def placement_group(bundles, **kwargs):
        made.append((bundles, kwargs))
        return Group()

    monkeypatch.setattr(pg, "placement_group", placement_group)
    waited = []
    monkeypatch.setattr(rc, "_wait_ready", lambda *args: waited.append(args) or [None])
    resources = ResourceConfig.with_tpu("v4-16", slice_count=2)
    (choice,) = _choices(resources)
    step = _resolved(resources)
    slices = [rc._Slice("a", "1", ("a0", "a1")), rc._Slice("b", "2", ("b0", "b1"))]
    gang = rc._Gang([], [])
    rc._place("ray", step, choice, gang, "cancelled", 123.0, slices)
    ((bundles, kwargs),) = made
    assert bundles == [dict(b) for b in rc._host_bundles(choice, slices)]
    assert kwargs == {
        "strategy": "STRICT_SPREAD",
        "name": rc._group_name(step),
        "lifetime": "detached",
        "bundle_label_selector": [{rc.NODE_ID_LABEL: n} for n in ("a0", "a1", "b0", "b1")],
    }
    assert len(gang.groups) == 1
    ((ray, step_, choice_, refs, deadline, cancelled),) = waited
    assert (ray, step_, choice_, refs, deadline, cancelled) == (
        "ray",
        step,
        choice,
        ["ready"],
        123.0,
        "cancelled",
    )
    made.clear()
    (cpus,) = _choices(ResourceConfig(cpu=2, replicas=2))
    rc._place("ray", step, cpus, rc._Gang([], []), "c", None, [])
    ((bundles, kwargs),) = made
    assert bundles == [{"CPU": 2}, {"CPU": 2}] and "bundle_label_selector" not in kwargs


# -- recording and leaving ------------------------------------------------------------------------------------


def test_record_gang_writes_the_device_options_and_gang(tmp_path):
    store = open_store(str(tmp_path))
    output = f"{tmp_path}/train-1"
    spec = types.SimpleNamespace(prefix=str(tmp_path), output_path=output)
    write_info(
        store, {"output_path": output, "dispatch": {"device": "A", "ray_options": {"x": 1}, "gang": {"p": 2}}}
    )
    rc._record_gang(spec, {"device": "B", "ray_options": {"y": 2}, "gang": {"coordinator": "c:1"}})
    assert read_info(store, output)["dispatch"] == {
        "device": "B",
        "ray_options": {"y": 2},
        "gang": {"p": 2, "coordinator": "c:1"},
    }
    write_info(store, {"output_path": output, "dispatch": {"device": "A"}})
    rc._record_gang(spec, {"gang": {"coordinator": "c:2"}})
    assert read_info(store, output)["dispatch"] == {"device": "A", "gang": {"coordinator": "c:2"}}
    rc._record_gang(spec, {})
    assert read_info(store, output)["dispatch"] == {"device": "A", "gang": {"coordinator": "c:2"}}


def test_remove_groups_named_also_kills_the_slice_actors_of_that_name(monkeypatch):
    killed = []
    looked_up = []

    def get_actor(name, namespace=None):
        looked_up.append((name, namespace))
        if name.endswith("broken"):
            raise ValueError("gone")
        return f"actor:{name}"

    fake = types.SimpleNamespace(
        util=types.SimpleNamespace(
            placement_group_table=lambda: {},
            list_named_actors=lambda all_namespaces=False: (
                [
                    {"name": "marin-gang:x:1:slice-0:ab", "namespace": rc.ACTOR_NAMESPACE},
                    {"name": "marin-gang:x:1:slice-1:broken", "namespace": rc.ACTOR_NAMESPACE},
                    {"name": "marin-gang:x:1:slice-2:ab", "namespace": "elsewhere"},
                    {"name": "marin-gang:x:10", "namespace": None},
                    {"name": "other", "namespace": rc.ACTOR_NAMESPACE},
                ]
                if all_namespaces
                else []
            ),
        ),
        get_actor=get_actor,
        kill=lambda actor, no_restart=False: killed.append((actor, no_restart)),
    )
    rc._remove_groups_named(fake, "marin-gang:x:1")
    assert killed == [("actor:marin-gang:x:1:slice-0:ab", True)]
    assert looked_up == [
        ("marin-gang:x:1:slice-0:ab", rc.ACTOR_NAMESPACE),
        ("marin-gang:x:1:slice-1:broken", rc.ACTOR_NAMESPACE),
    ]


def test_exit_frees_the_slices_and_groups_then_ends_the_process(monkeypatch):
    import ray

    pg = importlib.import_module("ray.util.placement_group")
    events = []

    def kill(actor, no_restart=False):
        events.append(("kill", actor, no_restart))
        if actor == "bad":
            raise RuntimeError("gone")

    def remove(group):
        events.append(("remove", group))
        if group == "g-bad":
            raise RuntimeError("gone")

    monkeypatch.setattr(ray, "kill", kill)
    monkeypatch.setattr(pg, "remove_placement_group", remove)
    monkeypatch.setattr(os, "_exit", lambda code: events.append(("exit", code)))
    rc._exit(["g-bad", "g2"], ["bad", "s2"])
    assert events == [
        ("kill", "bad", True),
        ("kill", "s2", True),
        ("remove", "g-bad"),
        ("remove", "g2"),
        ("exit", 0),
    ]


def test_stop_gang_kills_the_slice_actors_too(monkeypatch):
    pg = importlib.import_module("ray.util.placement_group")
    monkeypatch.setattr(pg, "remove_placement_group", lambda group: None)
    killed = []
    rc._stop_gang(
        types.SimpleNamespace(kill=lambda actor, no_restart=False: killed.append(actor)),
        rc._Gang(groups=[], actors=["a"], reservations=["s1", "s2"]),
    )
    assert killed == ["a", "s1", "s2"]


# -- the driver's side of a TPU gang --------------------------------------------------------------------


def test_call_gang_reserves_tpu_slices_before_placing_the_hosts(monkeypatch):
    from executor.backends.ray_cluster import RayBackend

    resources = ResourceConfig.with_tpu(["v4-32", "v4-16"])
    step = _resolved(resources)
    first, second = _choices(resources)
    backend = RayBackend()
    nodes = tpu_slice("a", 2, "v4-16")
    fake = types.SimpleNamespace(nodes=lambda: nodes)
    monkeypatch.setattr(backend, "_ray", lambda: fake)
    calls = []
    piece = rc._Slice("a", "10.0.0.5", ("a0", "a1"))
    monkeypatch.setattr(rc, "_remove_groups_named", lambda *args: None)
    monkeypatch.setattr(rc, "_stop_gang", lambda *args: None)
    monkeypatch.setattr(rc, "_placement_deadline", lambda: 42.0)
    monkeypatch.setattr(
        rc, "_slice_candidates", lambda *args: calls.append(("candidates", *args)) or ["cands"]
    )
    monkeypatch.setattr(
        rc, "_reserve_slices", lambda *args: calls.append(("reserve", *args)) or (second, [piece])
    )
    monkeypatch.setattr(rc, "_place", lambda *args: calls.append(("place", *args)))
    monkeypatch.setattr(
        backend, "_run_gang", lambda *args: calls.append(("run", *args)) or {"outcome": "succeeded"}
    )
    dispatch = backend._dispatch_record(first)
    assert backend._call_gang(step, dispatch, "spec", b"blob") == {"outcome": "succeeded"}
    candidates, reserve, place, run = calls
    assert candidates == ("candidates", step, first, nodes)
    gang = reserve[4]
    assert reserve == ("reserve", fake, step, ["cands"], gang, backend._is_cancelled, 42.0)
    assert place == ("place", fake, step, second, gang, backend._is_cancelled, 42.0, [piece])
    assert run == ("run", fake, step, second, gang, "spec", b"blob", [piece])


def test_run_gang_on_reserved_slices_records_them_and_uses_their_address(monkeypatch):
    import ray

    from executor.backends.ray_cluster import RayBackend
    from tests.executor.test_mutants_backends_ray_cluster import _gang_ray

    resources = ResourceConfig.with_tpu("v4-8", slice_count=2)
    (choice,) = _choices(resources)
    step = _resolved(resources)
    results = {}
    fake, made = _gang_ray(results)
    slices = [rc._Slice("s0", "10.9.0.1", ("n0",)), rc._Slice("s1", "10.9.0.2", ("n1",))]
    gang = rc._Gang(groups=["g"], actors=[])

    def lost(ref):
        raise ray.exceptions.ActorDiedError()

    class Results(dict):
        def __getitem__(self, name):
            return lost(name) if name.endswith("process-1") else {"outcome": "succeeded", "error": None}

    fake, made = _gang_ray(Results())
    fake.wait = lambda refs, num_returns=1, timeout=None: ([refs[-1]], refs[:-1])  # process 1 first
    with pytest.raises(rc.StepFunctionError) as caught:
        RayBackend()._run_gang(fake, step, choice, gang, "spec", b"blob", slices)
    assert str(caught.value) == "process 1 of 2 (Ray node n1) was lost: ActorDiedError"
    host, member = made
    assert "TPU-v4-8-head" not in host.options["resources"]  # held by the SliceActor
    ((_, _, _, start),) = host.calls
    record = start["record"]
    assert record["device"] == choice.description and record["ray_options"] == choice.options
    gang_record = record["gang"]
    assert gang_record["coordinator"] is None  # JAX reads the slice's own metadata
    assert gang_record["bundles"] == [{"CPU": 1, "TPU": 4}] * 2
    assert gang_record["slices"] == [s.record() for s in slices]
    assert gang_record["slices_reserved_by"] == "levanter.infra.ray_tpu.SliceActor"
    assert start["env"]["MEGASCALE_COORDINATOR_ADDRESS"] == "10.9.0.1:8081"
    assert member.calls[0][5]["MEGASCALE_COORDINATOR_ADDRESS"] == "10.9.0.1:8081"


def test_reserve_slices_waits_with_the_deadline(monkeypatch):
    resources = ResourceConfig.with_tpu("v4-32")
    step = _resolved(resources)
    (choice,) = _choices(resources)
    _with_levanter(monkeypatch, _SliceActors(4))
    real = rc._wait_ready
    deadlines = []
    monkeypatch.setattr(rc, "_wait_ready", lambda *args: deadlines.append(args[4]) or real(*args))
    rc._reserve_slices(_slice_ray({}, []), step, [choice], rc._Gang([], []), lambda p: False, 77.0)
    assert deadlines == [77.0]


def test_single_host_tpu_alternatives_are_no_slice_candidates():
    resources = ResourceConfig.with_tpu(["v4-32", "v4-8", "v4-16"])
    step = _resolved(resources)
    by_variant = {c.tpu: c for c in _choices(resources)}
    nodes = [node(None, CPU=8, TPU=4, **{"TPU-v4-8-head": 1})] + tpu_slice("b", 2, "v4-16")
    assert rc._slice_candidates(step, by_variant["v4-32"], nodes) == [
        by_variant["v4-32"],
        by_variant["v4-16"],
    ]


def test_a_reservation_error_without_text_is_named_by_its_type():
    import ray

    class Quiet(ray.exceptions.RayError):
        def __str__(self):
            return ""

    step, choice = _pair()
    with pytest.raises(StepFunctionError) as caught:
        rc._wait_ready(_waiting_ray(0, [], error=Quiet()), step, choice, ["a"], None, lambda p: False)
    assert str(caught.value) == f"its gang ({rc._describe_choice(choice)}) could not be reserved: Quiet"
