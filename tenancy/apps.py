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
    from importlib.util import find_spec

    if find_spec("drf_spectacular") is not None:
        import tenancy.openapi  # noqa: F401 - drf-spectacular finds extensions by import
