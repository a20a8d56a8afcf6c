"""The two ways the service core says no: a refusal (valid request, the pool says
no, with a reason from :mod:`gpupool_hub.reasons`) and a bad request (input
that can never be valid). Handlers turn them into 409 and 400."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ...reasons import RefusalReason
from ...timefmt import iso


class Refused(Exception):
    """An allocation request the pool says no to, with a reason a machine and a person can read."""

    def __init__(self, reason: RefusalReason, message: str, *, retry_at: datetime | None = None,
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.reason = RefusalReason(reason)
        self.message = message
        self.retry_at = retry_at
        self.details = dict(details or {})

    def as_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason.value,
            "message": self.message,
            "retry_at": iso(self.retry_at),
            "details": self.details,
        }


class BadRequest(ValueError):
    """Input that can never be valid; the API answers 400 with this message."""
