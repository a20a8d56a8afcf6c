"""GPUPoolSpawner: priced GPU profiles, a balance check and packed placement for JupyterHub.

The spawner half of gpupool_hub. ``GPUPoolSpawner`` is a mixin (a
:class:`jupyterhub.spawner.Spawner` subclass that calls ``super()``
everywhere); the ready classes combine it with a real spawner, one per
engine (``gpupool_hub/engines/``): ``gpupool-localprocess`` and
``gpupool-simple`` (``engines/local``), ``gpupool-systemd``,
``gpupool-kubernetes``, ``gpupool-slurm``.

Configure with ``c.GPUPoolSpawner.profiles = [...]``; see docs/spawner.md.

Modules: ``base`` (the mixin, one class: profiles, asking the pool, environment,
progress, ``start``/``stop``/``poll`` and state; it holds the two below),
``wait_loop`` (``WaitLoop``: asking again while the pool says wait; its limits
and messages in ``wait_rules``), ``release`` (``ServerReleases``: this server's
releases, the spawn attempt it abandoned, and the outbox of releases the
service has not confirmed), ``logs`` (refusals logged as INFO), ``client``
(the service's REST API, refusals), ``form`` + ``templates/form.html`` (the
options form), ``overrides`` (trait values a spawn sets and undoes),
``progress``, ``errors``, ``ends`` (how a server's work ends), ``devices`` (what selects
and opens a GPU). Profiles
themselves are parsed in :mod:`gpupool_hub.profiles`, re-exported here.
"""

from __future__ import annotations

from ..profiles import MAX_GPUS, PROFILE_KEYS, Profile, parse_memory, parse_profile, parse_profiles
from .base import STATE_KEY, GPUPoolSpawner
from .client import DEFAULT_API_URL, GPUPoolClient, ServiceError, ServiceUnavailable
from .errors import GPUPoolRefused, SpawnFailure, invalid_options
from .form import gpupool_options_from_form, render_form
from .overrides import TraitOverrides

GPUPoolSpawnerMixin = GPUPoolSpawner

__all__ = [
    "DEFAULT_API_URL", "MAX_GPUS", "PROFILE_KEYS", "STATE_KEY", "GPUPoolClient",
    "GPUPoolRefused", "GPUPoolSpawner", "GPUPoolSpawnerMixin", "Profile", "ServiceError",
    "ServiceUnavailable", "SpawnFailure", "TraitOverrides", "gpupool_options_from_form", "invalid_options",
    "parse_memory", "parse_profile", "parse_profiles", "render_form",
]
