"""Shared node topologies for the placement tests."""

from __future__ import annotations

import pytest

# DGX-1 with V100 (hybrid cube-mesh). NVLink counts per pair as `nvidia-smi topo -m`
# reports them on a DGX-1V (NV1/NV2); the same matrix is used by NVIDIA's
# go-gpuallocator tests. Quads 0-3 and 4-7 are fully connected, plus 0-4, 1-5,
# 2-6, 3-7 across them.
DGX1V_NVLINKS = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 2,
}
# PCIe: pairs behind one switch, the rest of the socket via host bridge, other socket via SMP.
DGX1V_SWITCH_PAIRS = {(0, 1), (2, 3), (4, 5), (6, 7)}


def dgx1v_links():
    links = []
    for a in range(8):
        for b in range(a + 1, 8):
            if (a, b) in DGX1V_SWITCH_PAIRS:
                pcie = "SINGLE"
            elif (a < 4) == (b < 4):
                pcie = "HOSTBRIDGE"
            else:
                pcie = "SYSTEM"
            links.append({"gpus": [a, b], "nvlinks": DGX1V_NVLINKS.get((a, b), 0), "pcie": pcie})
    return links


def dgx1v_node(name: str = "dgx1", cpu_milli: int = 80000, memory_mib: int = 512 * 1024) -> dict:
    return {
        "name": name, "cpu_milli": cpu_milli, "memory_mib": memory_mib,
        "gpus": [{"index": i, "uuid": f"GPU-{name}-{i}", "model": "Tesla V100-SXM2-32GB", "memory_mib": 32768}
                 for i in range(8)],
        "links": dgx1v_links(),
    }


def rtx4_node(name: str = "box4") -> dict:
    """4 GPUs with NVLink bridges on pairs 0-3 and 1-2 (like a 4x RTX 8000 workstation)."""
    return {
        "name": name, "cpu_milli": 32000, "memory_mib": 128 * 1024,
        "gpus": [{"index": i, "uuid": f"GPU-{name}-{i}", "model": "Quadro RTX 8000"} for i in range(4)],
        "links": [
            {"gpus": [0, 3], "nvlinks": 2, "pcie": "NODE"},
            {"gpus": [1, 2], "nvlinks": 2, "pcie": "NODE"},
            {"gpus": [0, 1], "pcie": "NODE"},
            {"gpus": [2, 3], "pcie": "NODE"},
            {"gpus": [0, 2], "pcie": "SYSTEM"},
            {"gpus": [1, 3], "pcie": "SYSTEM"},
        ],
    }


def plain_node(name: str, gpus: int, model: str = "NVIDIA GeForce RTX 3090", cpu_milli: int = 64000,
               memory_mib: int = 256 * 1024) -> dict:
    return {"name": name, "cpu_milli": cpu_milli, "memory_mib": memory_mib,
            "gpus": {"count": gpus, "model": model}}


@pytest.fixture
def dgx1v() -> dict:
    return dgx1v_node()


@pytest.fixture
def rtx4() -> dict:
    return rtx4_node()
