"""The devices (GPU and MIG instance UUIDs) each node's agent last reported
(``gpupool_node_devices``): kept so that after a restart no other node's agent token can
claim them before their node reports. Reached as ``ledger.nodes``."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import sqlalchemy as sa

from .database import Db, chunks, db_time
from .schema import node_devices


class Nodes:
    """Which node reported each device."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def devices(self) -> dict[str, str]:
        """Every remembered device UUID and the node that reported it."""
        with self.db.read() as conn:
            return {device: node for device, node in conn.execute(sa.select(node_devices.c.device,
                                                                            node_devices.c.node))}

    def set_devices(self, node: str, devices: Iterable[str], at: datetime) -> None:
        """Node ``node`` has exactly ``devices`` now (a device another node had is its now)."""
        devices = sorted(set(devices))
        with self.db.write() as conn:
            conn.execute(node_devices.delete().where(node_devices.c.node == node))
            for chunk in chunks(devices):
                conn.execute(node_devices.delete().where(node_devices.c.device.in_(chunk)))
            rows = [dict(device=d, node=node, reported_at=db_time(at)) for d in devices]
            for chunk in chunks(rows):
                conn.execute(node_devices.insert(), list(chunk))
