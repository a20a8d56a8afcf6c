"""The agent's own errors, shared by its steps."""

from __future__ import annotations

from ..service.core.agent_leases import CONFLICT_MARK


class AgentServiceError(Exception):
    """The service could not be asked (down, timed out, refused the token, answered nonsense)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status when the service answered one

    @property
    def another_agent(self) -> bool:
        """Another agent process holds this node at the service (service/core/agent_leases.py)."""
        return self.status == 409 and CONFLICT_MARK in str(self)
