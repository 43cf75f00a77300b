"""gunicorn settings of the demo's web server: metrics in multiprocess mode.

``PROMETHEUS_MULTIPROC_DIR`` (set by scripts/demo, emptied before start)
makes every worker write its counters to files that ``/metrics`` adds up;
``child_exit`` tells prometheus_client that a worker is gone.
"""

from django_idempotency_outbox.metrics import child_exit  # noqa: F401
