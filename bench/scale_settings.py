"""Settings of ``make bench-scale``: the test settings, a database of its own,
requests from any number of tenants (``X-User: t<N>``, :mod:`bench.scale_app`),
and the outbox's relay and consumers of the bench.

``DIO_SCALE_CONSUMERS=all`` (the consumer processes the bench starts) lists the
consumers of the consumer curve in ``OUTBOX["CONSUMERS"]``; elsewhere none is
listed, so retention and health wait for the relay alone.
"""

import os

os.environ.setdefault("DIO_TEST_DB", "dio_bench_scale")

from tests.settings import *  # noqa: E402, F403
from tests.settings import REST_FRAMEWORK  # noqa: E402

REST_FRAMEWORK = {
    **REST_FRAMEWORK,
    "DEFAULT_AUTHENTICATION_CLASSES": ["bench.scale_app.TenantUsers"],
}

_CONSUMERS = (
    [f"bench.scale_app.Tail{n}" for n in range(10)] + ["bench.scale_app.Behind"]
    if os.environ.get("DIO_SCALE_CONSUMERS") == "all"
    else []
)

OUTBOX = {
    "CONSUMERS": _CONSUMERS,
    "CELERY_APP": "bench.scale_app.celery",
    "CELERY_TASK": "bench.receive",
    "CELERY_QUEUE": "dio-bench-scale",
}
