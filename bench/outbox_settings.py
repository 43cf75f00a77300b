"""Settings of ``make bench-outbox``: the test roles, a database of its own,
persistent connections (as a production relay or consumer would have)."""

import os

os.environ.setdefault("DIO_TEST_DB", "dio_bench_outbox")

from tests.settings import *  # noqa: E402, F403
from tests.settings import DATABASES  # noqa: E402

for _db in DATABASES.values():
    _db["CONN_MAX_AGE"] = None

OUTBOX = {
    "CONSUMERS": ["bench.outbox_app.Noop"],
    "CELERY_APP": "bench.outbox_app.celery",
    "CELERY_TASK": "bench.receive",
    "CELERY_QUEUE": "dio-bench-outbox",
}
