"""GPUPoolSpawner: the mixin that puts a spawn through the gpupool service.

It never decides placement or money itself: on ``start`` it asks the service
(``POST {api}/allocations``), which checks the user's balance and packs the
request onto the pool; the mixin then hands the chosen GPUs to the wrapped
spawner (:meth:`GPUPoolSpawner.apply_gpupool_allocation`), keeps the
allocation id in the server's state (key ``gpupool_allocation``) and gives the
GPUs back on ``stop`` and when ``poll`` finds the server gone.

One class, whole, with its helpers as objects it builds and holds: ``waits``, a
:class:`~.wait_loop.WaitLoop` (asking again while the pool says "wait"), and
``releases``, a :class:`~.release.ServerReleases` (this server's releases, sent
through the process's outbox until the service confirms each). Only the spawner
changes its own state: a confirmed release calls it back.

The lifecycle is a set of small public hooks so that any spawner can mix it in
(local processes, systemd, Kubernetes, a batch scheduler): ``select_profile``
→ ``apply_gpupool_profile`` → ``gpupool_allocate`` → ``apply_gpupool_allocation``
(→ ``gpupool_env``), all run by ``gpupool_prepare`` before the wrapped
spawner's ``start``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Mapping
from datetime import datetime, timezone
from typing import Any

from jupyterhub.spawner import Spawner
from traitlets import Bool, Float, List, Unicode, default, observe, validate

from ..profiles import InvalidOptions, Profile, choose_profile, default_profile, parse_profiles
from ..identity.spawner_token import SpawnerTokenError, spawner_token_from_config
from .client import (
    DEFAULT_API_URL, GPUPoolClient, ServiceError, ServiceUnavailable, api_url_from_config,
    unreachable_refusal,
)
from .ends import PolledEnd, WorkEnd
from .errors import GPUPoolRefused, SpawnFailure, confirm_by_post, for_viewer, invalid_options, still_stopping_refusal
from .form import gpupool_options_from_form, render_form
from .memory_hints import notice_file_env, share_memory_env
from .logs import install_refusal_log_filter
from .overrides import TraitOverrides
from .progress import ProgressLog
from .release import ATTEMPT_KEY, STATE_KEY, ServerReleases, new_attempt_key, outcome_unknown
from .wait_loop import WaitLoop
from .wait_rules import QUEUE_PENDING, start_timeout_for_waits

__all__ = ["STATE_KEY", "GPUPoolSpawner"]

class GPUPoolSpawner(Spawner):
    """Mixin: GPU profiles with prices, a balance check and packed GPUs from the gpupool service.

    Combine it with a concrete spawner, mixin first:
    ``class MySpawner(GPUPoolSpawner, LocalProcessSpawner)``.
    """

    profiles = List(
        [],
        help="""The server profiles users choose from, e.g.::

            c.GPUPoolSpawner.profiles = [
                {"slug": "cpu", "display_name": "CPU only", "cpu": 2, "memory": "4G", "default": True},
                {"slug": "quarter", "display_name": "1/4 RTX 3090", "gpu_fraction": 0.25, "models": ["RTX 3090"]},
                {"slug": "2x3090", "display_name": "2x RTX 3090", "gpus": 2, "models": ["RTX 3090"],
                 "cpu": 8, "memory": "32G"},
                {"slug": "a6000", "display_name": "RTX A6000 (1-2)", "gpus": 1, "max_gpus": 2,
                 "models": ["RTX A6000"]},
            ]

        Keys: slug, display_name, description, gpus | gpu_fraction, max_gpus,
        models, cpu, memory, default, spawner_override (see docs/spawner.md).
        A profile without gpus and gpu_fraction is CPU-only. Checked when the
        configuration loads; an error names the entry and the bad key. Empty
        (default): no options form, every server is CPU-only.
        """,
    ).tag(config=True)

    gpupool_service_name = Unicode(
        "gpupool", help="Name of the gpupool service in c.JupyterHub.services (used to derive URL and token)."
    ).tag(config=True)

    gpupool_api_url = Unicode(
        help=f"""Base URL of the gpupool service's REST API (ends in ``/api/v1``).

        Default: the service's own URL from its c.JupyterHub.services entry plus
        ``/services/<name>/api/v1`` (no proxy hop); else env ``GPUPOOL_API_URL``;
        else ``{DEFAULT_API_URL}``.
        """,
    ).tag(config=True)

    gpupool_server_api_url = Unicode(
        help="""The gpupool API URL given to single-user servers as ``GPUPOOL_API_URL``
        (the lab balance widget's server extension uses it). Default: gpupool_api_url.
        Set it when servers reach the service by another address than the hub does.""",
    ).tag(config=True)

    gpupool_api_token = Unicode(
        help="""The secret the spawner sends to the gpupool service (``Authorization: token …``).

        Its own secret, not a hub token, and never the service's ``api_token`` (the
        service refuses to start then). Leave it unset: the default is the service's
        c.GPUPoolService.spawner_token from the same configuration, else the secret in
        c.GPUPoolService.spawner_token_file (docs/spawner.md, "Tokens").""",
    ).tag(config=True)

    cpu_only_fail_open = Bool(
        True,
        help="""Whether CPU-only profiles start while the gpupool service is unreachable.

        GPU profiles always fail closed (no allocation, no GPUs). With False, a
        CPU-only start first checks that the service answers and is refused if not.""",
    ).tag(config=True)

    request_timeout = Float(10, help="Seconds each request to the gpupool service may take.").tag(config=True)
    mps_root = Unicode("/run/gpupool-mps", help="Where the node agents keep each GPU's MPS pipe directory "
                       "(c.GPUPoolAgent.mps_root); servers of 'mps' shares are pointed there.").tag(config=True)

    reclaim_wait = Float(
        300, help="""Seconds a spawn waits while the pool reclaims borrowed GPUs for it (team fair
        share, see docs/fairshare.md) before giving up; the spawn page says it is waiting.""",
    ).tag(config=True)

    form_template_paths = List(
        Unicode(),
        help="""Directories searched, in order, for the options form's template before the packaged one.

        Put a ``form.html`` in one of them to change the form (like KubeSpawner's
        ``additional_profile_form_template_paths``). It may begin with
        ``{% extends "gpupool/form.html" %}`` and replace only some blocks
        (``balance``, ``profile``, ``price``, ``gpus``). Values are HTML-escaped.
        The variables are listed at the top of
        gpupool_hub/spawner/templates/form.html; keep the field names
        ``profile`` and ``gpus--<slug>``. See docs/admin-guide.md.""",
    ).tag(config=True)

    notice_file = Unicode(
        "~/.gpupool/notice-{server}.json",
        help="""Where a server's pending stop is written, given to it as ``GPUPOOL_NOTICE_FILE``
        (``gpupool_hub.notice.deadline()`` reads it, see docs/user-guide.md). A path on the
        server's machine, as its user sees it: ``~`` is its home there; ``{server}`` is the
        server's name, quoted for a file name (``default`` for the default server). The
        single-user server's extension writes it. Empty: no variable, no file.""",
    ).tag(config=True)

    release_retry_interval = Float(
        5, help="""Seconds between attempts to send a release the gpupool service did not confirm
        (it was down or paused). The release is kept and sent until the service confirms it,
        with the time the server stopped, so the charge ends then.""",
    ).tag(config=True)

    release_wait = Float(
        3, help="""Seconds ``stop`` waits for the gpupool service to confirm a release before
        leaving it to be sent in the background (the charge ends at the stop time either way).""",
    ).tag(config=True)

    # --------------------------------------------------------------- state

    gpupool_profile: Profile | None = None
    gpupool_allocation_id: str | None = None  # kept in the server's state (STATE_KEY)
    gpupool_allocation: dict[str, Any] | None = None
    gpupool_attempt_key: str | None = None  # this spawn attempt's key (ATTEMPT_KEY in the state)
    _gpupool_starting = False
    _gpupool_form_choice: dict[str, Any] | None = None  # options of a GET the form shows instead of starting
    gpupool_refused_at: datetime | None = None  # the pool's last refusal: newer than a floor stop, the form keeps it
    gpupool_pending_start = False  # a batch job may wait after its GPUs are held: charged from its start

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gpupool_progress = ProgressLog()
        # the parts ask this spawner through small typed interfaces (WaitOwner, ReleaseOwner)
        self.waits = WaitLoop(self, self._gpupool_progress, self.log)
        self.releases = ServerReleases(self, self.release_retry_interval)
        self._gpupool_env: dict[str, str] = {}
        # two layers, undone in reverse: the allocation's settings sit on top of the profile's
        self.gpupool_profile_overrides = TraitOverrides(self)
        self.gpupool_allocation_overrides = TraitOverrides(self)
        self._gpupool_parsed = parse_profiles(self.profiles)
        # here, not in start(): the hub reads start_timeout as it schedules start(), before it runs.
        # What was configured stays the server's own start, once the wait is over (start()).
        self._gpupool_own_start_timeout = self.start_timeout
        self._gpupool_wait_start_timeout = start_timeout_for_waits(self.config, self.start_timeout, self.log)
        self.start_timeout = self._gpupool_wait_start_timeout
        install_refusal_log_filter(self.log)  # the pool saying no is INFO, not an ERROR with a traceback

    # -------------------------------------------------------------- traits

    @validate("profiles")
    def _validate_profiles(self, proposal: Any) -> list:  # type: ignore[type-arg]
        parse_profiles(proposal["value"])
        return proposal["value"]

    @observe("profiles")
    def _profiles_changed(self, change: Any) -> None:
        self._gpupool_parsed = parse_profiles(change["new"])

    @default("gpupool_api_url")
    def _default_api_url(self) -> str:
        return api_url_from_config(self.config, self.gpupool_service_name)

    @default("gpupool_server_api_url")
    def _default_server_api_url(self) -> str:
        return self.gpupool_api_url

    @default("gpupool_api_token")
    def _default_api_token(self) -> str:
        try:
            return spawner_token_from_config(self.config)
        except SpawnerTokenError as e:  # the service then answers 401, and the spawn fails saying so
            self.log.error("No token for the gpupool service: %s", e)
            return ""

    @default("options_form")
    def _gpupool_options_form_default(self) -> Any:
        return self._render_gpupool_form if self.profiles else ""

    @default("options_from_form")
    def _gpupool_options_from_form_default(self) -> Any:
        return gpupool_options_from_form

    @property
    def pending(self) -> str | None:  # type: ignore[override]
        """JupyterHub's pending event, but ``"queue"`` while this spawn waits in the pool's queue:
        the hub counts only ``"spawn"`` against ``concurrent_spawn_limit``, and a server waiting
        an hour for a GPU must not lock everyone else out of starting (see wait_rules.hub_answered_at)."""
        state = super().pending
        return QUEUE_PENDING if state == "spawn" and self.waits.queued else state

    def options_from_query(self, query_data: dict[str, Any]) -> dict[str, Any]:
        """A link (``/hub/spawn?profile=cpu``) starts only a free CPU-only profile: the browser sends
        the hub's cookie on a cross-site GET too. For a paid one, raising makes JupyterHub render
        the form, the link's choice preselected; its POST carries the xsrf token (docs/spawner.md)."""
        options = gpupool_options_from_form({k: v if isinstance(v, list) else [v] for k, v in query_data.items()})
        profile, _ = self.select_profile(options)  # an invalid choice: the form with the error
        if profile is not None and profile.needs_gpu:
            self._gpupool_form_choice = options  # the form rendered next (same request) preselects it
            raise confirm_by_post()
        return options

    # ------------------------------------------------------------ profiles

    @property
    def gpupool_profiles(self) -> list[Profile]:
        return self._gpupool_parsed

    def default_profile(self) -> Profile | None:
        return default_profile(self.gpupool_profiles)

    def select_profile(self, user_options: Mapping[str, Any] | None) -> tuple[Profile | None, int]:
        """The profile and whole-GPU count ``user_options`` ask for, or HTTP 400 "Invalid user options"."""
        try:
            return choose_profile(self.gpupool_profiles, user_options)
        except InvalidOptions as e:
            raise invalid_options(str(e)) from None

    def apply_gpupool_profile(self, profile: Profile | None) -> None:
        """Profile resources onto the spawner's own traits (limits, overrides).

        The previous spawn's profile and allocation are undone first: a server
        restarted with another profile must not keep the old limits or overrides.
        """
        self.gpupool_allocation_overrides.restore()
        self.gpupool_profile_overrides.restore()
        if profile is None:
            return
        values: dict[str, Any] = {}
        if profile.cpu is not None:
            values["cpu_limit"] = values["cpu_guarantee"] = profile.cpu
        if profile.memory is not None:
            values["mem_limit"] = values["mem_guarantee"] = profile.memory
        values.update(profile.spawner_override)
        missing = self.gpupool_profile_overrides.missing(values)
        if missing:
            raise GPUPoolRefused(
                f"Profile {profile.slug!r} overrides {missing[0]!r}, which {type(self).__name__} does not have; "
                "ask an admin to fix c.GPUPoolSpawner.profiles.",
                reason=SpawnFailure.CONFIG, status_code=500,
            )
        self.gpupool_profile_overrides.set(values)

    # ------------------------------------------------------------- service

    @property
    def gpupool_client(self) -> GPUPoolClient:
        """A client for the service with the current URL, token and timeout (cheap to make)."""
        return GPUPoolClient(self.gpupool_api_url, self.gpupool_api_token, self.request_timeout, log=self.log)

    async def gpupool_request(self, method: str, path: str, body: Any = None,
                              params: Mapping[str, str] | None = None) -> tuple[int, Any]:
        """One call to the service: ``(status, json)``; raises ``ServiceUnavailable`` when unreachable."""
        return await self.gpupool_client.request(method, path, body, params)

    def gpupool_server(self) -> tuple[str, str]:
        """(user, server name) of this server, as the service knows it."""
        return self.user.name, self.name or ""

    def _groups(self) -> list[str]:
        try:
            return sorted(g.name for g in (self.user.groups or []))
        except Exception:
            return []

    async def gpupool_allocate(self, profile: Profile, gpus: int) -> dict[str, Any]:
        """Ask the pool for ``gpus`` of ``profile``: the allocation, or :class:`GPUPoolRefused`."""
        return await self.gpupool_client.allocate(
            self.user.name, self.name or "", self._groups(), profile.request(gpus), profile.describe(gpus),
            key=self.gpupool_attempt_key, pending=self.gpupool_pending_start,
        )

    # --------------------------------------------------------- environment

    def gpupool_env(self, allocation: dict[str, Any] | None) -> dict[str, str]:
        """Variables for the single-user server; local spawners pin the GPUs by UUID
        (a MIG instance by its own ``MIG-…`` UUID: CUDA then sees only that instance)."""
        env = {"GPUPOOL_API_URL": self.gpupool_server_api_url, **notice_file_env(self.notice_file, self.name)}
        if self.gpupool_profile is not None:
            env["GPUPOOL_PROFILE"] = self.gpupool_profile.slug
        if allocation:
            uuids = ",".join(g.get("mig_uuid") or g["uuid"] for g in allocation.get("gpus", []))
            env["CUDA_VISIBLE_DEVICES"] = uuids
            env["NVIDIA_VISIBLE_DEVICES"] = uuids
            env["GPUPOOL_ALLOCATION"] = allocation["id"]
            env["GPUPOOL_NODE"] = allocation.get("node", "")
            env.update(share_memory_env(allocation, self.mps_root))  # a fraction: keep to its memory
        else:  # a CPU-only server must not use GPUs the pool may hand to someone else
            env["CUDA_VISIBLE_DEVICES"] = ""
            env["NVIDIA_VISIBLE_DEVICES"] = "none"
        return env

    def apply_gpupool_allocation(self, allocation: dict[str, Any] | None) -> None:
        """Hook for the wrapped spawner: turn the allocation into its settings (env here).

        The previous allocation's trait settings are undone first. Subclasses
        call ``super()`` and then set traits through
        ``self.gpupool_allocation_overrides.set({...})``, so that the next
        spawn (another node, or no GPU) starts from the admin's values.
        """
        self.gpupool_allocation_overrides.restore()
        self._gpupool_env = self.gpupool_env(allocation)

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        env.update(self._gpupool_env)
        return env

    # ----------------------------------------------------------- lifecycle

    def gpupool_check_user(self) -> None:
        """Refuse (403) a user this spawner cannot run a server for, before anything is asked or run.

        Nothing here: a Kubernetes pod does not run as the hub's user name. Spawners that make the
        name a Unix account, a command argument or a unit name override it with
        ``errors.require_unix_account`` / ``require_login_name`` (the rule: ``gpupool_hub.identity.unix``).
        """

    async def gpupool_prepare(self) -> None:
        """Everything ``start`` does before the wrapped spawner starts the server."""
        progress = self._gpupool_progress
        progress.reset()
        self.gpupool_new_attempt()  # first: a failure from here on abandons this attempt, never an earlier one
        self.gpupool_allocation = None
        try:
            self.gpupool_check_user()  # before the pool is asked: a refused name holds and costs nothing
            profile, gpus = self.select_profile(self.user_options)
            self.gpupool_profile = profile
            self.apply_gpupool_profile(profile)
            # JupyterHub clears the stored state at every spawn, so the id is kept in
            # memory: whatever this server still holds goes back before asking again,
            # and every release of this server still waiting for the service is sent first.
            if self.gpupool_allocation_id:
                await self.gpupool_release("server restarting", wait=0)
            flushed = await self.releases.flush(self.request_timeout)  # False: the service does not answer
            if not flushed and (work := self.releases.still_stopping()):
                raise still_stopping_refusal(work)
            if profile is not None and profile.needs_gpu:
                if not flushed:
                    raise unreachable_refusal(profile.describe(gpus))
                try:
                    allocation = await self.waits.get_gpus(profile, gpus, self.start_timeout, self.reclaim_wait,
                                                           getattr(self, "handler", None))
                except GPUPoolRefused as e:  # the form keeps the refused choice (form.preselected)
                    self.gpupool_refused_at = datetime.now(timezone.utc)
                    raise for_viewer(e, getattr(self, "handler", None))
                self.gpupool_allocation_id, self.gpupool_allocation = allocation["id"], allocation
                self.apply_gpupool_allocation(allocation)
            else:
                if not self.cpu_only_fail_open and not await self.gpupool_client.ping():
                    raise GPUPoolRefused(
                        "The GPU pool service is not reachable and this hub does not start servers without it; "
                        "try again in a minute.", reason=SpawnFailure.UNREACHABLE, status_code=503,
                    )
                if profile is not None:
                    progress.add(20, f"{profile.display_name}: no GPU needed")
                self.apply_gpupool_allocation(None)
        finally:
            progress.finish()

    # ------------------------------------------------------------ releases

    @property
    def gpupool_attempt_abandoned(self) -> bool:
        """Whether the current spawn attempt was given up (its release by key is sent or on its way)."""
        return self.releases.abandoned(self.gpupool_attempt_key)

    def gpupool_new_attempt(self) -> str:
        """A spawn begins: a fresh key for its ``POST`` (and the retries of it)."""
        self.gpupool_attempt_key = new_attempt_key()
        return self.gpupool_attempt_key

    def gpupool_released(self, alloc_id: str | None) -> None:
        """The service confirmed a release of ``alloc_id``: no longer held, unless a newer one is."""
        if alloc_id is not None and self.gpupool_allocation_id == alloc_id:
            self.gpupool_allocation_id = None
            self.gpupool_allocation = None

    async def gpupool_release(self, reason: str, stopped_at: datetime | None = None,
                              wait: float | None = None, end: WorkEnd | None = None) -> bool:
        """Give the held allocation back; True once the service confirmed (or never knew it).

        ``stopped_at`` is when the server stopped (default: now); the service
        ends the charge then even if the release reaches it later. Waits up to
        ``wait`` s (default ``release_wait``); an unconfirmed release stays in
        the outbox, and the id in the state, until the service confirms.
        """
        alloc = self.gpupool_allocation_id
        if not alloc:
            return True
        return await self.releases.release(alloc, reason, stopped_at or datetime.now(timezone.utc),
                                           self.release_wait if wait is None else wait, end)

    async def gpupool_abandon(self, reason: str, wait: float = 0, end: WorkEnd | None = None) -> bool:
        """Give up on the current spawn attempt: whatever its key got is released, never charged,
        and the key's ``POST`` is refused if it still arrives. Sent in the background by default
        (``wait`` 0): a spawn that failed must not also wait for a service that does not answer."""
        key = self.gpupool_attempt_key
        if key is None:
            return await self.gpupool_release(reason, wait=wait, end=end)
        return await self.releases.abandon(key, (self.gpupool_allocation or {}).get("id"), reason, wait, end)

    def gpupool_work_end(self) -> WorkEnd:
        """This server's work, built at a stop before the hub clears the state: its GPUs go back only
        once it ended (``spawner/ends.py``). Here the wrapped spawner's poll and stop (a unit, a pod)."""
        wrapped = super()
        return PolledEnd(f"the server of {self._log_name}", wrapped.poll, functools.partial(wrapped.stop, now=True))

    # ----------------------------------------------------- JupyterHub's calls

    async def start(self) -> Any:
        """Ask the pool, then start the server; a spawn that fails or is cancelled (the hub's
        ``start_timeout``) abandons its attempt, so whatever it got is released, never charged."""
        self._gpupool_starting = True
        try:
            await self.gpupool_prepare()
            # the wait is over: the server's own start gets what was configured (batchspawner and
            # KubeSpawner read start_timeout while they start), not the hour a queued spawn may wait
            own = self._gpupool_own_start_timeout
            self.start_timeout = own
            try:
                return await asyncio.wait_for(super().start(), own)
            except asyncio.TimeoutError:
                raise TimeoutError(f"The server did not start within {own:g} s of getting its GPUs "
                                   "(c.Spawner.start_timeout); they are released.") from None
        except BaseException as e:
            if outcome_unknown(e, self.gpupool_allocation):
                await self.gpupool_abandon(f"spawn abandoned: {type(e).__name__}")
            raise
        finally:
            self._gpupool_starting = False
            self.start_timeout = self._gpupool_wait_start_timeout  # the hub reads it at the next spawn

    async def stop(self, now: bool = False) -> None:
        """Stop the server; its charge ends now, even if the service only hears of it later, or once its
        work was seen to end. A stop while the spawn is still going, or of a server the hub gave up on
        (``http_timeout``), abandons the attempt: never charged. A waiting spawn leaves the queue."""
        await self.waits.stop()
        end = self.gpupool_work_end()  # before the hub clears the state: which job, which process
        try:
            await super().stop(now=now)
        finally:  # a stop that failed (scancel while slurmctld is down) releases nothing until the work ended
            given_up = self._gpupool_starting or getattr(self, "_waiting_for_response", False)
            if given_up or self.gpupool_attempt_abandoned:
                await self.gpupool_abandon("the hub gave up on the spawn", end=end)
            else:
                await self.gpupool_release("server stopped", stopped_at=datetime.now(timezone.utc), end=end)

    async def poll(self) -> int | None:
        status = await super().poll()
        if status is not None and self.gpupool_allocation_id and not self._gpupool_starting:
            await self.gpupool_release(f"server gone (exit status {status})", stopped_at=datetime.now(timezone.utc))
        return status

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.gpupool_allocation_id:
            state[STATE_KEY] = self.gpupool_allocation_id
        if self.gpupool_attempt_key:
            state[ATTEMPT_KEY] = self.gpupool_attempt_key
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        if state.get(STATE_KEY):
            self.gpupool_allocation_id = state[STATE_KEY]
        if state.get(ATTEMPT_KEY):
            self.gpupool_attempt_key = state[ATTEMPT_KEY]

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """Where the GPUs are (or why not), then the wrapped spawner's own progress."""
        async for event in self._gpupool_progress.stream():
            yield event
        async for event in super().progress():
            yield event

    def clear_state(self) -> None:
        """Reset this spawn's progress; the allocation id is deliberately kept.

        JupyterHub clears state before every start and after every stop (and
        LocalProcessSpawner.poll does when the process is gone); the id is
        dropped only once the service confirms the release, so a later start
        can still give back GPUs a failed release left behind.
        """
        super().clear_state()
        self._gpupool_progress.reset()

    # ---------------------------------------------------------------- form

    async def gpupool_account(self) -> dict[str, Any] | None:
        """The user's ``me`` view from the service (balance, floor, credits), or None."""
        try:
            return await self.gpupool_client.account(self.user.name)
        except (ServiceUnavailable, ServiceError) as e:
            self.log.warning("Balance for the options form unavailable: %s", e)
            return None

    async def gpupool_catalog(self) -> dict[str, Any] | None:
        """The pool's GPU models with prices and free GPUs (``GET /models``), or None."""
        try:
            return await self.gpupool_client.catalog()
        except (ServiceUnavailable, ServiceError) as e:
            self.log.warning("Prices for the options form unavailable: %s", e)
            return None

    async def _render_gpupool_form(self, spawner: Spawner | None = None) -> str:
        """The form, with the user's balance and the pool's prices asked for at the same time."""
        linked, self._gpupool_form_choice = self._gpupool_form_choice, None  # for this rendering only
        account, catalog = await asyncio.gather(self.gpupool_account(), self.gpupool_catalog())
        return render_form(self, account, catalog, linked)

