from django.apps import AppConfig


class IdempotencyConfig(AppConfig):
    name = "idempotency"
    verbose_name = "Idempotency keys"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Importing the settings object registers it with the settings check.
        from idempotency import conf  # noqa: F401
