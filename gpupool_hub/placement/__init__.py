"""GPU placement engine: pack GPU requests across nodes and inside nodes.

Pure Python, no I/O. The hub keeps one :class:`Pool`; see docs/placement.md.
"""

from .errors import (
    InvalidRequest,
    InventoryError,
    ModelUnavailable,
    NoCapacity,
    PlacementConflict,
    PlacementError,
)
from .mix import DEFAULT_FLOOR_WEIGHT, DEFAULT_RESERVE, RequestMix
from .hardware import GPU, Link, MigDevice, Node, load_node, load_nodes
from .policies import FGD, BestFit, FirstFit, Policy, RandomFit, get_policy, policy_names, register_policy
from .request import MILLI, Request, model_allowed, normalize_model
from .report import FreeSummary
from .state import GPUShare, NodeState, Placement, Pool
from .topology import PcieLevel, Topology

__all__ = [
    "BestFit", "DEFAULT_FLOOR_WEIGHT", "DEFAULT_RESERVE", "FGD", "FirstFit", "FreeSummary", "GPU", "GPUShare",
    "InvalidRequest", "InventoryError", "Link", "MILLI", "MigDevice", "ModelUnavailable", "NoCapacity", "Node", "NodeState", "PcieLevel",
    "Placement", "PlacementConflict", "PlacementError", "Policy", "Pool", "RandomFit", "Request", "RequestMix",
    "Topology", "get_policy", "load_node", "load_nodes", "model_allowed", "normalize_model",
    "policy_names", "register_policy",
]
