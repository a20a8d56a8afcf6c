"""JupyterLab integration of gpupool_hub: the balance status-bar item.

Two halves ship in the ``gpupool_hub`` wheel:

* a prebuilt JupyterLab 4 extension (TypeScript source in ``labextension/``,
  built by hatch-jupyter-builder into ``gpupool_hub/labext/labextension`` and
  installed as shared data into ``share/jupyter/labextensions/@gpupool/hub-balance``);
* this Jupyter *server* extension, which adds ``GET {base_url}gpupool/me`` to
  the single-user server and forwards it to the gpupool hub service with the
  server's own ``JUPYTERHUB_API_TOKEN`` (see :mod:`gpupool_hub.labext.handlers`
  and docs/widget.md for why the browser does not talk to the service itself),
  and in a GPU server checks each kernel start against the pool
  (:mod:`gpupool_hub.labext.kernels`), and keeps the file named by
  ``GPUPOOL_NOTICE_FILE`` current while a stop of its GPUs is pending
  (:mod:`gpupool_hub.labext.noticefile`, read by :mod:`gpupool_hub.notice`).

The server extension is enabled by the shipped
``etc/jupyter/jupyter_server_config.d/gpupool_hub.labext.json``.
"""

from __future__ import annotations

from typing import Any

#: npm package name of the prebuilt extension (labextension/package.json "name").
LABEXTENSION_NAME = "@gpupool/hub-balance"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the prebuilt extension lives (used by ``jupyter labextension develop``)."""
    return [{"src": "labextension", "dest": LABEXTENSION_NAME}]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    return [{"module": "gpupool_hub.labext"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from .handlers import setup_handlers
    from .kernels import guard_kernels
    from .noticefile import start_notice_file

    setup_handlers(serverapp.web_app)
    serverapp.log.info("gpupool_hub.labext: serving %sgpupool/me", serverapp.web_app.settings.get("base_url", "/"))
    if guard_kernels(serverapp):
        serverapp.log.info("gpupool_hub.labext: new kernels start without GPUs once the pool took them back")
    writer = start_notice_file(serverapp)
    if writer is not None:
        serverapp.log.info("gpupool_hub.labext: a pending stop of this server's GPUs is written to %s", writer.path)


# Older name used by jupyter_server < 2 and notebook; harmless to keep.
load_jupyter_server_extension = _load_jupyter_server_extension
