from django.apps import AppConfig


class IdempotencyConfig(AppConfig):
    name = "idempotency"
    verbose_name = "Idempotency keys"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from idempotency import checks

        checks.register()
        discover_programs()
        register_schema_extension()
        register_metrics()


def register_metrics() -> None:
    """The request counters now, not on a process's first keyed request."""
    from idempotency import metrics

    metrics.register()


def discover_programs() -> None:
    """Import every installed app's ``phases`` module, as the admin does ``admin`` modules.

    Each process (web, Celery worker, ``complete_idempotency_keys``) then
    knows every phases program defined there, whatever else it imports.
    """
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("phases")


def register_schema_extension() -> None:
    """Document the ``Idempotency-Key`` contract in drf-spectacular's schemas, if installed."""
    try:
        import drf_spectacular  # noqa: F401 - the [spectacular] extra
    except ImportError:
        return
    import idempotency.openapi  # noqa: F401 - drf-spectacular finds extensions by import
