"""GPUPoolSpawner: priced GPU profiles, a balance check and packed placement for JupyterHub.

The spawner half of gpupool_hub. It never decides placement or money itself:
on ``start`` it asks the gpupool service (``POST {api}/allocations``), which
checks the user's balance and packs the request onto the pool; the spawner
then hands the chosen GPUs to the single-user server, keeps the allocation id
in the server's state (key ``gpupool_allocation``) and gives the GPUs back on
``stop`` and when ``poll`` finds the server gone.

``GPUPoolSpawner`` is a mixin (a :class:`jupyterhub.spawner.Spawner` subclass
that calls ``super()`` everywhere); the ready classes combine it with a real
spawner:

=========================== ======================== ==============================
class                       entry point name          base
=========================== ======================== ==============================
GPUPoolLocalProcessSpawner  ``gpupool-localprocess``  LocalProcessSpawner
GPUPoolSimpleSpawner        ``gpupool-simple``        SimpleLocalProcessSpawner
GPUPoolSystemdSpawner       ``gpupool-systemd``       systemdspawner (extra)
GPUPoolKubeSpawner          ``gpupool-kubernetes``    KubeSpawner (extra)
=========================== ======================== ==============================

Configure with ``c.GPUPoolSpawner.profiles = [...]``; see docs/spawner.md.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import quote, urlencode

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner, SpawnException, Spawner
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Bool, Float, List, Unicode, default, observe, validate
from traitlets.config import LazyConfigValue

from .profiles import (  # noqa: F401 - re-exported: gpupool_hub.spawner.parse_profiles is documented
    MAX_GPUS, PROFILE_KEYS, InvalidOptions, Profile, choose_profile, default_profile, parse_memory, parse_profile,
    parse_profiles,
)
from .profiles import format_decimal as _fmt

__all__ = [
    "GPUPoolLocalProcessSpawner", "GPUPoolRefused", "GPUPoolSimpleSpawner", "GPUPoolSpawner",
    "GPUPoolSpawnerMixin", "Profile", "parse_profiles",
]

STATE_KEY = "gpupool_allocation"
DEFAULT_API_URL = "http://127.0.0.1:10101/services/gpupool/api/v1"

# ---------------------------------------------------------------- refusals


class GPUPoolRefused(SpawnException):
    """A spawn the pool said no to, shown on the spawn page and in the progress stream.

    JupyterHub 6.1's progress page only shows ``jupyterhub_message`` /
    ``jupyterhub_html_message`` of the exception, so both are set.
    """

    def __init__(self, message: str, *, reason: str, status_code: int = 400, message_html: str = "",
                 details: Mapping[str, Any] | None = None, retry_at: str | None = None) -> None:
        html_message = message_html or html.escape(message)
        super().__init__(message, reason=reason, message_html=html_message, status_code=status_code)
        self.log_message = message.replace("%", "%%")  # tornado formats it with its (empty) args
        self.jupyterhub_message = message
        self.jupyterhub_html_message = html_message
        self.details = dict(details or {})
        self.retry_at = retry_at

    def __str__(self) -> str:
        return self.message


def invalid_options(message: str) -> web.HTTPError:
    """JupyterHub's 400 "Invalid user options", with the reason after the colon."""
    text = f"Invalid user options: {message}"
    err = web.HTTPError(400, "%s", text)
    err.jupyterhub_message = text  # type: ignore[attr-defined]
    return err


# ------------------------------------------------------------------ mixin


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
        help="""Token the spawner sends to the gpupool service (``Authorization: token …``).

        It must be the service's own ``api_token`` from its c.JupyterHub.services entry
        (the example configuration sets both from one variable). Default: env
        ``GPUPOOL_API_TOKEN``, else that services entry's ``api_token``.""",
    ).tag(config=True)

    cpu_only_fail_open = Bool(
        True,
        help="""Whether CPU-only profiles start while the gpupool service is unreachable.

        GPU profiles always fail closed (no allocation, no GPUs). With False, a
        CPU-only start first checks that the service answers and is refused if not.""",
    ).tag(config=True)

    request_timeout = Float(10, help="Seconds each request to the gpupool service may take.").tag(config=True)

    reclaim_wait = Float(
        300, help="""Seconds a spawn waits while the pool reclaims borrowed GPUs for it (team fair
        share, see docs/fairshare.md) before giving up; the spawn page says it is waiting.""",
    ).tag(config=True)

    # --------------------------------------------------------------- state

    gpupool_allocation_id: str | None = None
    gpupool_allocation: dict[str, Any] | None = None
    gpupool_profile: Profile | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gpupool_starting = False
        self._gpupool_events: list[dict[str, Any]] = []
        self._gpupool_done = False
        self._gpupool_signal: asyncio.Event | None = None
        self._gpupool_env: dict[str, str] = {}
        self._gpupool_saved: dict[str, Any] = {}
        self._gpupool_parsed = parse_profiles(self.profiles)

    # -------------------------------------------------------------- traits

    @validate("profiles")
    def _validate_profiles(self, proposal: Any) -> list:  # type: ignore[type-arg]
        parse_profiles(proposal["value"])
        return proposal["value"]

    def _services_entry(self) -> dict[str, Any] | None:
        try:
            services = self.config.get("JupyterHub", {}).get("services", [])
            if isinstance(services, LazyConfigValue):
                services = services.get_value([])
        except Exception:  # an odd config object: fall back to the other sources
            return None
        for entry in services or []:
            if isinstance(entry, Mapping) and entry.get("name") == self.gpupool_service_name:
                return dict(entry)
        return None

    @default("gpupool_api_url")
    def _default_api_url(self) -> str:
        entry = self._services_entry()
        if entry and entry.get("url"):
            base_url = self.config.get("JupyterHub", {}).get("base_url", "/")
            if not isinstance(base_url, str):
                base_url = "/"
            prefix = "/" + "/".join(p for p in (base_url.strip("/"), "services", self.gpupool_service_name) if p)
            return str(entry["url"]).rstrip("/") + prefix + "/api/v1"
        return os.environ.get("GPUPOOL_API_URL") or DEFAULT_API_URL

    @default("gpupool_server_api_url")
    def _default_server_api_url(self) -> str:
        return self.gpupool_api_url

    @default("gpupool_api_token")
    def _default_api_token(self) -> str:
        env = os.environ.get("GPUPOOL_API_TOKEN")
        if env:
            return env
        entry = self._services_entry()
        return str(entry.get("api_token") or "") if entry else ""

    @default("options_form")
    def _gpupool_options_form_default(self) -> Any:
        return self._render_gpupool_form if self.profiles else ""

    @default("options_from_form")
    def _gpupool_options_from_form_default(self) -> Any:
        return gpupool_options_from_form

    def options_from_query(self, query_data: dict[str, Any]) -> dict[str, Any]:
        """``/hub/spawn?profile=2x3090`` works like the form (values arrive as lists of strings)."""
        return gpupool_options_from_form(
            {k: v if isinstance(v, list) else [v] for k, v in query_data.items()}
        )

    # ------------------------------------------------------------ profiles

    @observe("profiles")
    def _profiles_changed(self, change: Any) -> None:
        self._gpupool_parsed = parse_profiles(change["new"])

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
        """Profile resources onto the spawner's own traits (limits, overrides)."""
        # undo the previous spawn's profile: a server restarted with another
        # profile must not keep the old limits or overrides
        for name, value in self._gpupool_saved.items():
            setattr(self, name, value)
        self._gpupool_saved = {}
        if profile is None:
            return
        values: dict[str, Any] = {}
        if profile.cpu is not None:
            values["cpu_limit"] = values["cpu_guarantee"] = profile.cpu
        if profile.memory is not None:
            values["mem_limit"] = values["mem_guarantee"] = profile.memory
        values.update(profile.spawner_override)
        for name, value in values.items():
            if not self.has_trait(name):
                raise GPUPoolRefused(
                    f"Profile {profile.slug!r} overrides {name!r}, which {type(self).__name__} does not have; "
                    "ask an admin to fix c.GPUPoolSpawner.profiles.",
                    reason="gpupool_config", status_code=500,
                )
            self._gpupool_saved.setdefault(name, getattr(self, name))
            setattr(self, name, value)

    # ------------------------------------------------------------- service

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.gpupool_api_token:
            headers["Authorization"] = f"token {self.gpupool_api_token}"
        return headers

    async def gpupool_request(self, method: str, path: str, body: Any = None,
                              params: Mapping[str, str] | None = None) -> tuple[int, Any]:
        """One call to the service: ``(status, json)``; raises ``OSError``-like errors when unreachable."""
        url = self.gpupool_api_url.rstrip("/") + path
        if params:
            url += "?" + urlencode(params)
        req = HTTPRequest(
            url, method=method, headers=self._headers(),
            body=json.dumps(body) if body is not None else None,
            request_timeout=self.request_timeout, connect_timeout=self.request_timeout,
            allow_nonstandard_methods=True,
        )
        try:
            resp = await AsyncHTTPClient().fetch(req, raise_error=False)
        except HTTPClientError as e:  # pragma: no cover - raise_error=False
            resp = e.response
            if resp is None:
                raise ServiceUnavailable(str(e)) from None
        except (OSError, asyncio.TimeoutError) as e:
            raise ServiceUnavailable(str(e) or type(e).__name__) from None
        if resp.code == 599:
            raise ServiceUnavailable(str(resp.error or "no response"))
        try:
            data = json.loads(resp.body) if resp.body else None
        except ValueError:
            data = {"message": resp.body[:300].decode("utf8", "replace")}
        return resp.code, data

    def _groups(self) -> list[str]:
        try:
            return sorted(g.name for g in (self.user.groups or []))
        except Exception:
            return []

    async def gpupool_allocate(self, profile: Profile, gpus: int) -> dict[str, Any]:
        body = {"user": self.user.name, "server": self.name or "", "groups": self._groups(),
                "request": profile.request(gpus)}
        what = profile.describe(gpus)
        try:
            status, data = await self.gpupool_request("POST", "/allocations", body)
        except ServiceUnavailable as e:
            self.log.error("gpupool service unreachable at %s: %s", self.gpupool_api_url, e)
            raise GPUPoolRefused(
                f"The GPU pool service is not reachable right now, so no GPU server can start "
                f"(requested {what}). Try again in a minute, or choose a CPU-only profile.",
                reason="gpupool_unreachable", status_code=503,
            ) from None
        data = data if isinstance(data, dict) else {}
        if status == 201 and data.get("allocated"):
            return data["allocation"]
        if status == 409:
            reason = str(data.get("reason") or "refused")
            message = str(data.get("message") or f"The GPU pool refused {what}.")
            codes = {"insufficient_balance": 403, "no_capacity": 503, "model_unavailable": 400, "reclaiming": 503}
            titles = {"insufficient_balance": "Not enough tokens", "no_capacity": "No GPU capacity",
                      "reclaiming": "Waiting for borrowed GPUs to be reclaimed",
                      "model_unavailable": "GPU model unavailable"}
            html_msg = (f"<strong>{html.escape(titles.get(reason, 'Refused by the GPU pool'))}.</strong> "
                        f"{html.escape(message)}")
            raise GPUPoolRefused(message, reason=reason, status_code=codes.get(reason, 409),
                                 message_html=html_msg, details=data.get("details"), retry_at=data.get("retry_at"))
        detail = str(data.get("message") or "")[:300]
        if status in (401, 403):
            self.log.error("gpupool service rejected the spawner's token (%s): %s; check "
                           "c.GPUPoolSpawner.gpupool_api_token", status, detail)
            raise GPUPoolRefused(
                "The hub is not allowed to use the GPU pool service (misconfigured token); please tell an admin.",
                reason="gpupool_auth", status_code=500,
            )
        if status == 400:
            raise GPUPoolRefused(f"The GPU pool cannot place {what}: {detail}", reason="gpupool_bad_request",
                                 status_code=400)
        self.log.error("gpupool service answered %s to POST /allocations: %s", status, detail)
        raise GPUPoolRefused(
            f"The GPU pool service failed (HTTP {status}); no GPU server can start right now. Try again shortly.",
            reason="gpupool_unreachable", status_code=503,
        )

    async def _gpupool_allocate_waiting(self, profile: Profile, gpus: int) -> dict[str, Any]:
        """Allocate; while the pool reclaims borrowed GPUs for this server, say so and retry."""
        loop = asyncio.get_event_loop()
        give_up = loop.time() + self.reclaim_wait
        while True:
            try:
                return await self.gpupool_allocate(profile, gpus)
            except GPUPoolRefused as e:
                if e.reason != "reclaiming" or loop.time() >= give_up:
                    raise
                wait = 2.0
                if e.retry_at:
                    try:
                        at = datetime.fromisoformat(e.retry_at.replace("Z", "+00:00"))
                        wait = (at - datetime.now(timezone.utc)).total_seconds() + 0.5
                    except ValueError:
                        pass
                wait = min(max(wait, 0.5), 10.0, max(give_up - loop.time(), 0.5))
                self._event(20, f"Waiting for borrowed GPUs to be reclaimed: {e.message}")
                await asyncio.sleep(wait)

    async def gpupool_release(self, reason: str) -> bool:
        """Give the held allocation back; True when the service confirmed (or never knew it)."""
        alloc = self.gpupool_allocation_id
        if not alloc:
            return True
        try:
            status, data = await self.gpupool_request(
                "DELETE", f"/allocations/{quote(alloc, safe='')}", params={"reason": reason[:200]}
            )
        except ServiceUnavailable as e:
            self.log.warning("Could not release GPU allocation %s of %s (%s); the service's reconcile job "
                             "will release it once the server is gone", alloc, self._log_name, e)
            return False
        if status in (200, 404):
            self.log.info("Released GPU allocation %s of %s (%s)", alloc, self._log_name, reason)
            if self.gpupool_allocation_id == alloc:
                self.gpupool_allocation_id = None
                self.gpupool_allocation = None
                self._gpupool_env = {}
            return True
        self.log.warning("Releasing GPU allocation %s of %s: HTTP %s %s", alloc, self._log_name, status,
                         (data or {}).get("message") if isinstance(data, dict) else data)
        return False

    async def gpupool_check_reachable(self) -> bool:
        try:
            status, _ = await self.gpupool_request("GET", "/")
        except ServiceUnavailable:
            return False
        return status < 500

    # ------------------------------------------------------------ progress

    def _event(self, progress: int, message: str, html_message: str | None = None) -> None:
        event: dict[str, Any] = {"progress": progress, "message": message}
        if html_message:
            event["html_message"] = html_message
        self._gpupool_events.append(event)
        if self._gpupool_signal is not None:
            self._gpupool_signal.set()

    async def progress(self):  # type: ignore[no-untyped-def]
        """Where the GPUs are (or why not), then the wrapped spawner's own progress."""
        events: list[dict[str, Any]] | None = None
        sent = 0
        while True:
            if self._gpupool_events is not events:
                events, sent = self._gpupool_events, 0
            while sent < len(events):
                yield events[sent]
                sent += 1
            if self._gpupool_done:
                break
            if self._gpupool_signal is None:
                self._gpupool_signal = asyncio.Event()
            self._gpupool_signal.clear()
            try:
                await asyncio.wait_for(self._gpupool_signal.wait(), timeout=1)
            except asyncio.TimeoutError:
                pass
        async for event in super().progress():
            yield event

    # --------------------------------------------------------- environment

    def gpupool_env(self, allocation: dict[str, Any] | None) -> dict[str, str]:
        """Variables for the single-user server; local spawners pin the GPUs by UUID."""
        env = {"GPUPOOL_API_URL": self.gpupool_server_api_url}
        if self.gpupool_profile is not None:
            env["GPUPOOL_PROFILE"] = self.gpupool_profile.slug
        if allocation:
            uuids = ",".join(g["uuid"] for g in allocation.get("gpus", []))
            env["CUDA_VISIBLE_DEVICES"] = uuids
            env["NVIDIA_VISIBLE_DEVICES"] = uuids
            env["GPUPOOL_ALLOCATION"] = allocation["id"]
            env["GPUPOOL_NODE"] = allocation.get("node", "")
        else:  # a CPU-only server must not use GPUs the pool may hand to someone else
            env["CUDA_VISIBLE_DEVICES"] = ""
            env["NVIDIA_VISIBLE_DEVICES"] = "none"
        return env

    def apply_gpupool_allocation(self, allocation: dict[str, Any] | None) -> None:
        """Hook for the wrapped spawner: turn the allocation into its settings (env here)."""
        self._gpupool_env = self.gpupool_env(allocation)

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        env.update(self._gpupool_env)
        return env

    # ----------------------------------------------------------- lifecycle

    async def gpupool_prepare(self) -> None:
        """Everything ``start`` does before the wrapped spawner starts the server."""
        self._gpupool_events = []
        self._gpupool_done = False
        try:
            profile, gpus = self.select_profile(self.user_options)
            self.gpupool_profile = profile
            self.apply_gpupool_profile(profile)
            # JupyterHub clears the stored state at every spawn, so the id is kept in
            # memory: whatever this server still holds goes back before asking again.
            if self.gpupool_allocation_id:
                await self.gpupool_release("server restarting")
            if profile is not None and profile.needs_gpu:
                self._event(10, f"Asking the GPU pool for {profile.describe(gpus)}…")
                try:
                    allocation = await self._gpupool_allocate_waiting(profile, gpus)
                except GPUPoolRefused as e:
                    self._event(100, f"Refused: {e.message}", e.jupyterhub_html_message)
                    raise
                self.gpupool_allocation_id = allocation["id"]
                self.gpupool_allocation = allocation
                where = allocation.get("description") or f"{allocation.get('node')}"
                self.log.info("GPUs for %s: %s (allocation %s)", self._log_name, where, allocation["id"])
                if allocation.get("borrowed"):
                    self._event(40, f"GPUs allocated (borrowed: your team is over its quota, so they may be "
                                    f"reclaimed when another team needs them): {where}")
                else:
                    self._event(40, f"GPUs allocated: {where}")
                self.apply_gpupool_allocation(allocation)
            else:
                if not self.cpu_only_fail_open and not await self.gpupool_check_reachable():
                    raise GPUPoolRefused(
                        "The GPU pool service is not reachable and this hub does not start servers without it; "
                        "try again in a minute.", reason="gpupool_unreachable", status_code=503,
                    )
                if profile is not None:
                    self._event(20, f"{profile.display_name}: no GPU needed")
                self.apply_gpupool_allocation(None)
        finally:
            self._gpupool_done = True
            if self._gpupool_signal is not None:
                self._gpupool_signal.set()

    async def start(self):  # type: ignore[no-untyped-def]
        self._gpupool_starting = True
        try:
            await self.gpupool_prepare()
            try:
                return await super().start()
            except BaseException:
                await self.gpupool_release("server failed to start")
                raise
        finally:
            self._gpupool_starting = False

    async def stop(self, now: bool = False) -> None:
        try:
            await super().stop(now=now)
        finally:
            await self.gpupool_release("server stopped")

    async def poll(self):  # type: ignore[no-untyped-def]
        status = await super().poll()
        if status is not None and self.gpupool_allocation_id and not self._gpupool_starting:
            await self.gpupool_release(f"server gone (exit status {status})")
        return status

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.gpupool_allocation_id:
            state[STATE_KEY] = self.gpupool_allocation_id
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        if state.get(STATE_KEY):
            self.gpupool_allocation_id = state[STATE_KEY]

    def clear_state(self) -> None:
        """Reset this spawn's progress; the allocation id is deliberately kept.

        JupyterHub clears state before every start and after every stop (and
        LocalProcessSpawner.poll does when the process is gone); the id is
        dropped only once the service confirms the release, so a later start
        can still give back GPUs a failed release left behind.
        """
        super().clear_state()
        self._gpupool_events = []
        self._gpupool_done = False

    # ---------------------------------------------------------------- form

    async def gpupool_account(self) -> dict[str, Any] | None:
        """The user's ``me`` view from the service (balance, floor, credits), or None."""
        try:
            status, data = await self.gpupool_request("GET", f"/users/{quote(self.user.name, safe='')}")
        except ServiceUnavailable as e:
            self.log.warning("Balance for the options form unavailable: %s", e)
            return None
        return data if status == 200 and isinstance(data, dict) else None

    def profile_prices(self, profile: Profile) -> list[tuple[str, Decimal]] | None:
        """``[(pool model, tokens per hour)]`` for the profile's base request; [] if no pool model fits."""
        if not profile.needs_gpu:
            return None
        table, models = _pool_prices(self.config)
        out = []
        for model in models:
            if profile.models and not any(_model_ok(name, model) for name in profile.models):
                continue
            try:
                out.append((model, table.price_per_hour(model, profile.gpu_amount)))
            except Exception:
                continue
        return sorted(out, key=lambda mp: (mp[1], mp[0]))

    async def _render_gpupool_form(self, spawner: Spawner | None = None) -> str:
        account = await self.gpupool_account()
        return render_form(self, account)


class ServiceUnavailable(Exception):
    """The gpupool service did not answer (connection refused, timeout)."""


GPUPoolSpawnerMixin = GPUPoolSpawner


def _model_ok(name: str, model: str) -> bool:
    from .pricing import model_matches

    return model_matches(name, model) or name.strip().lower() == model.strip().lower()


_PRICE_CACHE: dict[str, Any] = {}


def _pool_prices(config: Any) -> tuple[Any, list[str]]:
    """Price table and pool GPU models from ``c.GPUPool`` (cached per configuration)."""
    from .config import GPUPool

    pool = GPUPool(config=config)
    key = json.dumps([pool.prices, str(pool.default_price), pool.nodes], sort_keys=True, default=str)
    cached = _PRICE_CACHE.get("key")
    if cached and cached[0] == key:
        return cached[1], cached[2]
    from .placement import load_nodes

    models = sorted({g.model for n in load_nodes(pool.nodes) for g in n.gpus})
    table = pool.price_table()
    _PRICE_CACHE["key"] = (key, table, models)
    return table, models


def gpupool_options_from_form(form_data: Mapping[str, list[str]]) -> dict[str, Any]:
    """Form fields → user_options: ``profile`` and, for adjustable profiles, ``gpus--<slug>``."""
    options: dict[str, Any] = {}
    profile = (form_data.get("profile") or [""])[0]
    if profile:
        options["profile"] = profile
    raw = (form_data.get(f"gpus--{profile}") or [None])[0] if profile else None
    if raw not in (None, ""):
        options["gpus"] = int(raw) if re.fullmatch(r"\d{1,3}", raw.strip()) else raw
    return options


def _hours(balance: Decimal, floor: Decimal, price: Decimal) -> str:
    if price <= 0:
        return "unlimited"
    hours = max(Decimal(0), balance - floor) / price
    if hours >= 100:
        return f"{hours:.0f} h"
    return f"{hours:.1f} h"


def render_form(spawner: GPUPoolSpawner, account: Mapping[str, Any] | None) -> str:
    """The options form: each profile with its price per hour, the balance and what it buys."""
    e = html.escape
    parts = ['<div class="gpupool-form">']
    balance = floor = None
    min_hours = Decimal(1)
    try:
        from .config import GPUPool

        min_hours = GPUPool(config=spawner.config).min_start_hours
    except Exception:
        pass
    if account:
        try:
            balance, floor = Decimal(str(account["balance"])), Decimal(str(account["floor"]))
        except (KeyError, InvalidOperation):
            balance = floor = None
    if balance is not None and floor is not None:
        credits = account.get("credits") or {} if account else {}
        extra = ""
        if credits.get("daily") and Decimal(str(credits["daily"])) > 0:
            extra = f" +{e(_fmt(Decimal(str(credits['daily']))))} tokens every day."
        parts.append(
            f'<p class="gpupool-balance" data-balance="{e(str(balance))}">Your balance: '
            f"<strong>{e(_fmt(balance))} tokens</strong> (servers stop at {e(_fmt(floor))}).{extra}</p>"
        )
    else:
        parts.append('<p class="gpupool-balance gpupool-unknown">Your balance is unavailable right now; '
                     "GPU profiles are checked when the server starts.</p>")
    chosen = spawner.default_profile()
    previous = (spawner.user_options or {}).get("profile") if isinstance(spawner.user_options, dict) else None
    if isinstance(previous, str) and any(p.slug == previous for p in spawner.gpupool_profiles):
        chosen = next(p for p in spawner.gpupool_profiles if p.slug == previous)
    for p in spawner.gpupool_profiles:
        prices = spawner.profile_prices(p)
        affordable = True
        price_text = "free (no GPU)"
        hours_text = ""
        if prices is not None:
            if not prices:
                price_text = "no such GPU in this pool"
                affordable = False
            else:
                lo, hi = prices[0][1], prices[-1][1]
                unit = " per GPU" if p.max_gpus > p.gpus else ""
                lo_one = lo / p.gpus if unit else lo
                hi_one = hi / p.gpus if unit else hi
                rng = _fmt(lo_one) if lo_one == hi_one else f"{_fmt(lo_one)}–{_fmt(hi_one)}"
                models = ", ".join(f"{m}: {_fmt(pr)}" for m, pr in prices) if len(prices) > 1 else prices[0][0]
                price_text = f"{rng} tokens/h{unit} ({models})"
                if balance is not None and floor is not None:
                    affordable = balance - lo * min_hours >= floor
                    hours_text = f"your balance buys ≈ {_hours(balance, floor, lo)}"
        cls = "gpupool-profile" + ("" if affordable else " gpupool-unaffordable")
        checked = " checked" if chosen is not None and p.slug == chosen.slug else ""
        parts.append(
            f'<div class="{cls}" data-profile="{e(p.slug)}" data-affordable="{str(affordable).lower()}">'
            f'<label><input type="radio" name="profile" value="{e(p.slug)}"{checked}> '
            f"<strong>{e(p.display_name)}</strong> — {e(p.describe())}</label>"
        )
        if p.description:
            parts.append(f'<div class="gpupool-description">{e(p.description)}</div>')
        details = [price_text] + ([hours_text] if hours_text else [])
        parts.append(f'<div class="gpupool-price">{e("; ".join(details))}</div>')
        if not affordable and prices:
            parts.append('<div class="gpupool-warning text-danger">Not enough tokens to start this profile '
                         f"(it needs {e(_fmt(prices[0][1] * min_hours))} tokens above your floor).</div>")
        if p.max_gpus > p.gpus:
            opts = "".join(f'<option value="{n}">{n}</option>' for n in range(p.gpus, p.max_gpus + 1))
            parts.append(f'<label>GPUs: <select name="gpus--{e(p.slug)}">{opts}</select></label>')
        parts.append("</div>")
    parts.append("</div>")
    return "\n".join(parts)


# ------------------------------------------------------------ ready classes


class GPUPoolLocalProcessSpawner(GPUPoolSpawner, LocalProcessSpawner):
    """LocalProcessSpawner with GPU profiles: the server sees only its GPUs (by UUID)."""


class GPUPoolSimpleSpawner(GPUPoolSpawner, SimpleLocalProcessSpawner):
    """SimpleLocalProcessSpawner with GPU profiles (demo and tests; no user isolation)."""
