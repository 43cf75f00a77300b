from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Transactional outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from outbox.conf import outbox_settings
        from tenancy.checks import register_settings

        register_settings(outbox_settings)
