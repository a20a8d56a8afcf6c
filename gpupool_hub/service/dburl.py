"""The ledger database's URL: ``c.GPUPool.db_url``, or read from ``c.GPUPool.db_url_file``.

A PostgreSQL URL holds a password. Passed in the service entry's
``environment`` it ended up in the hub's own database, readable by users'
servers (issue 27.4); a file only the service's user can read keeps it there.
"""

from __future__ import annotations

import os
import stat

from ..config import GPUPool


class DbUrlFileError(RuntimeError):
    """``db_url_file`` cannot be used; the message says what to do."""


def ledger_url(settings: GPUPool) -> str:
    """The URL to open the ledger with. Refuses a file that group or others may read,
    an empty one, or one of more than one line (a typo must not become a database)."""
    path = settings.db_url_file
    if not path:
        return settings.db_url
    where = f"c.GPUPool.db_url_file {path!r}"
    try:
        with open(path, encoding="utf-8") as f:
            mode = os.fstat(f.fileno()).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise DbUrlFileError(
                    f"{where} may be read by group or others (mode {stat.S_IMODE(mode):04o}); it holds the "
                    f"database password: make it readable by the service's user only (chmod 600 {path})")
            lines = [line.strip() for line in f.read(64 * 1024).splitlines() if line.strip()]
    except OSError as e:
        raise DbUrlFileError(f"{where} cannot be read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise DbUrlFileError(f"{where} is not UTF-8 text") from None
    if len(lines) != 1:
        raise DbUrlFileError(f"{where} must hold the database URL on one line, found {len(lines)} lines")
    return lines[0]
