"""One secret kept in a file of its own: the ledger's database URL (``c.GPUPool.db_url_file``),
the agent's scrape token (``c.GPUPoolAgent.metrics_token_file``).

Such a file must be its reader's alone and hold exactly one non-blank line: a second line is
more likely a paste mistake than part of the secret, and a file others may read gives the
secret away whatever the program does with it afterwards.
"""

from __future__ import annotations

import os
import stat


def read_secret_line(path: str, *, where: str, what: str, holds: str, error: type[Exception]) -> str:
    """The one line in ``path`` (surrounding white space ignored). ``where`` names the setting,
    ``what`` the secret and ``holds`` what it opens (for the messages); ``error`` is raised."""
    try:
        with open(path, encoding="utf-8") as f:
            mode = os.fstat(f.fileno()).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise error(f"{where} may be read by group or others (mode {stat.S_IMODE(mode):04o}); it "
                            f"holds {holds}: make it its reader's alone (chmod 600 {path})")
            lines = [line.strip() for line in f.read(64 * 1024).splitlines() if line.strip()]
    except OSError as e:
        raise error(f"{where} cannot be read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise error(f"{where} is not UTF-8 text") from None
    if len(lines) != 1:
        raise error(f"{where} must hold {what} on one line, found {len(lines)} lines")
    return lines[0]
