"""JupyterHub page templates for a hub with a gpupool: the home page and the spawn page's
progress say where a server waiting for GPUs stands, and offer to leave the queue.

Add the folder to the hub's template path (the example configuration does)::

    from gpupool_hub.hub_templates import TEMPLATE_PATH
    c.JupyterHub.template_paths = [TEMPLATE_PATH]

Each template extends JupyterHub's own (``{% extends "templates/home.html" %}``), so a
hub's own templates may in turn extend these. They read what the spawner already
streams to JupyterHub's progress endpoint (``GPUPoolSpawner.progress``: each event's
``line`` and ``gpupool_wait``) and the spawner's last known place
(``spawner.waits.place``); a user reads only their own servers, through the hub's own
API and its ``read:servers`` scope. Spawners without the gpupool mixin show as JupyterHub
shows them.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["TEMPLATE_PATH"]

#: the folder to put in ``c.JupyterHub.template_paths``
TEMPLATE_PATH = str(Path(__file__).parent)
