import pytest

from gpupool_hub.placement import InventoryError, PcieLevel, load_nodes

from .conftest import dgx1v_node


def test_dgx1v_loads_with_links(dgx1v):
    (node,) = load_nodes([dgx1v])
    assert len(node.gpus) == 8
    assert node.topology.nvlinks(0, 3) == 2 and node.topology.nvlinks(0, 5) == 0
    link = next(l for l in node.links if (l.a, l.b) == (0, 1))
    assert link.nvlinks == 1 and link.pcie is PcieLevel.SINGLE


def test_shorthand_gpus_and_labels():
    (node,) = load_nodes([{"name": "n", "cpu_milli": 1000, "memory_mib": 10,
                           "gpus": {"count": 2, "model": "A10"}, "labels": {"zone": "a"}}])
    assert [g.index for g in node.gpus] == [0, 1]
    assert node.label_dict == {"zone": "a"}


def test_mig_instances_become_devices():
    (node,) = load_nodes([{"name": "n", "cpu_milli": 1000, "memory_mib": 10, "gpus": [
        {"index": 0, "uuid": "GPU-0", "model": "NVIDIA A100-SXM4-40GB",
         "mig": [{"uuid": "MIG-a", "profile": "3g.20gb"}, {"uuid": "MIG-b", "profile": "4g.20gb"}]}]}])
    assert [m.milli for m in node.gpus[0].mig] == [428, 571]


@pytest.mark.parametrize("config, key", [
    ([{"cpu_milli": 1, "memory_mib": 1}], "nodes[0].name"),
    ([{"name": "a", "cpu_milli": "lots", "memory_mib": 1}], "nodes[0].cpu_milli"),
    ([{"name": "a", "cpu_milli": 1, "memory_mib": 1, "gpu": []}], "nodes[0] has unknown key(s) 'gpu'"),
    ([{"name": "a", "cpu_milli": 1, "memory_mib": 1, "gpus": [{"index": 0}]}], "nodes[0].gpus[0].model"),
    ([{"name": "a", "cpu_milli": 1, "memory_mib": 1, "gpus": [{"model": "x", "memory_mib": -1}]}],
     "nodes[0].gpus[0].memory_mib"),
    ([{"name": "a", "cpu_milli": 1, "memory_mib": 1, "gpus": {"count": 2, "model": "x"},
       "links": [{"gpus": [0, 5], "nvlinks": 1}]}], "nodes[0].links[0]"),
    ([{"name": "a", "cpu_milli": 1, "memory_mib": 1, "gpus": {"count": 2, "model": "x"},
       "links": [{"gpus": [0, 1], "pcie": "WARP"}]}], "nodes[0].links[0].pcie"),
    ([{"name": "a", "cpu_milli": 1, "memory_mib": 1, "gpus": [{"model": "x", "mig": [{"profile": "big"}]}]}],
     "nodes[0].gpus[0].mig[0].milli"),
    ([{"name": "a", "cpu_milli": 1, "memory_mib": 1}, {"name": "a", "cpu_milli": 1, "memory_mib": 1}],
     "nodes[1].name"),
    ([{"name": "a", "cpu_milli": 1, "memory_mib": 1, "gpus": [{"model": "x", "uuid": "u"}, {"model": "x", "uuid": "u"}]}],
     "uuid 'u' is used twice"),
])
def test_bad_config_names_the_key(config, key):
    with pytest.raises(InventoryError) as info:
        load_nodes(config)
    assert isinstance(info.value, ValueError)
    assert key in str(info.value)


def test_config_must_be_a_list():
    with pytest.raises(InventoryError):
        load_nodes({"name": "a"})  # type: ignore[arg-type]


def test_pcie_aliases():
    (node,) = load_nodes([{"name": "n", "cpu_milli": 1, "memory_mib": 1, "gpus": {"count": 3, "model": "x"},
                           "links": [(0, 1, 4, "PIX"), (0, 2, 0, 50), (1, 2, 0, "phb")]}])
    assert [l.pcie for l in node.links] == [PcieLevel.SINGLE, PcieLevel.SYSTEM, PcieLevel.HOSTBRIDGE]
