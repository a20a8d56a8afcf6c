"""Which configuration file the gpupool service reads: the hub's own, found by the hub's config itself.

The trap this closes: the example configuration used to tell the service to
read *its own* path (``__file__``). An admin's ``jupyterhub_config.py`` that
``load_subconfig``-ed the example then had the service read the example, not
the admin's file, and every setting made after the ``load_subconfig`` (prices,
``enabled: false`` for a team, …) silently did not reach the service.

A config file is executed inside the program that loads it, so it can ask that
program: while the hub loads its configuration, the running
:class:`traitlets.config.Application` is the hub, and its ``config_file`` is
the file given with ``-f``/``--config`` (the top-level one, not a subconfig).
The example passes that path to the service's ``--config``. Inside the
service, the running Application is the service itself, reading that file.

The ledger database's URL: ``c.GPUPool.db_url``, or read from ``c.GPUPool.db_url_file``.

A PostgreSQL URL holds a password. Passed in the service entry's
``environment`` it ended up in the hub's own database, readable by users'
servers (issue 27.4); a file only the service's user can read keeps it there.
"""

from __future__ import annotations

import logging
import os

from traitlets.config import Application

from ..config import GPUPool
from ..identity.secretfile import read_secret_line

__all__ = ["CONFIG_FILE_ENV", "DbUrlFileError", "hub_config_file", "ledger_url", "load_config_file"]

#: An explicit choice of the file the service reads (e.g. a separate file just for the service).
CONFIG_FILE_ENV = "GPUPOOL_CONFIG_FILE"


def hub_config_file(fallback: str) -> str:
    """The absolute path of the configuration file the running program was started with.

    ``GPUPOOL_CONFIG_FILE`` wins when set; otherwise the running Application's
    ``config_file`` (the hub's ``-f``, relative to its working directory);
    ``fallback`` (pass ``__file__``) only when no Application is running, e.g.
    when a tool executes the file on its own.
    """
    explicit = os.environ.get(CONFIG_FILE_ENV)
    if explicit:
        return os.path.abspath(explicit)
    if Application.initialized():
        path = getattr(Application.instance(), "config_file", "")
        if isinstance(path, str) and path:
            return os.path.abspath(path)
    return os.path.abspath(fallback)


def load_config_file(app: Application) -> None:
    """Load the file ``app`` reads (its ``config_file``, or ``GPUPOOL_CONFIG_FILE``) into it; the
    command line wins over the file. A file named on the command line or in the environment but
    missing stops the program; the default one missing is only a warning."""
    log = logging.getLogger("gpupool")  # (the Application's own log shows WARNING and up)
    explicit = "config_file" in app.cli_config.get(type(app).__name__, {})
    path = os.path.abspath(os.environ.get(CONFIG_FILE_ENV) or app.config_file)  # type: ignore[attr-defined]
    if os.path.exists(path):
        app.config_file = path  # type: ignore[attr-defined]  # what the file's own hub_config_file() sees
        app.load_config_file(path)
        app.update_config(app.cli_config)
        log.info("gpupool: configuration from %s", path)
    elif explicit or CONFIG_FILE_ENV in os.environ:
        raise SystemExit(f"gpupool: config file {path!r} not found")
    else:
        log.warning("gpupool: no configuration file (%s not found); running with the defaults", path)


class DbUrlFileError(RuntimeError):
    """``db_url_file`` cannot be used; the message says what to do."""


def ledger_url(settings: GPUPool) -> str:
    """The URL to open the ledger with. Refuses a file that group or others may read,
    an empty one, or one of more than one line (a typo must not become a database)."""
    path = settings.db_url_file
    if not path:
        return settings.db_url
    return read_secret_line(path, where=f"c.GPUPool.db_url_file {path!r}", what="the database URL", holds="the database password",
                            error=DbUrlFileError)
