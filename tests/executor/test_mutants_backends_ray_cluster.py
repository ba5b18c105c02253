"""The Ray backend's own logic (`executor.backends.ray_cluster`) without a Ray cluster.

What a step asks for (choices, bundles, gangs), which nodes can hold it, the messages, the
environment of each process of a gang, and the driver's side of a hosted step (single actor
and gang: waiting, losing, cancelling) against a small stand-in for the `ray` module. The
integration tests (tests/integration/test_ray_backend.py) run the same code on a real cluster.
"""

from __future__ import annotations

import os
import sys
import types

import pytest

from executor import ResourceConfig
from executor.backends import StepCancelled, StepFunctionError, StepRefused, UnsatisfiableError
from executor.backends import ray_cluster as rc
from executor.backends.ray_cluster import RayBackend, _Choice, _choices
from executor.resources import GpuConfig
from executor.store import open_store
from executor.tree import read_info, write_info
from tests.executor.backend_stand_ins import node, resolved_interval_step, tpu_slice
from tests.executor.steps_for_heavy import record_interval

# Imported now, not first by the code under test: several tests narrow sys.path (to check what
# the backend sends), and an import first made then fails -- as it did for a test run alone or
# early (mutmut runs a set of tests, in no fixed order).
for _module in ("ray", "ray.util.placement_group", "ray.util.scheduling_strategies"):
    pytest.importorskip(_module)


@pytest.fixture(autouse=True)
def _process_state_restored():
    """StepHost and GangMember run here in the test process, and set what a step's own process
    would keep: the gang's variables in os.environ ($MARIN_PROCESS_ID, Megascale's) and the
    driver's sys.path. Left behind, a later test's training took itself for process 1 of a gang."""
    environ, path = dict(os.environ), list(sys.path)
    yield
    os.environ.clear()
    os.environ.update(environ)
    sys.path[:] = path


_resolved = resolved_interval_step


# -- what is asked -------------------------------------------------------------------------------


def test_process_log_path():
    assert rc.process_log_path("gs://b/out/step-1/", 3) == "gs://b/out/step-1/logs/process-3.log"
    assert rc.process_log_path("/o/s", 1) == "/o/s/logs/process-1.log"


def test_a_plain_dict_asks_for_one_cpu():
    (choice,) = _choices({"accelerator": "any"})
    assert choice == _Choice("CPU", {"num_cpus": 1}, ({"CPU": 1},))
    assert (choice.processes, choice.replicas, choice.hosts_per_replica, choice.tpu) == (1, 1, 1, None)
    assert not choice.multi_host_slices


def test_one_choice_per_device_in_order():
    resources = ResourceConfig(
        cpu=2, ram="2g", device=GpuConfig(count=2), device_alternatives=(GpuConfig(count=1),)
    )
    choices = _choices(resources)
    assert [c.description for c in choices] == [d.describe() for d in resources.devices()]
    assert choices[0].bundles == ({"CPU": 2, "GPU": 2, "memory": 2 * 2**30},)
    assert choices[1].bundles == ({"CPU": 2, "GPU": 1, "memory": 2 * 2**30},)
    assert choices[0].options == resources.ray_options(resources.devices()[0])
    assert all(c.processes == 1 and c.tpu is None for c in choices)


def test_a_single_tpu_host_and_a_gang_of_gpu_replicas():
    (tpu,) = _choices(ResourceConfig.with_tpu("v4-8"))
    assert tpu.tpu == "v4-8" and tpu.processes == 1 and not tpu.multi_host_slices
    assert tpu.description == "TPU v4-8" or "v4-8" in tpu.description
    (gpus,) = _choices(ResourceConfig(cpu=1, device=GpuConfig(count=1), replicas=2))
    assert gpus.processes == 2 and gpus.replicas == 2 and gpus.hosts_per_replica == 1
    assert gpus.description.endswith(" x2 replicas")
    assert gpus.tpu is None and not gpus.multi_host_slices
    (slices,) = _choices(ResourceConfig.with_tpu("v4-8", slice_count=3))
    assert slices.description.endswith(" x3 slices") and slices.tpu == "v4-8"
    assert slices.hosts_per_replica == 1 and not slices.multi_host_slices
    (pod,) = _choices(ResourceConfig.with_tpu("v4-32"))  # one slice of 4 hosts
    assert pod.processes == 4 and pod.replicas == 1 and pod.hosts_per_replica == 4
    assert pod.multi_host_slices
    assert pod.description == ResourceConfig.with_tpu("v4-32").devices()[0].describe()  # no " x1 slices"
    assert pod.bundles == ({"CPU": 1, "TPU": 4},) * 4
    assert pod.options["resources"] == {"TPU": 4, "TPU-v4-32-head": 1}


def test_tpu_variant_from_the_options():
    assert rc._tpu_variant({"resources": {"TPU": 4, "TPU-v5p-64-head": 1}}) == "v5p-64"
    assert rc._tpu_variant({"resources": {"TPU": 4}}) is None
    assert rc._tpu_variant({"resources": {"TPU-v4-8": 1, "x-head": 1}}) is None
    assert rc._tpu_variant({"resources": None}) is None
    assert rc._tpu_variant({}) is None


def test_bundles_drop_zero_amounts():
    assert rc._bundle({}) == {"CPU": 1}
    assert rc._bundle({"num_cpus": 3, "num_gpus": None}) == {"CPU": 3}
    assert rc._bundle({"num_cpus": 0, "num_gpus": 2, "memory": 0, "resources": {"a": 0, "b": 0.5}}) == {
        "GPU": 2,
        "b": 0.5,
    }
    assert rc._bundle({"num_cpus": 1, "memory": 5, "resources": None}) == {"CPU": 1, "memory": 5}


def test_fits_and_live_nodes():
    assert rc._fits({"CPU": 2, "GPU": 1}, {"CPU": 2, "GPU": 1})
    assert not rc._fits({"CPU": 2.5}, {"CPU": 2})
    assert not rc._fits({"TPU": 1}, {"CPU": 8})
    assert rc._fits({"CPU": 1, "GPU": 0}, {"CPU": 1})
    assert rc._capacity({"Resources": {"CPU": 1}}) == {"CPU": 1}
    assert rc._capacity({}) == {}
    ray = types.SimpleNamespace(nodes=lambda: [{"Alive": True, "n": 1}, {"Alive": False, "n": 2}, {"n": 3}])
    assert rc._live_nodes(ray) == [{"Alive": True, "n": 1}]


def test_single_process_choices_are_placeable_on_one_node_that_holds_them():
    (choice,) = _choices(ResourceConfig.with_cpu(cpu=2))
    assert choice.placeable([node(CPU=1), node(CPU=2)])
    assert not choice.placeable([node(CPU=1), node(CPU=1.5)])
    assert not choice.placeable([])


def test_a_gang_needs_as_many_nodes_that_hold_a_host():
    (pair,) = _choices(ResourceConfig(cpu=2, replicas=3))
    assert pair.placeable([node(CPU=2), node(CPU=4), node(CPU=2)])
    assert not pair.placeable([node(CPU=2), node(CPU=4), node(CPU=1)])


def test_whole_slices_have_their_head_and_enough_hosts_of_the_type():
    (pod,) = _choices(ResourceConfig.with_tpu("v4-32"))
    nodes = (
        tpu_slice("a", 4)
        + tpu_slice("b", 3)  # too few hosts
        + tpu_slice("c", 4, head=False)  # no head
        + tpu_slice("d", 4, variant="v4-64")  # another type
        + [node({rc.TPU_POD_TYPE_LABEL: "v4-32"}, CPU=8, TPU=4)]  # no slice name
        + [node(None, CPU=8)]
        + tpu_slice("e", 5)
    )
    assert pod._whole_slices(nodes) == ["a", "e"]
    small = [dict(n, Resources={**n["Resources"], "TPU": 2}) for n in tpu_slice("f", 4)]
    assert pod._whole_slices(small) == []  # hosts without the chips of one host
    assert pod.placeable(tpu_slice("a", 4))
    (two,) = _choices(ResourceConfig.with_tpu("v4-32", slice_count=2))
    assert not two.placeable(tpu_slice("a", 4))
    assert two.placeable(tpu_slice("a", 4) + tpu_slice("b", 4))


def test_a_slice_head_counted_from_any_member_of_the_slice():
    (pod,) = _choices(ResourceConfig.with_tpu("v4-32"))
    members = tpu_slice("a", 4, head=False)
    members[2]["Resources"]["TPU-v4-32-head"] = 1
    assert pod._whole_slices(members) == ["a"]
    members[2]["Resources"]["TPU-v4-32-head"] = 0.5
    assert pod._whole_slices(members) == []


def test_environment_of_each_process():
    (gpus,) = _choices(ResourceConfig(cpu=1, replicas=2))
    assert gpus.environment(1, "10.0.0.1:99", "10.0.0.1") == {
        "MARIN_COORDINATOR_ADDRESS": "10.0.0.1:99",
        "MARIN_NUM_PROCESSES": "2",
        "MARIN_PROCESS_ID": "1",
    }
    (pod,) = _choices(ResourceConfig.with_tpu("v4-32"))
    assert pod.environment(3, "x:1", "10.0.0.9") == {}  # one slice: JAX reads its metadata
    (pods,) = _choices(ResourceConfig.with_tpu("v4-32", slice_count=3))
    assert pods.environment(4, "x:1", "10.0.0.9") == {
        "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.9:8081",
        "MEGASCALE_PORT": "8081",
        "MEGASCALE_NUM_SLICES": "3",
        "MEGASCALE_SLICE_ID": "1",
    }
    assert pods.environment(3, "x:1", "ip")["MEGASCALE_SLICE_ID"] == "0"
    assert pods.environment(11, "x:1", "ip")["MEGASCALE_SLICE_ID"] == "2"


def test_a_gang_record_round_trips_through_the_dispatch():
    (pods,) = _choices(ResourceConfig.with_tpu("v4-32", slice_count=2))
    record = RayBackend()._dispatch_record(pods)
    assert record == {
        "backend": "ray",
        "where": "ray",
        "hosted": True,
        "device": pods.description,
        "ray_options": pods.options,
        "gang": {
            "processes": 8,
            "replicas": 2,
            "hosts_per_replica": 4,
            "bundles": [{"CPU": 1, "TPU": 4}] * 8,
            "strategy": "STRICT_SPREAD",
        },
    }
    assert _Choice.from_dispatch(record) == pods
    (alone,) = _choices(ResourceConfig.with_cpu(cpu=1))
    assert "gang" not in RayBackend()._dispatch_record(alone)


# -- messages ------------------------------------------------------------------------------------


def test_describe_a_bundle():
    assert rc._describe_bundle({"CPU": 2}) == "2 CPU"
    assert rc._describe_bundle({}) == "0 CPU"
    assert rc._describe_bundle({"CPU": 1, "GPU": 0.5, "memory": 3 * 2**29, "TPU": 4, "x": 1}) == (
        "1 CPU, 0.5 GPU, 1.5 GiB memory, 4 TPU, 1 x"
    )


def test_describe_choices():
    (one,) = _choices(ResourceConfig.with_cpu(cpu=2))
    assert rc._describe_choice(one) == "CPU (2 CPU)"
    (pods,) = _choices(ResourceConfig.with_tpu("v4-32", slice_count=2))
    assert rc._describe_choice(pods) == (
        f"{pods.description}: 2 whole slice(s) of 4 hosts (1 CPU, 4 TPU each, TPU-v4-32-head on worker 0; "
        "nodes labelled ray.io/tpu-slice-name and ray.io/tpu-pod-type=v4-32)"
    )
    (gang,) = _choices(ResourceConfig(cpu=3, replicas=2))
    assert rc._describe_choice(gang) == "CPU x2 replicas: 2 processes on 2 different nodes, each with 3 CPU"


def test_describe_capacity_leaves_out_node_ids_and_memory():
    assert (
        rc._describe_capacity(
            {"node:10.0.0.1": 1, "memory": 5, "object_store_memory": 6, "GPU": 2, "CPU": 8.5}
        )
        == "{8.5 CPU, 2 GPU}"
    )
    assert rc._describe_capacity({}) == "{}"


def test_the_unsatisfiable_message_of_single_processes():
    choices = _choices(
        ResourceConfig(cpu=4, device=GpuConfig(count=2), device_alternatives=(GpuConfig(count=1),))
    )
    message = rc._unsatisfiable_message("train", choices, [node(CPU=8), node(CPU=2, GPU=1)])
    assert message == (
        f"step 'train' asks for {rc._describe_choice(choices[0])}; or {rc._describe_choice(choices[1])}, and no "
        "node of the Ray cluster has that (nodes: {8 CPU}, {2 CPU, 1 GPU}). Add such a node, change the step's "
        "resources, or set $MARIN_RAY_WAIT_FOR_NODES=1 if an autoscaler will add one"
    )
    assert "(nodes: no live nodes)" in rc._unsatisfiable_message("t", choices, [])


# -- preparing ----------------------------------------------------------------------------------


class FakeRay(types.SimpleNamespace):
    pass


def _backend_on(nodes, monkeypatch):
    backend = RayBackend()
    fake = FakeRay(nodes=lambda: nodes)
    monkeypatch.setattr(backend, "_ray", lambda: fake)
    return backend


def test_prepare_picks_the_first_placeable_choice(monkeypatch):
    resources = ResourceConfig(cpu=2, device=GpuConfig(count=2), device_alternatives=(GpuConfig(count=1),))
    backend = _backend_on([node(CPU=4, GPU=1)], monkeypatch)
    record = backend.prepare(_resolved(resources))
    assert record["device"] == _choices(resources)[1].description
    assert record["ray_options"]["num_gpus"] == 1
    backend = _backend_on([node(CPU=4, GPU=2)], monkeypatch)
    assert backend.prepare(_resolved(resources))["ray_options"]["num_gpus"] == 2


def test_prepare_refuses_what_no_node_holds_unless_told_to_wait(monkeypatch):
    resources = ResourceConfig(cpu=2, device=GpuConfig(count=2))
    backend = _backend_on([node(CPU=4), node(CPU=1, GPU=2, alive=False)], monkeypatch)
    monkeypatch.delenv(rc.WAIT_FOR_NODES_ENV, raising=False)
    with pytest.raises(UnsatisfiableError) as caught:
        backend.prepare(_resolved(resources))
    assert str(caught.value) == rc._unsatisfiable_message("train", _choices(resources), [node(CPU=4)])
    for value in ("1", " true ", "yes"):
        monkeypatch.setenv(rc.WAIT_FOR_NODES_ENV, value)
        assert backend.prepare(_resolved(resources)) == backend._dispatch_record(_choices(resources)[0])
    monkeypatch.setenv(rc.WAIT_FOR_NODES_ENV, "0")
    with pytest.raises(UnsatisfiableError):
        backend.prepare(_resolved(resources))


def test_light_steps_stay_in_the_driver_without_ray(monkeypatch):
    backend = RayBackend()
    monkeypatch.setattr(backend, "_ray", lambda: pytest.fail("connected for a light step"))
    assert backend.prepare(_resolved(None)) == {"backend": "ray", "where": "driver"}


def test_connecting_uses_the_address_then_ray_address(monkeypatch):
    calls = []
    fake = types.ModuleType("ray")
    state = {"up": False}
    fake.is_initialized = lambda: state["up"]
    fake.init = lambda **kwargs: calls.append(kwargs) or state.update(up=True)
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setenv("RAY_ADDRESS", "ray://env:1")
    backend = RayBackend()
    assert backend._ray() is fake
    assert backend._ray() is fake
    assert calls == [{"address": "ray://env:1", "ignore_reinit_error": True, "log_to_driver": True}]
    state["up"] = False
    RayBackend(address="ray://arg:2").start()
    assert calls[-1]["address"] == "ray://arg:2"
    monkeypatch.delenv("RAY_ADDRESS")
    state["up"] = False
    RayBackend()._ray()
    assert calls[-1]["address"] is None
    state["up"] = True
    RayBackend()._ray()
    assert len(calls) == 3  # already connected: no init


# -- small helpers ------------------------------------------------------------------------------


def test_group_name_and_sys_path(monkeypatch):
    step = _resolved(ResourceConfig.with_cpu(cpu=1), name="a" * 70)
    name = rc._group_name(step)
    import hashlib

    assert name == f"marin-gang:{'a' * 60}:{hashlib.sha256(step.output_path.encode()).hexdigest()[:16]}"
    monkeypatch.setattr(sys, "path", ["", "/a", ""])
    assert rc._sys_path() == ["/a"]


def test_an_unpicklable_step_is_refused_for_ray():
    import dataclasses
    import threading

    import cloudpickle

    step = _resolved(ResourceConfig.with_cpu(cpu=1))
    assert cloudpickle.loads(rc._pickled(step)) == (record_interval, step.config)
    with pytest.raises(StepFunctionError) as caught:
        rc._pickled(dataclasses.replace(step, config=threading.Lock()))
    message = str(caught.value)
    assert message.startswith(
        "step 'train': its function and config cannot be sent to a Ray worker (TypeError: "
    )
    assert message.endswith("; make them picklable")


@pytest.mark.parametrize(
    ("text", "value"), [("", None), ("  ", None), ("2.5", 2.5), (" 60 ", 60.0), ("0.5", 0.5)]
)
def test_placement_timeout(monkeypatch, text, value):
    monkeypatch.setenv(rc.PLACEMENT_TIMEOUT_ENV, text)
    assert rc._placement_timeout() == value


@pytest.mark.parametrize("text", ["0", "-3", "soon", "nan"])
def test_a_bad_placement_timeout_is_refused(monkeypatch, text):
    monkeypatch.setenv(rc.PLACEMENT_TIMEOUT_ENV, text)
    with pytest.raises(StepRefused) as caught:
        rc._placement_timeout()
    assert str(caught.value) == f"$MARIN_RAY_PLACEMENT_TIMEOUT={text!r}: must be a positive number of seconds"


def test_no_placement_timeout_by_default(monkeypatch):
    monkeypatch.delenv(rc.PLACEMENT_TIMEOUT_ENV, raising=False)
    assert rc._placement_timeout() is None


# -- the gang's process 0 --------------------------------------------------------------------------


class _Ref:
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error


def _fake_ray_module(monkeypatch, ready_refs, killed):
    import ray  # the real exceptions

    fake = types.ModuleType("ray")
    fake.exceptions = ray.exceptions
    waits = []

    def wait(refs, num_returns=1, timeout=None):
        waits.append((list(refs), num_returns, timeout))
        ready = [r for r in refs if r in ready_refs]
        return ready, [r for r in refs if r not in ready]

    def get(ref):
        if ref.error is not None:
            raise ref.error
        return ref.value

    fake.wait, fake.get = wait, get
    fake.kill = lambda actor, no_restart=False: killed.append((actor, no_restart))
    fake.waits = waits
    monkeypatch.setitem(sys.modules, "ray", fake)
    return fake


def test_peers_all_succeeded_is_not_lost(monkeypatch):
    results = [_Ref({"outcome": "succeeded", "error": None}), _Ref({"outcome": "succeeded", "error": None})]
    killed = []
    fake = _fake_ray_module(monkeypatch, results, killed)
    assert rc._Peers(["a1", "a2"], results).lost(False) is None
    assert fake.waits == [(results, 2, rc.GANG_FINISH_S)]
    assert killed == []


def test_a_peer_that_died_loses_the_gang_and_the_rest_are_killed(monkeypatch, capsys):
    import ray

    dead = _Ref(error=ray.exceptions.ActorDiedError())
    slow = _Ref({"outcome": "succeeded", "error": None})
    fine = _Ref({"outcome": "succeeded", "error": None})
    killed = []
    fake = _fake_ray_module(monkeypatch, [dead, fine], killed)
    why = rc._Peers(["a1", "a2", "a3"], [fine, dead, slow]).lost(True)
    assert why == "process 2 of 4 was lost (ActorDiedError)"
    assert fake.waits == [([fine, dead, slow], 3, rc.GANG_GRACE_S)]
    assert killed == [("a3", True)]
    assert (
        f"[executor] the gang is lost: {why}; recording nothing (the driver submits it again)"
        in capsys.readouterr().out
    )


def test_a_peer_that_failed_after_process_0_succeeded_loses_the_gang(monkeypatch):
    import ray

    failed = _Ref({"outcome": "failed", "error": "ValueError: x"})
    dead = _Ref(error=ray.exceptions.RayActorError())
    killed = []
    _fake_ray_module(monkeypatch, [failed, dead], killed)
    assert rc._Peers(["a1", "a2"], [failed, dead]).lost(False) == (
        "process 1 of 3 failed after process 0 finished: ValueError: x"
    )
    # process 0 failed too: a peer's failure is no loss, a dead peer still is
    assert rc._Peers(["a1"], [failed]).lost(True) is None
    assert rc._Peers(["a1", "a2"], [failed, dead]).lost(True) == "process 2 of 3 was lost (RayActorError)"
    assert killed == []


# -- the driver's side of a gang ------------------------------------------------------------------


def _gang_backend(monkeypatch, ready_sets, values):
    """A backend whose fake ray.wait returns, per call, the next set of ready refs."""
    import ray

    killed = []
    waits = []
    fake = types.SimpleNamespace(exceptions=ray.exceptions)

    def wait(refs, num_returns=None, timeout=None):
        assert num_returns == 1 or timeout is not None
        waits.append((list(refs), timeout))
        ready = ready_sets.pop(0)
        return [r for r in ready if r in refs], []

    def get(ref):
        value = values[ref]
        if isinstance(value, BaseException):
            raise value
        return value

    fake.wait, fake.get = wait, get
    fake.kill = lambda actor, no_restart=False: killed.append(actor)
    backend = RayBackend()
    return backend, fake, waits, killed


def test_wait_gang_returns_process_0s_result(monkeypatch):
    (pair,) = _choices(ResourceConfig(cpu=1, replicas=3))
    values = {
        "r0": {"outcome": "succeeded", "error": None},
        "r1": {"outcome": "succeeded"},
        "r2": {"outcome": "succeeded"},
    }
    backend, fake, waits, _ = _gang_backend(monkeypatch, [["r1"], ["r2"], ["r0"]], values)
    records = [{"node": "n0"}, {"node": "n1"}, {"node": "n2"}]
    assert backend._wait_gang(fake, "out", pair, ["r0", "r1", "r2"], records) == values["r0"]
    assert [w[0] for w in waits] == [["r0", "r1", "r2"], ["r0", "r2"], ["r0"]]


def test_wait_gang_a_lost_process_is_a_step_function_error_naming_its_node(monkeypatch):
    import ray

    (pair,) = _choices(ResourceConfig(cpu=1, replicas=3))
    values = {
        "r0": {"outcome": "succeeded"},
        "r1": {"outcome": "succeeded"},
        "r2": ray.exceptions.ActorDiedError(),
    }
    backend, fake, _, _ = _gang_backend(monkeypatch, [["r1"], ["r2"]], values)
    records = [{"node": "n0"}, {"node": "n1"}, {"node": "n2"}]
    with pytest.raises(StepFunctionError) as caught:
        backend._wait_gang(fake, "out", pair, ["r0", "r1", "r2"], records)
    assert type(caught.value) is StepFunctionError
    assert str(caught.value) == "process 2 of 3 (Ray node n2) was lost: ActorDiedError"
    backend._cancelled.add("out")
    backend2, fake2, _, _ = _gang_backend(monkeypatch, [["r2"]], values)
    backend2._cancelled.add("out")
    with pytest.raises(StepCancelled, match=r"stopped: its Ray actors were killed \(Backend.cancel\)"):
        backend2._wait_gang(fake2, "out", pair, ["r0", "r1", "r2"], records)


def test_wait_gang_process_0_lost_its_gang(monkeypatch):
    (pair,) = _choices(ResourceConfig(cpu=1, replicas=2))
    values = {"r0": {"outcome": "gang_lost", "error": "process 1 of 2 was lost (X)"}}
    backend, fake, _, _ = _gang_backend(monkeypatch, [["r0"]], values)
    with pytest.raises(StepFunctionError, match=r"^process 1 of 2 was lost \(X\)$"):
        backend._wait_gang(fake, "out", pair, ["r0", "r1"], [{"node": "a"}, {"node": "b"}])


def test_wait_gang_a_failed_peer_waits_for_process_0_then_gives_up(monkeypatch):
    (pair,) = _choices(ResourceConfig(cpu=1, replicas=2))
    values = {"r0": {"outcome": "failed", "error": "E: 0"}, "r1": {"outcome": "failed", "error": "E: 1"}}
    backend, fake, waits, _ = _gang_backend(monkeypatch, [["r1"], ["r0"], ["r0"]], values)
    records = [{"node": "a"}, {"node": "b"}]
    assert backend._wait_gang(fake, "out", pair, ["r0", "r1"], records) == values["r0"]
    assert waits[1] == (["r0"], rc.GANG_GRACE_S)
    backend, fake, waits, _ = _gang_backend(monkeypatch, [["r1"], []], values)
    with pytest.raises(StepFunctionError) as caught:
        backend._wait_gang(fake, "out", pair, ["r0", "r1"], records)
    assert str(caught.value) == "process 1 of 2 failed (E: 1) and process 0 did not finish within 60 s"


def test_cancel_and_close_stop_actors_and_gangs(monkeypatch):
    killed = []
    fake = types.ModuleType("ray")
    fake.kill = lambda actor, no_restart=False: killed.append((actor, no_restart))
    monkeypatch.setitem(sys.modules, "ray", fake)
    stopped = []
    monkeypatch.setattr(rc, "_stop_gang", lambda ray, gang: stopped.append((ray, gang)))
    backend = RayBackend()
    backend.cancel("nothing/here")
    assert backend._is_cancelled("nothing/here") and not backend._is_cancelled("other")
    assert killed == [] and stopped == []
    backend._actors["a"] = "actor-a"
    gang = rc._Gang(groups=["g"], actors=["x"])
    backend._gangs["b"] = gang
    backend.close()
    assert killed == [("actor-a", True)]
    assert stopped == [(fake, gang)]
    assert backend._cancelled == {"nothing/here", "a", "b"}
    assert isinstance(backend._lost("a", "m"), StepCancelled)
    lost = backend._lost("c", "the message")
    assert type(lost) is StepFunctionError and str(lost) == "the message"


def _placement_group_module():
    import importlib

    return importlib.import_module("ray.util.placement_group")  # ray.util's attribute is the function


def test_stop_gang_kills_actors_and_removes_groups(monkeypatch):
    pg = _placement_group_module()
    removed = []

    def remove(group):
        removed.append(group)
        if group == "bad":
            raise RuntimeError("already gone")

    monkeypatch.setattr(pg, "remove_placement_group", remove)
    killed = []

    def kill(actor, no_restart=False):
        killed.append((actor, no_restart))
        if actor == "dead":
            raise RuntimeError("gone")

    rc._stop_gang(types.SimpleNamespace(kill=kill), rc._Gang(groups=["bad", "g2"], actors=["dead", "a2"]))
    assert killed == [("dead", True), ("a2", True)]
    assert removed == ["bad", "g2"]


def test_a_step_host_coordinator_address_is_this_node_and_a_free_port(monkeypatch):
    import ray.util

    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.1.2.3")
    address = rc.StepHost().coordinator_address()
    host, port = address.rsplit(":", 1)
    assert host == "10.1.2.3" and 0 < int(port) < 65536


def test_gang_member_runs_the_function_with_its_environment_and_log(tmp_path, monkeypatch):
    import cloudpickle
    import ray

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(
        ray, "get_runtime_context", lambda: types.SimpleNamespace(get_node_id=lambda: "node-7")
    )
    monkeypatch.setenv("WANDB_SERVICE", "driver-service")
    monkeypatch.delenv("MARIN_PROCESS_ID", raising=False)
    spec = types.SimpleNamespace(name="train", prefix=str(tmp_path), output_path=f"{tmp_path}/train-1")

    def fn(config):
        print(
            f"member output {config} {os.environ.get('MARIN_PROCESS_ID')} {os.environ.get('WANDB_SERVICE')}"
        )

    blob = cloudpickle.dumps((fn, {"c": 1}))
    result = rc.GangMember().run(blob, [str(tmp_path)], spec, 1, 2, {"MARIN_PROCESS_ID": "1"})
    monkeypatch.delenv("MARIN_PROCESS_ID", raising=False)
    assert result == {"outcome": "succeeded", "error": None}
    assert sys.path[0] == str(tmp_path)
    log = (tmp_path / "train-1" / "logs" / "process-1.log").read_text()
    assert "[executor] train: process 1 of 2 on Ray node node-7, process" in log
    assert "member output {'c': 1} 1 None" in log

    def boom(config):
        raise SystemExit(5)

    failed = rc.GangMember().run(cloudpickle.dumps((boom, None)), [], spec, 1, 2, {})
    assert failed == {"outcome": "failed", "error": "SystemExit: 5"}


# -- a single hosted step in an actor ------------------------------------------------------------


class _Timers:
    """Stands in for threading.Timer in StepHost.run (the real one would end this process)."""

    def __init__(self):
        self.made = []

    def __call__(self, interval, function, args=()):
        timers = self

        class Timer:
            daemon = False

            def start(self):
                timers.made.append((interval, function, args, self.daemon))

        return Timer()


def test_step_host_runs_the_step_with_its_log_and_exits_later(tmp_path, monkeypatch):
    import cloudpickle
    import ray

    from executor.backends import host

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(
        ray, "get_runtime_context", lambda: types.SimpleNamespace(get_node_id=lambda: "node-3")
    )
    monkeypatch.setenv("WANDB_SERVICE", "driver-service")
    timers = _Timers()
    monkeypatch.setattr(rc.threading, "Timer", timers)
    calls = []

    def fake_run_hosted(spec, fn, config, **kwargs):
        calls.append((spec, config, sorted(kwargs), os.environ.get("WANDB_SERVICE")))
        fn(config)
        return {"outcome": "succeeded", "error": None}

    monkeypatch.setattr(host, "run_hosted", fake_run_hosted)
    spec = types.SimpleNamespace(name="train", prefix=str(tmp_path), output_path=f"{tmp_path}/train-1")
    blob = cloudpickle.dumps((print, "the step ran"))
    assert rc.StepHost().run(blob, [str(tmp_path)], spec) == {"outcome": "succeeded", "error": None}
    assert calls == [(spec, "the step ran", [], None)]
    assert sys.path[0] == str(tmp_path)
    log = (tmp_path / "train-1" / ".executor_log").read_text()
    assert f"[executor] train: on Ray node node-3, process {os.getpid()}" in log
    assert "the step ran" in log
    ((interval, function, args, daemon),) = timers.made
    assert (interval, function, daemon) == (rc.ACTOR_LINGER_S, rc._exit, True)
    assert args[0] == []  # no gang: no placement group to remove


class _Actor:
    def __init__(self, result):
        self.run = types.SimpleNamespace(remote=lambda *args: ("run", args, result))


def _actor_ray(result, killed, made):
    import ray

    def get(ref):
        value = ref[2]
        if isinstance(value, BaseException):
            raise value
        return value

    def remote(cls):
        def options(**kwargs):
            made.append((cls, kwargs))
            return types.SimpleNamespace(remote=lambda: _Actor(result))

        return types.SimpleNamespace(options=options)

    return types.SimpleNamespace(
        exceptions=ray.exceptions,
        get=get,
        remote=remote,
        kill=lambda actor, no_restart=False: killed.append(no_restart),
    )


def test_a_single_hosted_step_runs_in_a_detached_actor(monkeypatch):
    killed, made = [], []
    backend = RayBackend()
    monkeypatch.setattr(
        backend, "_ray", lambda: _actor_ray({"outcome": "succeeded", "error": None}, killed, made)
    )
    step = _resolved(ResourceConfig.with_cpu(cpu=2))
    dispatch = {"ray_options": {"num_gpus": 1}}
    assert backend.call_hosted(step, dispatch, "spec") == {"outcome": "succeeded", "error": None}
    ((cls, options),) = made
    assert cls is rc.StepHost
    assert (
        options["name"].startswith("marin-step:train:")
        and len(options["name"]) == len("marin-step:train:") + 8
    )
    assert options | {"name": None} == {
        "name": None,
        "namespace": "marin-executor",
        "lifetime": "detached",
        "max_restarts": 0,
        "num_gpus": 1,
        "num_cpus": 1,
    }
    assert dispatch == {"ray_options": {"num_gpus": 1}}  # not changed in place
    assert killed == [True]  # once its result is read
    assert backend._actors == {} and backend._cancelled == set()


def test_a_lost_actor_is_a_step_function_error_and_a_cancelled_one_says_so(monkeypatch):
    import ray

    killed, made = [], []
    backend = RayBackend()
    monkeypatch.setattr(backend, "_ray", lambda: _actor_ray(ray.exceptions.ActorDiedError(), killed, made))
    step = _resolved(ResourceConfig.with_cpu(cpu=2))
    with pytest.raises(StepFunctionError) as caught:
        backend.call_hosted(step, {"ray_options": {"num_cpus": 3}}, "spec")
    assert type(caught.value) is StepFunctionError
    assert str(caught.value) == "the Ray worker running it was lost: ActorDiedError"
    assert made[0][1]["num_cpus"] == 3
    backend._cancelled.add(step.output_path)  # cancelled before it started: killed at once
    with pytest.raises(StepCancelled, match=r"stopped: its Ray actor was killed \(Backend.cancel\)"):
        backend.call_hosted(step, {"ray_options": {}}, "spec")
    assert killed == [True, True, True]
    assert backend._cancelled == set()


def test_wait_gang_a_lost_gang_of_a_cancelled_step_is_cancelled(monkeypatch):
    (pair,) = _choices(ResourceConfig(cpu=1, replicas=2))
    values = {"r0": {"outcome": "gang_lost", "error": "process 1 of 2 was lost (X)"}}
    backend, fake, _, _ = _gang_backend(monkeypatch, [["r0"]], values)
    backend._cancelled.add("out")
    with pytest.raises(StepCancelled):
        backend._wait_gang(fake, "out", pair, ["r0", "r1"], [{"node": "a"}, {"node": "b"}])


def test_a_gang_dispatch_goes_to_the_gang_path(monkeypatch):
    import cloudpickle

    backend = RayBackend()
    monkeypatch.setattr(backend, "_ray", lambda: types.SimpleNamespace())
    calls = []
    monkeypatch.setattr(backend, "_call_gang", lambda *args: calls.append(args) or {"outcome": "succeeded"})
    step = _resolved(ResourceConfig(cpu=1, replicas=2))
    dispatch = {"gang": {"processes": 2}, "ray_options": {}}
    assert backend.call_hosted(step, dispatch, "spec") == {"outcome": "succeeded"}
    ((got_step, got_dispatch, got_spec, blob),) = calls
    assert (got_step, got_dispatch, got_spec) == (step, dispatch, "spec")
    assert cloudpickle.loads(blob) == (record_interval, step.config)


def test_the_actor_gets_the_step_the_import_path_and_the_spec(monkeypatch):
    import cloudpickle

    killed, made = [], []
    fake = _actor_ray({"outcome": "succeeded", "error": None}, killed, made)
    sent = []

    class Recording(_Actor):
        def __init__(self, result):
            self.run = types.SimpleNamespace(remote=lambda *args: sent.append(args) or ("run", args, result))

    fake.remote = lambda cls: types.SimpleNamespace(
        options=lambda **kw: types.SimpleNamespace(
            remote=lambda: Recording({"outcome": "succeeded", "error": None})
        )
    )
    backend = RayBackend()
    monkeypatch.setattr(backend, "_ray", lambda: fake)
    monkeypatch.setattr(sys, "path", ["", "/p"])
    step = _resolved(ResourceConfig.with_cpu(cpu=1))
    backend.call_hosted(step, {"ray_options": {}}, "the-spec")
    ((blob, sys_path, spec),) = sent
    assert cloudpickle.loads(blob) == (record_interval, step.config)
    assert (sys_path, spec) == (["/p"], "the-spec")


def test_cancelling_a_running_actor_kills_it_and_says_cancelled(monkeypatch):
    import ray

    killed = []
    backend = RayBackend()
    actors = []
    step = _resolved(ResourceConfig.with_cpu(cpu=1))

    def get(ref):
        backend.cancel(step.output_path)  # while the actor runs
        raise ray.exceptions.ActorDiedError()

    def remote(cls):
        def make():
            actors.append(_Actor(None))
            return actors[-1]

        return types.SimpleNamespace(options=lambda **kw: types.SimpleNamespace(remote=make))

    def kill(actor, no_restart=False):
        killed.append(actor)
        if len(killed) > 1:
            raise RuntimeError("already dead")  # the final kill's failure is ignored

    fake = types.SimpleNamespace(exceptions=ray.exceptions, get=get, remote=remote, kill=kill)
    monkeypatch.setattr(backend, "_ray", lambda: fake)
    monkeypatch.setitem(sys.modules, "ray", fake)
    with pytest.raises(StepCancelled):
        backend.call_hosted(step, {"ray_options": {}}, "spec")
    assert killed[0] is actors[0]  # cancel killed the running actor itself
    assert len(killed) == 2  # and the final kill, once its result was read


def test_a_failing_final_kill_does_not_hide_the_result(monkeypatch):
    killed, made = [], []
    fake = _actor_ray({"outcome": "failed", "error": "E"}, killed, made)

    def kill(actor, no_restart=False):
        raise RuntimeError("already gone")

    fake.kill = kill
    backend = RayBackend()
    monkeypatch.setattr(backend, "_ray", lambda: fake)
    assert backend.call_hosted(_resolved(ResourceConfig.with_cpu(cpu=1)), {"ray_options": {}}, "s") == {
        "outcome": "failed",
        "error": "E",
    }


def test_a_later_dead_peer_is_found_after_one_still_running(monkeypatch):
    import ray

    running = _Ref({"outcome": "succeeded", "error": None})
    dead = _Ref(error=ray.exceptions.ActorDiedError())
    killed = []
    _fake_ray_module(monkeypatch, [dead], killed)
    assert rc._Peers(["a1", "a2"], [running, dead]).lost(False) == "process 2 of 3 was lost (ActorDiedError)"
    assert killed == [("a1", True)]


def test_actors_do_not_need_the_wandb_service_variable(tmp_path, monkeypatch):
    import cloudpickle
    import ray

    from executor.backends import host

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(ray, "get_runtime_context", lambda: types.SimpleNamespace(get_node_id=lambda: "n"))
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    monkeypatch.setattr(rc.threading, "Timer", _Timers())
    monkeypatch.setattr(
        host, "run_hosted", lambda spec, fn, config, **kw: {"outcome": "succeeded", "error": None}
    )
    spec = types.SimpleNamespace(name="t", prefix=str(tmp_path), output_path=f"{tmp_path}/t-1")
    blob = cloudpickle.dumps((print, None))
    assert rc.StepHost().run(blob, [], spec)["outcome"] == "succeeded"
    assert rc.GangMember().run(blob, [], spec, 1, 2, {})["outcome"] == "succeeded"


# -- the driver's side of a gang: starting its processes ----------------------------------------------


class _GangActor:
    def __init__(self, cls, name, options, coordinator):
        self.cls, self.name, self.options = cls, name, options
        self.calls = []
        self.run = types.SimpleNamespace(remote=self._run)
        self.coordinator_address = types.SimpleNamespace(remote=lambda: ("coordinator", coordinator))

    def _run(self, *args):
        self.calls.append(args)
        return ("run", self.name)


def _gang_ray(results, coordinator="10.0.0.1:4321"):
    import ray

    made = []

    def remote(cls):
        def options(**options):
            def start():
                made.append(_GangActor(cls, options["name"], options, coordinator))
                return made[-1]

            return types.SimpleNamespace(remote=start)

        return types.SimpleNamespace(options=options)

    def get(ref):
        value = ref[1] if ref[0] == "coordinator" else results[ref[1]]
        if isinstance(value, BaseException):
            raise value
        return value

    def wait(refs, num_returns=1, timeout=None):
        return [refs[0]], refs[1:]

    nodes = [{"NodeID": f"n{i}", "NodeManagerAddress": f"10.0.0.{i + 1}"} for i in range(3)]
    fake = types.SimpleNamespace(
        exceptions=ray.exceptions,
        remote=remote,
        get=get,
        wait=wait,
        nodes=lambda: nodes,
        util=types.SimpleNamespace(
            placement_group_table=lambda group: {"bundles_to_node_id": ["n0", "n1", "n2"]}
        ),
    )
    return fake, made


def _run_gang(backend, fake, step, choice, gang, blob=b"blob"):
    import inspect

    extra = [[]] if "slices" in inspect.signature(backend._run_gang).parameters else []
    return backend._run_gang(fake, step, choice, gang, "spec", blob, *extra)


def test_a_gang_starts_one_actor_per_bundle_with_its_place_and_environment(monkeypatch):
    monkeypatch.setattr(sys, "path", ["/p"])
    resources = ResourceConfig(cpu=2, ram="1g", device=GpuConfig(count=1), replicas=3)
    (choice,) = _choices(resources)
    step = _resolved(resources)
    backend = RayBackend()
    names = {}
    results = {}
    fake, made = _gang_ray(results)

    def result_of(name):
        return {"outcome": "succeeded", "error": None, "from": name}

    class Results(dict):
        def __getitem__(self, name):
            names[name] = True
            return result_of(name)

    fake_results = Results()
    fake, made = _gang_ray(fake_results)
    gang = rc._Gang(groups=["the-group"], actors=[])
    result = _run_gang(backend, fake, step, choice, gang)

    host, *members = made
    assert result == result_of(host.name)
    assert [a.cls for a in made] == [rc.StepHost, rc.GangMember, rc.GangMember]
    assert gang.actors == made
    tag = host.name.split(":")[2]
    assert [a.name for a in made] == [f"marin-step:train:{tag}:process-{i}" for i in range(3)]
    for index, actor in enumerate(made):
        options = actor.options
        assert options["num_cpus"] == 2 and options["num_gpus"] == 1 and options["memory"] == 2**30
        assert options["resources"] == {
            k: v for k, v in choice.bundles[index].items() if k not in ("CPU", "GPU", "memory")
        }
        strategy = options["scheduling_strategy"]
        assert strategy.placement_group == "the-group"
        assert strategy.placement_group_bundle_index == index
        assert options["lifetime"] == "detached" and options["max_restarts"] == 0
    coordinator = "10.0.0.1:4321"
    envs = [choice.environment(i, coordinator, "10.0.0.1") for i in range(3)]
    for index, member in enumerate(members, start=1):
        assert member.calls == [(b"blob", ["/p"], "spec", index, 3, envs[index])]
    ((blob, sys_path, spec, start),) = host.calls
    assert (blob, sys_path, spec) == (b"blob", ["/p"], "spec")
    assert start["env"] == envs[0]
    assert start["peers"] == members
    assert start["peer_results"] == [("run", m.name) for m in members]
    assert start["groups"] == ["the-group"]
    record = start["record"].get("gang", start["record"])
    assert record["coordinator"] == coordinator
    assert record["processes_on"] == [
        {"process": i, "node": f"n{i}", "ip": f"10.0.0.{i + 1}"} for i in range(3)
    ]


def test_a_gang_whose_process_0_cannot_start_is_lost(monkeypatch):
    import ray

    resources = ResourceConfig(cpu=1, replicas=2)
    (choice,) = _choices(resources)
    fake, made = _gang_ray({})

    def get(ref):
        raise ray.exceptions.ActorDiedError()

    fake.get = get
    with pytest.raises(StepFunctionError) as caught:
        _run_gang(RayBackend(), fake, _resolved(resources), choice, rc._Gang(groups=["g"], actors=[]))
    assert type(caught.value) is StepFunctionError
    assert str(caught.value) == "process 0 of 2 could not start: ActorDiedError"
    assert len(made) == 1  # no member started


def test_a_gang_cancelled_while_starting_runs_nothing(monkeypatch):
    resources = ResourceConfig(cpu=1, replicas=2)
    (choice,) = _choices(resources)
    step = _resolved(resources)
    fake, made = _gang_ray({})
    backend = RayBackend()
    backend._cancelled.add(step.output_path)
    with pytest.raises(StepCancelled, match=r"stopped: its Ray actors were killed \(Backend.cancel\)"):
        _run_gang(backend, fake, step, choice, rc._Gang(groups=["g"], actors=[]))
    host = made[0]
    assert host.calls == []  # process 0 never asked to run


def test_call_gang_places_runs_and_always_stops_the_gang(monkeypatch):
    resources = ResourceConfig(cpu=1, replicas=2)
    step = _resolved(resources)
    backend = RayBackend()
    fake = types.SimpleNamespace()
    monkeypatch.setattr(backend, "_ray", lambda: fake)
    calls = []
    monkeypatch.setattr(rc, "_remove_groups_named", lambda ray, name: calls.append(("remove", ray, name)))
    monkeypatch.setattr(rc, "_place", lambda *args: calls.append(("place", *args[:5])))
    monkeypatch.setattr(rc, "_stop_gang", lambda ray, gang: calls.append(("stop", ray, gang)))
    seen = {}

    def run_gang(ray, step_, choice, gang, spec, blob, *rest):
        seen["registered"] = backend._gangs.get(step.output_path) is gang
        calls.append(("run", ray, step_, choice, gang, spec, blob))
        return {"outcome": "succeeded"}

    monkeypatch.setattr(backend, "_run_gang", run_gang)
    (choice,) = _choices(resources)
    dispatch = backend._dispatch_record(choice)
    assert backend._call_gang(step, dispatch, "spec", b"blob") == {"outcome": "succeeded"}
    assert seen == {"registered": True}
    (remove, place, run, stop) = calls
    assert remove == ("remove", fake, rc._group_name(step))
    gang = run[4]
    assert isinstance(gang, rc._Gang) and gang.groups == [] and gang.actors == []
    assert place == ("place", fake, step, choice, gang, backend._is_cancelled)
    assert run == ("run", fake, step, choice, gang, "spec", b"blob")
    assert stop == ("stop", fake, gang)
    assert backend._gangs == {}

    def failing(*args):
        raise StepFunctionError("placement failed")

    calls.clear()
    monkeypatch.setattr(rc, "_place", failing)
    backend._cancelled.add(step.output_path)
    with pytest.raises(StepFunctionError):
        backend._call_gang(step, dispatch, "spec", b"blob")
    assert [c[0] for c in calls] == ["remove", "stop"]
    assert backend._gangs == {} and backend._cancelled == set()


def test_record_gang_leaves_a_missing_or_foreign_info_alone(tmp_path):
    store = open_store(str(tmp_path))
    output = f"{tmp_path}/train-1"
    spec = types.SimpleNamespace(prefix=str(tmp_path), output_path=output)
    rc._record_gang(spec, {"gang": {"coordinator": "c:1"}})  # no info: nothing written
    assert read_info(store, output) is None
    write_info(store, {"output_path": output, "dispatch": "driver"})
    rc._record_gang(spec, {"gang": {"coordinator": "c:1"}})  # not a dict: left alone
    assert read_info(store, output) == {"output_path": output, "dispatch": "driver"}


def test_remove_groups_named_removes_live_groups_of_that_name(monkeypatch):
    import importlib

    import ray

    pg = importlib.import_module("ray.util.placement_group")
    removed = []
    monkeypatch.setattr(pg, "remove_placement_group", lambda group: removed.append(group.id.hex()))
    table = {
        "aa" * 18: {"name": "marin-gang:x:1", "state": "CREATED"},
        "bb" * 18: {"name": "marin-gang:x:1:head-0", "state": "PENDING"},
        "cc" * 18: {"name": "marin-gang:x:1", "state": "REMOVED"},
        "dd" * 18: {"name": "other", "state": "CREATED"},
        "ee" * 18: {"state": "CREATED"},
    }
    fake = types.SimpleNamespace(
        util=types.SimpleNamespace(placement_group_table=lambda: table, list_named_actors=lambda **kw: []),
        PlacementGroupID=ray.PlacementGroupID,
    )
    rc._remove_groups_named(fake, "marin-gang:x:1")
    assert sorted(removed) == ["aa" * 18, "bb" * 18]


def test_step_host_as_process_0_of_a_gang(tmp_path, monkeypatch):
    import cloudpickle
    import ray

    from executor.backends import host

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(
        ray, "get_runtime_context", lambda: types.SimpleNamespace(get_node_id=lambda: "node-0")
    )
    timers = _Timers()
    monkeypatch.setattr(rc.threading, "Timer", timers)
    recorded = []
    monkeypatch.setattr(rc, "_record_gang", lambda spec, record: recorded.append((spec, record)))
    seen = {}

    def fake_run_hosted(spec_, fn, config, on_start=None, peers_lost=None):
        assert spec_ is spec
        seen["env"] = os.environ.get("MEGASCALE_SLICE_ID")
        on_start()
        seen["peers"] = (peers_lost.__self__.actors, peers_lost.__self__.results)
        return {"outcome": "failed", "error": "E"}

    monkeypatch.setattr(host, "run_hosted", fake_run_hosted)
    monkeypatch.delenv("MEGASCALE_SLICE_ID", raising=False)
    spec = types.SimpleNamespace(name="train", prefix=str(tmp_path), output_path=f"{tmp_path}/train-1")
    # the record as process 0 gets it, before and after the TPU-slice rework (coordinator at either level)
    record = {"coordinator": "10.0.0.1:555", "gang": {"coordinator": "10.0.0.1:555"}}
    gang = {
        "record": record,
        "env": {"MEGASCALE_SLICE_ID": "0"},
        "peers": ["m1", "m2"],
        "peer_results": ["r1", "r2"],
        "groups": ["g1", "g2"],
    }
    try:
        result = rc.StepHost().run(cloudpickle.dumps((print, None)), [], spec, gang)
    finally:
        os.environ.pop("MEGASCALE_SLICE_ID", None)
    assert result == {"outcome": "failed", "error": "E"}
    assert seen == {"env": "0", "peers": (["m1", "m2"], ["r1", "r2"])}
    assert recorded == [(spec, record)]
    log = (tmp_path / "train-1" / ".executor_log").read_text()
    assert (
        f"[executor] train: process 0 of 3 on Ray node node-0, process {os.getpid()}, coordinator 10.0.0.1:555\n"
        in log
    )
    ((interval, function, args, daemon),) = timers.made
    assert (interval, function, daemon) == (rc.ACTOR_LINGER_S, rc._exit, True)
    assert args[0] == ["g1", "g2"]
