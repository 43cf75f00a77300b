"""Errors of the outbox app."""

from __future__ import annotations

from django_idempotency_outbox.errors import ConfigurationError, IdempotencyOutboxError


class OutboxError(IdempotencyOutboxError):
    """Base class of the outbox's errors."""


class NotInTransaction(OutboxError):
    """``publish()`` was called outside ``transaction.atomic()``."""


class NoTenant(OutboxError):
    """``publish()`` was called without a tenant context."""


class ConsumerConfigError(OutboxError, ConfigurationError):
    """A consumer is misconfigured (message fit for a one-line command error)."""


class RewindRefused(OutboxError):
    """``relay_outbox --rewind-to`` cannot send again everything after its target."""


class BadSignature(OutboxError):
    """A receiver refused an envelope that the relay did not sign (``OUTBOX["SIGNING_KEYS"]``).

    Its signature is missing, malformed, made with a key that is not in the
    list, or does not match the envelope's content.
    """
