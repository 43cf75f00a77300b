"""Errors of the idempotency app."""

from __future__ import annotations

from django_idempotency_outbox.errors import IdempotencyOutboxError


class IdempotencyError(IdempotencyOutboxError):
    """Base class of the idempotency app's errors."""


class InvalidKey(IdempotencyError, ValueError):
    """The Idempotency-Key header value is not a valid key (the message is fit for the client)."""


class LeaseLost(IdempotencyError):  # noqa: N818 - reads as what happened
    """Phases mode: this request's lease was taken over; its phase was rolled back."""


class UnknownRecoveryPoint(IdempotencyError):  # noqa: N818
    """A program has no phase for a stored recovery point (a deploy renamed one?)."""


class RequestRefused(IdempotencyError):  # noqa: N818 - reads as what happened
    """A request the library answers with a problem of its own before anything runs.

    Raised while a keyed request is checked (its path, size and body, or what
    a phases program would store); :func:`idempotency.flow.respond` answers
    it as ``application/problem+json`` with ``status`` and ``code``, and
    nothing is looked up or written.
    """

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


class ReaperBusy(IdempotencyError, RuntimeError):  # noqa: N818 - reads as what happened
    """Another reaper holds the lease: this one did nothing (and says so, never "done")."""
