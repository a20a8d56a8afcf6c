"""Discovery: NVML facts -> the pool's inventory format, accepted by load_node/load_nodes."""

from __future__ import annotations

import pytest

from gpupool_hub.agent.nvml import bus_key, discover, nvml_session, text
from gpupool_hub.placement.hardware import load_nodes
from gpupool_hub.placement.topology import PcieLevel
from tests.agent import fake_pynvml as F
from tests.agent.conftest import A100, GIB, gpu


def bus(i: int) -> str:
    return f"00000000:{0x10 + i:02X}:00.0"


def test_gpus_mig_nvlink_and_pcie_topology_become_a_valid_inventory(make_nvml):
    nv = make_nvml(
        [
            # GPU 0 <-> GPU 1: 4 direct NVLinks (listed on both ends; must count once)
            gpu(0, nvlinks={0: bus(1), 1: bus(1), 2: bus(1), 3: bus(1)}),
            gpu(1, nvlinks={0: bus(0), 1: bus(0), 2: bus(0), 3: "0000:10:00.0"},  # short domain spelling
                mig=[{"uuid": "MIG-a", "name": f"{A100} MIG 3g.40gb", "gi_id": 1, "slices": 3, "memory_total": 40 * GIB},
                     {"uuid": "MIG-b", "name": f"{A100} MIG 2g.20gb", "gi_id": 5, "slices": 2, "memory_total": 20 * GIB}]),
            # consumer GPUs: no NVLink at all
            gpu(2, model="NVIDIA GeForce RTX 3090", memory_total=24 * GIB, fail={"nvmlDeviceGetNvLinkState": F.NVML_ERROR_NOT_SUPPORTED}),
            gpu(3, model="NVIDIA GeForce RTX 3090", memory_total=24 * GIB, mig=[]),  # MIG-capable API, disabled
        ],
        topology={(0, 1): F.NVML_TOPOLOGY_SINGLE, (2, 3): F.NVML_TOPOLOGY_HOSTBRIDGE, (0, 2): F.NVML_TOPOLOGY_NODE,
                  (1, 3): F.NVML_TOPOLOGY_INTERNAL},
    )
    with nvml_session(nv):
        inv, gpus = discover(nv, "node-a", labels={"rack": "r1"})
    assert nv.initialized == 0  # shut down again

    assert inv["name"] == "node-a" and inv["labels"] == {"rack": "r1"}
    assert inv["cpu_milli"] >= 1000 and inv["memory_mib"] > 0
    assert [(g["index"], g["uuid"], g["model"], g["memory_mib"]) for g in inv["gpus"]] == [
        (0, "GPU-0000-fake", A100, 80 * 1024), (1, "GPU-0001-fake", A100, 80 * 1024),
        (2, "GPU-0002-fake", "NVIDIA GeForce RTX 3090", 24 * 1024),
        (3, "GPU-0003-fake", "NVIDIA GeForce RTX 3090", 24 * 1024),
    ]
    assert "mig" not in inv["gpus"][0] and "mig" not in inv["gpus"][3]
    assert inv["gpus"][1]["mig"] == [{"uuid": "MIG-a", "profile": "3g.40gb", "milli": 428},
                                     {"uuid": "MIG-b", "profile": "2g.20gb", "milli": 285}]
    assert [m.gpu_instance_id for m in gpus[1].mig] == [1, 5]

    links = {tuple(l["gpus"]): (l["nvlinks"], l.get("pcie")) for l in inv["links"]}
    assert links == {  # every pair, PCIe level from NVML, absent pairs are SYSTEM
        (0, 1): (4, "SINGLE"), (0, 2): (0, "NODE"), (0, 3): (0, "SYSTEM"),
        (1, 2): (0, "SYSTEM"), (1, 3): (0, "INTERNAL"), (2, 3): (0, "HOSTBRIDGE"),
    }

    (node,) = load_nodes([inv])  # the service's own loader accepts it as is
    assert node.topology.n == 4
    assert {(l.a, l.b): l.pcie for l in node.links}[(0, 1)] is PcieLevel.SINGLE
    assert [m.milli for m in node.gpus[1].mig] == [428, 285]


def test_nvswitch_ports_connect_every_switch_attached_pair(make_nvml):
    switch = "00000000:C0:00.0"  # not a GPU's bus id
    nv = make_nvml([gpu(i, nvlinks={k: switch for k in range(12)}) for i in range(3)]
                   + [gpu(3, nvlinks={k: switch for k in range(6)})])
    with nvml_session(nv):
        inv, _ = discover(nv, "dgx")
    links = {tuple(l["gpus"]): l["nvlinks"] for l in inv["links"]}
    assert links[(0, 1)] == links[(1, 2)] == 12
    assert links[(0, 3)] == 6  # limited by the GPU with fewer switch ports
    load_nodes([inv])


def test_mig_profile_from_attributes_when_the_name_has_none_and_a30_has_four_slices(make_nvml):
    nv = make_nvml([gpu(0, model="NVIDIA A30", memory_total=24 * GIB,
                        mig=[{"uuid": "MIG-x", "name": "MIG device", "gi_id": 3, "slices": 2, "memory_total": 12 * GIB},
                             {"uuid": "MIG-y", "name": "NVIDIA A30 MIG 1g.6gb", "gi_id": 4, "slices": 1,
                              "memory_total": 6 * GIB}])])
    with nvml_session(nv):
        inv, _ = discover(nv, "n")
    assert inv["gpus"][0]["mig"] == [{"uuid": "MIG-x", "profile": "2g.12gb", "milli": 500},
                                     {"uuid": "MIG-y", "profile": "1g.6gb", "milli": 250}]


def test_a_node_without_gpus_is_still_a_valid_inventory(make_nvml):
    nv = make_nvml([])
    with nvml_session(nv):
        inv, gpus = discover(nv, "cpu-only", cpu_milli=4000, memory_mib=8192)
    assert (inv["gpus"], inv["links"], inv["cpu_milli"], inv["memory_mib"]) == ([], [], 4000, 8192)
    assert gpus == []


@pytest.mark.parametrize("raw,expected", [(b"00000000:17:00.0", (0, 0x17, 0, 0)), ("0000:17:00.0", (0, 0x17, 0, 0)),
                                          ("00000000:af:00.0\x00", (0, 0xAF, 0, 0))])
def test_bus_ids_compare_across_spellings(raw, expected):
    assert bus_key(raw) == expected


def test_text_accepts_bytes_and_str():
    assert text(b"GPU-1\x00") == "GPU-1" and text(" GPU-2 ") == "GPU-2"
