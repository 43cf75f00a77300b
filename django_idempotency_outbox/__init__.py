"""What the three apps of django-idempotency-outbox share.

``tenancy``, ``idempotency`` and ``outbox`` are the Django apps users install;
this package holds the plumbing they have in common and nothing else:

- :mod:`~django_idempotency_outbox.conf`: typed, namespaced settings, read
  live and validated by ``manage.py check``;
- :mod:`~django_idempotency_outbox.durations`: the one duration parser and
  the one exponential backoff;
- :mod:`~django_idempotency_outbox.errors`: the base class of every error the
  library raises;
- :mod:`~django_idempotency_outbox.sqlfiles`: migrations that run SQL files;
- :mod:`~django_idempotency_outbox.cli`: argument types and progress output
  of the management commands.

It is not a Django app and imports no model.
"""

from django_idempotency_outbox.errors import ConfigurationError, IdempotencyOutboxError

__version__ = "0.2.0"

__all__ = ["ConfigurationError", "IdempotencyOutboxError", "__version__"]
