"""Alembic's environment for the ledger: run by ``migrations.migrate`` on the connection it
passes (``config.attributes["connection"]``), or by ``python -m gpupool_hub.ledger.migrations``
on ``sqlalchemy.url``. SQLite alters tables in batch mode (a copy of the table)."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from gpupool_hub.ledger.database import make_engine
from gpupool_hub.ledger.migrations import VERSION_TABLE
from gpupool_hub.ledger.schema import metadata

config = context.config


def run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, version_table=VERSION_TABLE,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():  # within the caller's transaction when it has one
        context.run_migrations()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata,
                      version_table=VERSION_TABLE, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif "connection" in config.attributes:
    run(config.attributes["connection"])
else:
    engine = make_engine(config.get_main_option("sqlalchemy.url"))  # type: ignore[arg-type]
    try:
        with engine.begin() as conn:
            run(conn)
    finally:
        engine.dispose()
