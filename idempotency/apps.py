from django.apps import AppConfig


class IdempotencyConfig(AppConfig):
    name = "idempotency"
    verbose_name = "Idempotency keys"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from idempotency.conf import idempotency_settings
        from tenancy.checks import register_settings

        register_settings(idempotency_settings)
