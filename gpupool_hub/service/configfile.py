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
"""

from __future__ import annotations

import os

from traitlets.config import Application

__all__ = ["CONFIG_FILE_ENV", "hub_config_file"]

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
