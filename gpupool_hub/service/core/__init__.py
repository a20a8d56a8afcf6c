"""The service's core: one unit per concern, wired once by ``manager.PoolManager``.

Each unit alone changes its own state (``Enforcement.warn()``, not an edit of its
dicts from outside). The core imports nothing from tornado, requests, ``api/``,
``pages/`` or ``jobs/``: the database only through ``ledger/``, the pure rules
from ``gpupool_hub`` (credits, fairshare, waitqueue, cull, idle, placement).
"""
