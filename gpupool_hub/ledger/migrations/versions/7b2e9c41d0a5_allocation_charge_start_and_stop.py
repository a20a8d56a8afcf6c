"""Allocations: when their charge starts (a batch job's start) and a stop not yet confirmed

``charged_from``: the charge of an allocation starts here, not at ``created_at``, and an
allocation whose server's work has not started (a Slurm job still pending) has none: it holds
its GPUs and is charged nothing (issue 48.3). Every existing allocation was charged from its
creation, so the column starts as a copy of ``created_at``.

``stop_asked_at``: the hub stopped the server but the engine has not confirmed its work ended
(``scancel`` failed while slurmctld was down): the allocation stays held and charged, shown
as stopping, until it does (issue 48.2). Renewed while the hub keeps asking.

Revision ID: 7b2e9c41d0a5
Revises: 3df454af529a
Create Date: 2026-11-28

"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "7b2e9c41d0a5"
down_revision = "3df454af529a"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpupool_allocations") as batch:
        batch.add_column(sa.Column("charged_from", sa.DateTime, nullable=True))
        batch.add_column(sa.Column("stop_asked_at", sa.DateTime, nullable=True))
    allocations = sa.table("gpupool_allocations", sa.column("created_at"), sa.column("charged_from"))
    op.execute(allocations.update().values(charged_from=allocations.c.created_at))


def downgrade() -> None:
    with op.batch_alter_table("gpupool_allocations") as batch:
        batch.drop_column("stop_asked_at")
        batch.drop_column("charged_from")
