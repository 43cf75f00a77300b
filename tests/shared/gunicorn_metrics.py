"""gunicorn configuration of the multiprocess metrics test (as docs/operations.md shows it)."""

from django_idempotency_outbox.metrics import child_exit  # noqa: F401
