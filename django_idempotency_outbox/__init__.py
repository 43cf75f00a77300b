"""What the three apps of django-idempotency-outbox share.

``tenancy``, ``idempotency`` and ``outbox`` are the Django apps users install;
this package holds the plumbing they have in common and nothing else. It is
the floor of the layers (pyproject.toml's import contract): it imports none
of the apps, and each app declares here what it owns (its settings, its
metrics) rather than this package knowing it.

- :mod:`~django_idempotency_outbox.conf`: typed, namespaced settings, read
  live, and the check each app registers for its own dict;
- :mod:`~django_idempotency_outbox.observability`: the ``OBSERVABILITY`` dict
  (metrics and tracing on or off);
- :mod:`~django_idempotency_outbox.metrics`: the Prometheus machinery the
  apps' counters and gauges register with, and what serves them;
- :mod:`~django_idempotency_outbox.tracing`: OpenTelemetry spans and the
  trace context carried in messages;
- :mod:`~django_idempotency_outbox.durations`: the one duration parser and
  the one exponential backoff;
- :mod:`~django_idempotency_outbox.errors`: the base class of every error the
  library raises;
- :mod:`~django_idempotency_outbox.exports`: the apps' lazy public names;
- :mod:`~django_idempotency_outbox.problems`: RFC 9457 problem details, the
  library's HTTP error answers, and Django's error handlers in that format;
- :mod:`~django_idempotency_outbox.drf`: DRF's errors as problem details;
- :mod:`~django_idempotency_outbox.openapi`: the problem answers in
  drf-spectacular's schemas;
- :mod:`~django_idempotency_outbox.sqlfiles`: migrations that run SQL files,
  and each app's query file (the statements it sends, by name);
- :mod:`~django_idempotency_outbox.cli`: argument types and the metrics port
  of the management commands.

It is not a Django app and imports no model.
"""

from django_idempotency_outbox.errors import ConfigurationError, IdempotencyOutboxError

__version__ = "0.3.0"

__all__ = ["ConfigurationError", "IdempotencyOutboxError", "__version__"]
