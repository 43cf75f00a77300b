"""Settings for the library's processes that the tests start (manage.py, celery).

The test settings, with persistent connections: a long-running loop then
keeps its sessions between batches, as in production, so cutting them
(pg_terminate_backend) tests the reconnection for real.
"""

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

for _db in DATABASES.values():
    _db["CONN_MAX_AGE"] = None

import os  # noqa: E402

from tests.settings import OUTBOX  # noqa: E402

# A crashed relay's lease runs out after this (the library's default unless a
# test sets it).
if "DIO_RELAY_LEASE" in os.environ:
    OUTBOX = {**OUTBOX, "RELAY_LEASE": float(os.environ["DIO_RELAY_LEASE"])}
