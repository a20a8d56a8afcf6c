"""The one statement of the ledger's database: its metadata and every table.

Amounts are integer milli-tokens, times naive UTC (``engine.db_time``). A change here is a
schema change: it comes with an Alembic revision in ``migrations/versions/`` (docs/ledger.md, Upgrading).
"""

from __future__ import annotations

import sqlalchemy as sa

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements INTEGER PRIMARY KEY only

metadata = sa.MetaData()

meta_table = sa.Table(
    "gpupool_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(255), nullable=False),
)

accounts = sa.Table(
    "gpupool_accounts",
    metadata,
    sa.Column("name", sa.Unicode(255), primary_key=True),
    sa.Column("balance_milli", sa.BigInteger, nullable=False, default=0),
    sa.Column("created_at", sa.DateTime, nullable=False),
    # The last local day whose scheduled credits were applied (None: new account).
    sa.Column("credits_through", sa.Date, nullable=True),
)

entries = sa.Table(
    "gpupool_entries",
    metadata,
    sa.Column("id", _ID, primary_key=True, autoincrement=True),
    sa.Column("account", sa.Unicode(255), sa.ForeignKey("gpupool_accounts.name"), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("amount_milli", sa.BigInteger, nullable=False),
    # keys.stored_key: the key, or the hash of a key longer than keys.MAX_KEY_BYTES ...
    sa.Column("idempotency_key", sa.Unicode(1024), nullable=False, unique=True),
    sa.Column("reason", sa.UnicodeText, nullable=False, default=""),
    sa.Column("actor", sa.Unicode(255), nullable=False, default="system"),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("interval_start", sa.DateTime, nullable=True),
    sa.Column("interval_end", sa.DateTime, nullable=True),
    sa.Column("model", sa.Unicode(255), nullable=True),
    sa.Column("gpu_seconds", sa.Numeric(20, 3), nullable=True),
    # ... and then the full key here (None: the key is idempotency_key itself)
    sa.Column("key_text", sa.UnicodeText, nullable=True),
    sa.Index("ix_gpupool_entries_account_id", "account", "id"),
)

# A closed interval of a periodic job (e.g. an hour of debits) is marked done
# in the same transaction as its entries: a crash leaves it either fully
# charged and marked, or untouched.
intervals = sa.Table(
    "gpupool_intervals",
    metadata,
    sa.Column("job", sa.String(64), primary_key=True),
    sa.Column("start", sa.DateTime, primary_key=True),
    sa.Column("end", sa.DateTime, nullable=False),
    sa.Column("completed_at", sa.DateTime, nullable=False),
    sa.Column("entries", sa.Integer, nullable=False, default=0),
)

# GPU allocations held by servers: the service's pool is rebuilt from the
# active ones at start-up, and the embedded usage source charges from them.
allocations = sa.Table(
    "gpupool_allocations",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("user", sa.Unicode(255), nullable=False),
    sa.Column("server", sa.Unicode(255), nullable=False, default=""),
    sa.Column("node", sa.Unicode(255), nullable=False),
    sa.Column("gpus", sa.JSON, nullable=False),  # [{"index", "uuid", "model", "milli", "mig_uuid"[, "mig_profile"]}]
    sa.Column("request", sa.JSON, nullable=False),
    sa.Column("price_per_hour_milli", sa.BigInteger, nullable=False),
    sa.Column("borrowed", sa.Boolean, nullable=False, default=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("released_at", sa.DateTime, nullable=True),
    sa.Column("release_reason", sa.UnicodeText, nullable=True),
    # the charge starts here; NULL: the server's work has not started (a pending batch job), nothing charged
    sa.Column("charged_from", sa.DateTime, nullable=True),
    # the hub stopped the server, the engine has not confirmed its work ended: held and charged until it does
    sa.Column("stop_asked_at", sa.DateTime, nullable=True),
    sa.Index("ix_gpupool_allocations_active", "released_at", "user"),
)

# Sub-milli-token remainders of debits, per account and model. Each debit is
# rounded to the milli-token and the remainder carried into the next one, so
# that the total charged never drifts from the exact cost, however short the
# debit interval (minute intervals would otherwise round 1/60 up 60 times).
carries = sa.Table(
    "gpupool_carries",
    metadata,
    sa.Column("account", sa.Unicode(255), primary_key=True),
    sa.Column("model", sa.Unicode(255), primary_key=True),
    sa.Column("residual", sa.String(64), nullable=False),  # a Decimal, exactly as computed
)

# Every cull action (warning, kernels shut down, server stopped), with its
# reason, whether it was a dry run, and who decided: the admins' audit trail.
audit = sa.Table(
    "gpupool_audit",
    metadata,
    sa.Column("id", _ID, primary_key=True, autoincrement=True),
    sa.Column("at", sa.DateTime, nullable=False),
    sa.Column("user", sa.Unicode(255), nullable=False),
    sa.Column("server", sa.Unicode(255), nullable=False, default=""),
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("reason", sa.UnicodeText, nullable=False),
    sa.Column("dry_run", sa.Boolean, nullable=False, default=False),
    sa.Column("detail", sa.JSON, nullable=True),
    # one user's events, newest first: the notices in their ``GET me``, ``gpupool audit --user``
    sa.Index("ix_gpupool_audit_user", "user", "id"),
)

# Servers waiting for GPUs (the wait queue): kept here so that a restart of the
# service loses nobody's place. Reservations live in the pool only; the queue's
# dispatch makes them again after a restart.
queue = sa.Table(
    "gpupool_queue",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("user", sa.Unicode(255), nullable=False),
    sa.Column("server", sa.Unicode(255), nullable=False, default=""),
    sa.Column("request", sa.JSON, nullable=False),  # the placement request, models already narrowed
    sa.Column("requested_models", sa.JSON, nullable=True),
    sa.Column("priority", sa.Integer, nullable=False, default=1),
    sa.Column("since", sa.DateTime, nullable=False),
    sa.UniqueConstraint("user", "server", name="uq_gpupool_queue_user_server"),
)

# The devices (GPU and MIG instance UUIDs) each node's agent last reported: kept so that
# after a restart no other node's agent token can claim them before their node reports.
node_devices = sa.Table(
    "gpupool_node_devices",
    metadata,
    sa.Column("device", sa.Unicode(255), primary_key=True),
    sa.Column("node", sa.Unicode(255), nullable=False),
    sa.Column("reported_at", sa.DateTime, nullable=False),
)

# What users' GPUs did while held, per local day of the pool, user and team (the team the
# user counted against when it was measured): GPU-seconds held, busy and of unknown use, in
# thousandths (a 0.5 share held a minute is 30,000). Busy is the server's own use of its GPU
# or share, at most the share. Written by the gpu-use job, one interval at a time.
gpu_use = sa.Table(
    "gpupool_gpu_use",
    metadata,
    sa.Column("day", sa.Date, primary_key=True),
    sa.Column("user", sa.Unicode(255), primary_key=True),
    sa.Column("team", sa.Unicode(255), primary_key=True),
    sa.Column("held_milli", sa.BigInteger, nullable=False, default=0),
    sa.Column("busy_milli", sa.BigInteger, nullable=False, default=0),
    sa.Column("unknown_milli", sa.BigInteger, nullable=False, default=0),
)

# Every start estimate the queue showed (once per waiting entry: the one shown when it
# joined) and the real start: the published accuracy of the estimates. Seconds after
# ``shown_at``; a bound of None is "not within the horizon".
estimates = sa.Table(
    "gpupool_estimates",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),  # the queue entry's id (the allocation's, once started)
    sa.Column("user", sa.Unicode(255), nullable=False),
    sa.Column("shown_at", sa.DateTime, nullable=False),
    sa.Column("low_s", sa.Integer, nullable=True),
    sa.Column("mid_s", sa.Integer, nullable=True),
    sa.Column("high_s", sa.Integer, nullable=True),
    sa.Column("basis", sa.String(16), nullable=False),  # "history" or "fallback" (queue/estimates.py)
    sa.Column("started_at", sa.DateTime, nullable=True),
    # the release model's own point estimate (seconds) before calibration: what the next
    # estimates are calibrated on, against the real start (eta.Calibration)
    sa.Column("model_s", sa.Integer, nullable=True),
    sa.Index("ix_gpupool_estimates_started", "started_at"),
)
