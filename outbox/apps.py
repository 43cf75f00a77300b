import sys

from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Transactional outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from outbox import checks

        checks.register()
        connect_celery_signals()
        register_metrics()


def register_metrics() -> None:
    """The outbox's counters now, and its gauges at every scrape (``outbox.metrics.register``)."""
    from outbox import metrics

    metrics.register()


def connect_celery_signals() -> None:
    """Warn when a Celery worker starts with settings that can lose a receiver's message.

    Only where Celery is already imported (a worker imports it before it sets
    Django up): a web process does not pay for importing Celery at start.
    """
    if "celery" not in sys.modules:
        return
    from outbox.celery import connect_signals

    connect_signals()
