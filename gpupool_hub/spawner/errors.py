"""How a spawn the pool cannot serve reaches the user: one exception, and the spawner's own reasons.

Refusals decided by the pool carry a :class:`~gpupool_hub.reasons.RefusalReason`
(the service's vocabulary). A spawn can also fail before the pool decides
anything (service down, bad token, a profile naming a trait the spawner does
not have); :class:`SpawnFailure` names those, so no reason is a bare string.
"""

from __future__ import annotations

import html
import pwd
from collections.abc import Mapping
from datetime import datetime
from enum import Enum
from typing import Any
from urllib.parse import unquote

from jupyterhub.spawner import SpawnException
from tornado import web
from traitlets import TraitError

from ..config import account_rule_from_config
from ..reasons import RefusalReason
from ..money.shortfall import shortfall_message
from ..timefmt import ZONE_COOKIE, time_html, time_zone, when_text
from ..identity.unix import UnixNameError, check_login_name, unix_account

__all__ = ["GPUPoolRefused", "SpawnFailure", "confirm_by_post", "for_viewer", "invalid_options", "refuse_unix_name",
           "require_login_name", "require_unix_account", "still_stopping_refusal"]


class SpawnFailure(str, Enum):
    """Why a spawn failed on the hub's side of the pool (never sent by the service)."""

    UNREACHABLE = "gpupool_unreachable"  # no answer, or a server error: try again later
    AUTH = "gpupool_auth"  # the service rejected the spawner's token: an admin must fix it
    BAD_REQUEST = "gpupool_bad_request"  # the service could not read the request
    CONFIG = "gpupool_config"  # the profile list does not fit this spawner class
    START_TIMEOUT = "gpupool_start_timeout"  # a reclaim would outlast the hub's start_timeout
    STOPPED = "gpupool_stopped"  # the hub stopped the server while its spawn waited for GPUs
    JOB_ENDED = "gpupool_job_ended"  # the batch job ended before its server was ready (gpupool-slurm)
    SCHEDULER_DOWN = "gpupool_scheduler_down"  # the batch scheduler's command failed (slurmctld down)
    CLUSTER_REFUSED = "gpupool_cluster_refused"  # the Kubernetes API refused the server's pod (RBAC, invalid pod)
    UNIX_NAME = "gpupool_unix_name"  # the user name cannot be a Unix account (unixname.RULE): refused, 403
    STILL_STOPPING = "gpupool_still_stopping"  # the server's last stop is not yet confirmed by its engine

    def __str__(self) -> str:
        return self.value


class GPUPoolRefused(SpawnException):
    """A spawn the pool said no to, shown on the spawn page and in the progress stream.

    JupyterHub 6.1's progress page only shows ``jupyterhub_message`` /
    ``jupyterhub_html_message`` of the exception, so both are set. ``reason`` is
    the plain string JupyterHub puts in its metrics; ``refusal`` is the pool's
    :class:`RefusalReason` when the service gave a known one (None for the
    spawner's own :class:`SpawnFailure` and for reasons of a newer service).
    """

    def __init__(self, message: str, *, reason: str, status_code: int = 400, message_html: str = "",
                 details: Mapping[str, Any] | None = None, retry_at: str | None = None,
                 retry_after: int | None = None) -> None:
        html_message = message_html or html.escape(message)
        super().__init__(message, reason=str(reason), message_html=html_message, status_code=status_code)
        self.log_message = message.replace("%", "%%")  # tornado formats it with its (empty) args
        self.jupyterhub_message = message
        self.jupyterhub_html_message = html_message
        self.details = dict(details or {})
        self.retry_at = retry_at
        self.refusal = RefusalReason.parse(reason)
        # JupyterHub's REST API sends an exception's ``headers`` with its error answer
        self.headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}

    @property
    def retryable(self) -> bool:
        """Whether asking again shortly may succeed (the pool says so per reason)."""
        return self.refusal is not None and self.refusal.retryable

    def __str__(self) -> str:
        return self.message


def for_viewer(refusal: GPUPoolRefused, handler: Any) -> GPUPoolRefused:
    """A not-enough-tokens refusal worded again for the person who asked: the date in their own
    zone (the ``gpupool_tz`` cookie that ``localtime.js`` sets; without one the pool's words stay)
    as text for the spawn page, and as a ``<time>`` element in the HTML of the progress page. The figures stay
    the service's (``shortfall.shortfall_message``); other refusals pass unchanged."""
    if refusal.refusal is not RefusalReason.INSUFFICIENT_BALANCE or "needs" not in refusal.details:
        return refusal
    try:
        zone = time_zone(unquote(handler.get_cookie(ZONE_COOKIE) or "")) if handler is not None else None
    except Exception:  # no request to read a cookie from
        zone = None
    if zone is None:  # a REST start from a script, or no zone known: the pool's wording (its zone) stays
        return refusal
    at = None
    if refusal.retry_at:
        try:
            at = datetime.fromisoformat(refusal.retry_at.replace("Z", "+00:00"))
        except ValueError:
            return refusal
    text = shortfall_message(refusal.details, at, lambda when: when_text(when, zone))
    marker = "\x00when\x00"
    html_text = html.escape(shortfall_message(refusal.details, at, lambda when: marker))
    if at is not None:
        html_text = html_text.replace(marker, time_html(at, zone))
    title = RefusalReason.INSUFFICIENT_BALANCE.title
    refusal.message = refusal.jupyterhub_message = text
    refusal.log_message = text.replace("%", "%%")
    refusal.message_html = refusal.jupyterhub_html_message = f"<strong>{html.escape(title)}.</strong> {html_text}"
    return refusal


def invalid_options(message: str) -> web.HTTPError:
    """JupyterHub's 400 "Invalid user options", with the reason after the colon."""
    text = f"Invalid user options: {message}"
    err = web.HTTPError(400, "%s", text)
    err.jupyterhub_message = text  # type: ignore[attr-defined]
    err.gpupool_normal_refusal = True  # type: ignore[attr-defined]  # the user's mistake: logged as INFO (logs.py)
    return err



def confirm_by_post() -> web.HTTPError:
    """Raised by ``options_from_query`` for a profile that costs tokens: JupyterHub then renders
    the options form (status 200) instead of starting anything, so a link or a cross-site GET
    never spends a user's tokens; the form's POST carries the xsrf token. The form itself says
    why (``linked`` in form.render_form): JupyterHub 6.1's spawn page drops an HTML message and
    would put "Error:" before a text one, and nothing went wrong."""
    err = web.HTTPError(200, "a profile that costs tokens is started by the form's POST, not by a link")
    err.jupyterhub_message = ""  # type: ignore[attr-defined]  # no error box above the form
    err.gpupool_normal_refusal = True  # type: ignore[attr-defined]  # logged as INFO (logs.py)
    return err


def refuse_unix_name(error: UnixNameError) -> GPUPoolRefused:
    """A user name that cannot run a server as a Unix account: 403, naming the rule. Not the pool's
    refusal but a failure of the spawner's (ERROR in the hub's log: such a name may be an attack)."""
    return GPUPoolRefused(f"Your user name cannot start a server here: {error}. Ask an admin.",
                          reason=SpawnFailure.UNIX_NAME, status_code=403)


def still_stopping_refusal(work: str) -> GPUPoolRefused:
    """A new spawn of a server whose last stop is not yet confirmed: its GPUs are still held (and
    charged) for ``work``, which the engine has not seen end; 503, asked again shortly."""
    return GPUPoolRefused(f"Your previous server is still stopping: {work} has not been seen to end yet, so its "
                          "GPUs are still held (and charged) for it. The hub keeps asking for it to end; try again "
                          "in a minute.", reason=SpawnFailure.STILL_STOPPING, status_code=503, retry_after=30)


def require_login_name(name: str) -> str:
    """``name`` if it may be a unit name or a command argument (unixname.RULE), else the 403 refusal."""
    try:
        return check_login_name(name)
    except UnixNameError as e:
        raise refuse_unix_name(e) from None


def require_unix_account(name: str, config: Any) -> pwd.struct_passwd:
    """The Unix account of ``name`` if it may become a uid and the hub's ``config`` lets it run a
    server (no root, no system account: ``c.GPUPool.unix_uid_min``, ``unix_uid_max``,
    ``unix_denied_names``), else the 403 refusal; a bad setting there is a 500 naming it."""
    try:
        rule = account_rule_from_config(config)
    except TraitError as e:
        raise GPUPoolRefused(f"The hub's account settings are wrong, so no server runs as a Unix account: {e}",
                             reason=SpawnFailure.CONFIG, status_code=500) from None
    try:
        return unix_account(name, rule)
    except UnixNameError as e:
        raise refuse_unix_name(e) from None
