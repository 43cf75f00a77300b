from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "example_project.shop"
    label = "shop"
    verbose_name = "Shop"

    def ready(self) -> None:
        from example_project.telemetry import configure

        configure()  # the demo's spans to a file, when DEMO_TRACE_FILE is set
