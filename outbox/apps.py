import sys

from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Transactional outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Importing the settings object registers it with the settings check.
        from outbox import checks, conf  # noqa: F401

        checks.register()
        connect_celery_signals()
        register_metrics()


def register_metrics() -> None:
    """Register the counters now (when prometheus_client is installed and metrics are on).

    Not on a process's first count: a Celery pool process or a gunicorn
    worker forked after this inherits them, and no request or task pays for
    importing prometheus_client.
    """
    from django_idempotency_outbox import metrics

    metrics.instruments()


def connect_celery_signals() -> None:
    """Warn when a Celery worker starts with settings that can lose a receiver's message.

    Only where Celery is already imported (a worker imports it before it sets
    Django up): a web process does not pay for importing Celery at start.
    """
    if "celery" not in sys.modules:
        return
    from outbox.celery import connect_signals

    connect_signals()
