"""Placement grammar and planning: pure functions over a synthetic two-node device list."""

import pytest

from rlinf_like.runtime.errors import PlacementError
from rlinf_like.runtime.placement import Device, PlacementMode, parse_device_range, plan_placement


def devices(gpus_per_node=(2, 2), cpus_per_node=(4, 4)):
    out = {"gpu": [], "cpu": []}
    for node, (g, c) in enumerate(zip(gpus_per_node, cpus_per_node)):
        for kind, n in (("gpu", g), ("cpu", c)):
            for _ in range(n):
                out[kind].append(Device(kind, len(out[kind]), node, f"node{node}", f"10.0.0.{node}"))
    return out


@pytest.mark.parametrize(
    "text,expected",
    [("0", [0]), ("0-3", [0, 1, 2, 3]), ("3, 0-1", [0, 1, 3]), ("all", [0, 1, 2, 3, 4]), (" 2 - 4 ", [2, 3, 4])],
)
def test_parse_device_range(text, expected):
    assert parse_device_range(text, 5, "actor") == expected


@pytest.mark.parametrize(
    "text,fragment",
    [("0-3,2", "lists devices [2] twice"), ("3-1", "descending"), ("a-b", "cannot parse"), ("", "cannot parse")],
)
def test_parse_device_range_errors_name_component_and_range(text, fragment):
    with pytest.raises(PlacementError) as err:
        parse_device_range(text, 8, "rollout")
    assert "'rollout'" in str(err.value) and fragment in str(err.value)


def test_collocated_components_split_each_device():
    p = plan_placement({"actor,rollout": "0-3"}, devices())
    assert p.mode is PlacementMode.COLLOCATED
    for name in ("actor", "rollout"):
        comp = p[name]
        assert comp.world_size == 4
        assert [r.device.index for r in comp.ranks] == [0, 1, 2, 3]
        assert [r.device.node_rank for r in comp.ranks] == [0, 0, 1, 1]
        assert all(r.share == 0.5 for r in comp.ranks)


def test_disaggregated_components_own_their_devices():
    p = plan_placement({"actor": "0-1", "rollout": "2-3"}, devices())
    assert p.mode is PlacementMode.DISAGGREGATED
    assert p.relation("actor", "rollout") is PlacementMode.DISAGGREGATED
    assert all(r.share == 1.0 for c in ("actor", "rollout") for r in p[c].ranks)
    assert {r.device.node_rank for r in p["rollout"].ranks} == {1}


def test_hybrid_env_on_cpu_slots_beside_collocated_gpus():
    p = plan_placement({"actor,rollout": "all", "env": "cpu:0-1", "reward": "0"}, devices())
    assert p.mode is PlacementMode.HYBRID
    assert p.relation("actor", "rollout") is PlacementMode.COLLOCATED
    assert p["env"].device_kind == "cpu" and p["actor"].device_kind == "gpu"
    assert p.relation("actor", "env") is PlacementMode.DISAGGREGATED  # different device kinds never share
    # GPU 0 carries actor, rollout and reward: each gets a third of it; GPU 1 is split in two.
    assert p["actor"].ranks[0].share == pytest.approx(1 / 3)
    assert p["actor"].ranks[1].share == 0.5
    assert p["reward"].ranks[0].share == pytest.approx(1 / 3)
    assert p["env"].ranks[0].share == 1.0


def test_cpu_only_cluster_places_on_cpu_slots():
    p = plan_placement({"actor": "0-1", "rollout": "2-3"}, devices(gpus_per_node=(0, 0)))
    assert p["actor"].device_kind == "cpu"
    assert [r.device.index for r in p["rollout"].ranks] == [2, 3]


def test_out_of_range_names_component_and_valid_range():
    with pytest.raises(PlacementError) as err:
        plan_placement({"actor": "0-3", "rollout": "2-5"}, devices())
    msg = str(err.value)
    assert msg.startswith("cluster.component_placement.rollout='2-5' (component 'rollout') uses gpu devices 4-5,"), msg
    assert "valid: 0-3" in msg


def test_gpu_placement_on_cpu_only_cluster_is_refused():
    with pytest.raises(PlacementError, match="'actor'.*has none"):
        plan_placement({"actor": "gpu:0"}, devices(gpus_per_node=(0, 0)))


def test_unknown_component_is_named_with_the_known_ones():
    with pytest.raises(PlacementError) as err:
        plan_placement({"actor,rolout": "0-1"}, devices(), known_components=["actor", "rollout", "reward"])
    assert "'rolout'" in str(err.value) and "['actor', 'reward', 'rollout']" in str(err.value)


def test_component_placed_twice_is_an_overlap_error():
    with pytest.raises(PlacementError, match="'actor' is placed twice"):
        plan_placement({"actor,rollout": "0-1", "actor": "2-3"}, devices())


def test_unknown_device_kind():
    with pytest.raises(PlacementError, match="'env'.*'tpu'"):
        plan_placement({"env": "tpu:0"}, devices())


def test_missing_component_lookup_names_placed_ones():
    p = plan_placement({"actor": "0"}, devices())
    with pytest.raises(PlacementError, match="'critic' has no placement.*'actor'"):
        p["critic"]


def test_several_ranks_per_device():
    p = plan_placement({"env": "cpu:0-1*3", "actor": "0"}, devices())
    env = p["env"]
    assert env.world_size == 6 and env.device_kind == "cpu"
    assert [r.device.index for r in env.ranks] == [0, 0, 0, 1, 1, 1]
    assert all(r.share == pytest.approx(1 / 3) for r in env.ranks)
    both = plan_placement({"rollout": "1*3", "actor": "1"}, devices(gpus_per_node=(0, 0)))
    assert both["rollout"].ranks[0].share == 0.25 and both["actor"].ranks[0].share == 0.25


@pytest.mark.parametrize("text", ["0-1*0", "0-1*x", "0*"])
def test_bad_ranks_per_device(text):
    with pytest.raises(PlacementError, match="'env'.*positive integer"):
        plan_placement({"env": text}, devices())


@pytest.mark.parametrize("comma,per_component", [
    # the reasoning presets before and after they moved to one key per component (issue 15)
    ({"actor,rollout": "0-1", "reward": "0", "reference": "0", "critic": "0-1"},
     {"actor": "0-1", "rollout": "0-1", "reward": "0", "reference": "0", "critic": "0-1"}),
    ({"actor": "0", "rollout,reward": "1", "reference": "0", "critic": "0"},
     {"actor": "0", "rollout": "1", "reward": "1", "reference": "0", "critic": "0"}),
])
def test_one_key_per_component_places_exactly_like_a_comma_key(comma, per_component):
    cpus = devices(gpus_per_node=(0,), cpus_per_node=(2,))
    a, b = plan_placement(comma, cpus), plan_placement(per_component, cpus)
    assert a.mode is b.mode and dict(a.components) == dict(b.components)
    assert {(x, y): a.relation(x, y) for x in comma for y in per_component if "," not in x + y} == \
        {(x, y): b.relation(x, y) for x in comma for y in per_component if "," not in x + y}


def test_weight_link_uses_gloo_and_cuda_ipc_only_where_components_share_a_gpu():
    # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), which the first GPU run hit
    assert plan_placement({"actor,rollout": "0"}, devices()).weight_link("actor", "rollout") == ("gloo", "ipc")
    hybrid = plan_placement({"actor": "0-1", "rollout": "1-2"}, devices())
    assert hybrid.weight_link("actor", "rollout") == ("gloo", "ipc")
    assert plan_placement({"actor": "0-1", "rollout": "2-3"}, devices()).weight_link("actor", "rollout") == (None, "group")
    cpu = plan_placement({"actor,rollout": "0-1"}, devices(gpus_per_node=(0, 0)))
    assert cpu.weight_link("actor", "rollout") == (None, "group")  # gloo; shared memory is not needed on CPU
    # a GPU actor and a CPU rollout: each kind's own backend would rendezvous NCCL against gloo (hung on the H100)
    mixed = plan_placement({"actor": "0", "rollout": "cpu:0"}, devices())
    assert mixed.weight_link("actor", "rollout") == ("gloo", "group")
