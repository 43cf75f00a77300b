from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "tenancy"
    verbose_name = "Tenancy"

    def ready(self) -> None:
        from tenancy import checks

        checks.register()
        register_schema_extension()


def register_schema_extension() -> None:
    """Document the no-tenant answer in drf-spectacular's schemas, if it is installed."""
    try:
        import drf_spectacular  # noqa: F401 - the [spectacular] extra
    except ImportError:
        return
    import tenancy.openapi  # noqa: F401 - drf-spectacular finds extensions by import
