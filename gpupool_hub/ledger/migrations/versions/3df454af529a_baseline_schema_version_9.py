"""Baseline: the ledger at schema version 9, the last hand-written one

Written out and frozen: a later change to ``schema.py`` comes as a revision of its own
and never alters what this one creates. The hand-written steps (``legacy.py``) build
their tables with the functions below, as the released steps built them.

Revision ID: 3df454af529a
Revises:
Create Date: 2026-11-24

"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "3df454af529a"
down_revision = None
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements INTEGER PRIMARY KEY only


def create_meta() -> None:
    op.create_table(
        "gpupool_meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(255), nullable=False),
    )


def create_accounts() -> None:
    op.create_table(
        "gpupool_accounts",
        sa.Column("name", sa.Unicode(255), primary_key=True),
        sa.Column("balance_milli", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("credits_through", sa.Date, nullable=True),
    )


def create_entries() -> None:
    op.create_table(
        "gpupool_entries",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("account", sa.Unicode(255), sa.ForeignKey("gpupool_accounts.name"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("amount_milli", sa.BigInteger, nullable=False),
        sa.Column("idempotency_key", sa.Unicode(1024), nullable=False, unique=True),
        sa.Column("reason", sa.UnicodeText, nullable=False),
        sa.Column("actor", sa.Unicode(255), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("interval_start", sa.DateTime, nullable=True),
        sa.Column("interval_end", sa.DateTime, nullable=True),
        sa.Column("model", sa.Unicode(255), nullable=True),
        sa.Column("gpu_seconds", sa.Numeric(20, 3), nullable=True),
        sa.Column("key_text", sa.UnicodeText, nullable=True),
    )
    op.create_index("ix_gpupool_entries_account_id", "gpupool_entries", ["account", "id"])


def create_intervals() -> None:
    op.create_table(
        "gpupool_intervals",
        sa.Column("job", sa.String(64), primary_key=True),
        sa.Column("start", sa.DateTime, primary_key=True),
        sa.Column("end", sa.DateTime, nullable=False),
        sa.Column("completed_at", sa.DateTime, nullable=False),
        sa.Column("entries", sa.Integer, nullable=False),
    )


def create_allocations() -> None:
    op.create_table(
        "gpupool_allocations",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("user", sa.Unicode(255), nullable=False),
        sa.Column("server", sa.Unicode(255), nullable=False),
        sa.Column("node", sa.Unicode(255), nullable=False),
        sa.Column("gpus", sa.JSON, nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("price_per_hour_milli", sa.BigInteger, nullable=False),
        sa.Column("borrowed", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("released_at", sa.DateTime, nullable=True),
        sa.Column("release_reason", sa.UnicodeText, nullable=True),
    )
    op.create_index("ix_gpupool_allocations_active", "gpupool_allocations", ["released_at", "user"])


def create_carries() -> None:
    op.create_table(
        "gpupool_carries",
        sa.Column("account", sa.Unicode(255), primary_key=True),
        sa.Column("model", sa.Unicode(255), primary_key=True),
        sa.Column("residual", sa.String(64), nullable=False),
    )


def create_audit_index() -> None:
    op.create_index("ix_gpupool_audit_user", "gpupool_audit", ["user", "id"])


def create_audit() -> None:
    op.create_table(
        "gpupool_audit",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("user", sa.Unicode(255), nullable=False),
        sa.Column("server", sa.Unicode(255), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("reason", sa.UnicodeText, nullable=False),
        sa.Column("dry_run", sa.Boolean, nullable=False),
        sa.Column("detail", sa.JSON, nullable=True),
    )
    create_audit_index()


def create_queue() -> None:
    op.create_table(
        "gpupool_queue",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("user", sa.Unicode(255), nullable=False),
        sa.Column("server", sa.Unicode(255), nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("requested_models", sa.JSON, nullable=True),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("since", sa.DateTime, nullable=False),
        sa.UniqueConstraint("user", "server", name="uq_gpupool_queue_user_server"),
    )


def create_node_devices() -> None:
    op.create_table(
        "gpupool_node_devices",
        sa.Column("device", sa.Unicode(255), primary_key=True),
        sa.Column("node", sa.Unicode(255), nullable=False),
        sa.Column("reported_at", sa.DateTime, nullable=False),
    )


def create_gpu_use() -> None:
    op.create_table(
        "gpupool_gpu_use",
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("user", sa.Unicode(255), primary_key=True),
        sa.Column("team", sa.Unicode(255), primary_key=True),
        sa.Column("held_milli", sa.BigInteger, nullable=False),
        sa.Column("busy_milli", sa.BigInteger, nullable=False),
        sa.Column("unknown_milli", sa.BigInteger, nullable=False),
    )


def create_estimates() -> None:
    op.create_table(
        "gpupool_estimates",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("user", sa.Unicode(255), nullable=False),
        sa.Column("shown_at", sa.DateTime, nullable=False),
        sa.Column("low_s", sa.Integer, nullable=True),
        sa.Column("mid_s", sa.Integer, nullable=True),
        sa.Column("high_s", sa.Integer, nullable=True),
        sa.Column("basis", sa.String(16), nullable=False),
        sa.Column("started_at", sa.DateTime, nullable=True),
        sa.Column("model_s", sa.Integer, nullable=True),
    )
    op.create_index("ix_gpupool_estimates_started", "gpupool_estimates", ["started_at"])


def upgrade() -> None:
    for create in (create_meta, create_accounts, create_entries, create_intervals, create_allocations,
                   create_carries, create_audit, create_queue, create_node_devices, create_gpu_use,
                   create_estimates):
        create()


def downgrade() -> None:
    raise NotImplementedError("the baseline is not undone: restore the backup taken before the upgrade")
