"""The ``OBSERVABILITY`` settings dict: metrics and tracing (documented in docs/settings.md).

Both are optional extras. Each is on by default *when its package is
installed* (``prometheus_client`` for metrics, ``opentelemetry-api`` for
tracing) and costs nothing when it is not, or when it is switched off here:
the library then never imports the package.
"""

from __future__ import annotations

from django_idempotency_outbox.conf import AppSettings, Setting, boolean


class ObservabilitySettings(AppSettings):
    namespace = "OBSERVABILITY"
    removed = {
        "METRICS_DATABASE": 'the outbox gauges are read through TENANCY["ADMIN_DATABASE"] '
        "(the alias of every cross-tenant read for people and monitors).",
    }

    #: Count requests, messages and runs with prometheus_client (when installed).
    METRICS = Setting(True, boolean)
    #: Spans and trace-context propagation with OpenTelemetry (when its API is installed).
    TRACING = Setting(True, boolean)


observability_settings = ObservabilitySettings()
