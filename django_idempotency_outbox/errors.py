"""The base of every error the library raises.

Each app derives its own errors from :class:`IdempotencyOutboxError` (one
module per app: ``tenancy.exceptions``, ``idempotency.exceptions``,
``outbox.exceptions``), so ``except IdempotencyOutboxError`` catches all of
them and ``except outbox.OutboxError`` those of one concern.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class IdempotencyOutboxError(Exception):
    """Base class of every error raised by django-idempotency-outbox."""


class ConfigurationError(IdempotencyOutboxError, ImproperlyConfigured):
    """A setting, a database alias or a role cannot do what is asked of it.

    Also an ``ImproperlyConfigured``, so Django and management commands treat
    it as a configuration problem. The message is one line, fit for a
    command's error output.
    """
