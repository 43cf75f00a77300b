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
