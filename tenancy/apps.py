from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "tenancy"
    verbose_name = "Tenancy"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created
        from django.db.models.signals import post_migrate

        from tenancy import checks
        from tenancy.context import pin_search_path
        from tenancy.environment import register as register_environment_checks
        from tenancy.policies import declare_policies, install_autodetector
        from tenancy.privileges import grant_after_migrate, revoke_temporary_after_migrate
        from tenancy.references import declare_references
        from tenancy.references import register as register_reference_checks

        checks.register()
        declare_policies()
        declare_references()
        register_reference_checks()
        register_environment_checks()
        install_autodetector()
        post_migrate.connect(grant_after_migrate, dispatch_uid="tenancy.grant_after_migrate")
        connection_created.connect(pin_search_path, dispatch_uid="tenancy.pin_search_path")
        post_migrate.connect(revoke_temporary_after_migrate,
                             dispatch_uid="tenancy.revoke_temporary_after_migrate")
        register_schema_extension()


def register_schema_extension() -> None:
    """Document the no-tenant answer in drf-spectacular's schemas, if it is installed."""
    try:
        import drf_spectacular  # noqa: F401 - the [spectacular] extra
    except ImportError:
        return
    import tenancy.openapi  # noqa: F401 - drf-spectacular finds extensions by import
