"""``python -m gpupool_hub.ledger.migrations "what changed"``: a new revision in ``versions/``,
written by Alembic's autogenerate from the difference between ``schema.py`` and a scratch
SQLite database at the head revision (or ``--url``'s database, at head). Read and edit what it
wrote: autogenerate misses renames and data steps, and the revision must run on PostgreSQL too."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from alembic import command

from ..database import make_engine
from . import alembic_config, migrate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gpupool_hub.ledger.migrations", description=__doc__)
    parser.add_argument("message", help="what the revision changes, e.g. 'add the notes column to accounts'")
    parser.add_argument("--url", help="a database to compare against (default: a scratch SQLite file)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        url = args.url or f"sqlite:///{Path(scratch) / 'head.sqlite'}"
        engine = make_engine(url)
        try:
            migrate(engine)
        finally:
            engine.dispose()
        command.revision(alembic_config(url=url), message=args.message, autogenerate=True)


if __name__ == "__main__":
    main()
