"""The agent's own errors, shared by its steps."""

from __future__ import annotations


class ServiceError(Exception):
    """The service could not be asked (down, timed out, refused the token, answered nonsense)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status when the service answered one
