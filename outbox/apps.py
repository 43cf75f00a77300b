from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Transactional outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Importing the settings object registers it with the settings check.
        from outbox import checks, conf  # noqa: F401

        checks.register()
