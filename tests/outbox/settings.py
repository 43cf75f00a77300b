"""Settings for the library's processes that the tests start (manage.py, celery).

The test settings, with persistent connections: a long-running loop then
keeps its sessions between batches, as in production, so cutting them
(pg_terminate_backend) tests the reconnection for real.
"""

import importlib
import os

# The suite's own settings: tests.settings, or tests.settings_app_alias under
# `make test-app-alias` (which names it in DIO_SUITE_SETTINGS).
_suite = importlib.import_module(os.environ.get("DIO_SUITE_SETTINGS", "tests.settings"))
globals().update({name: getattr(_suite, name) for name in dir(_suite) if name.isupper()})
DATABASES = _suite.DATABASES

for _db in DATABASES.values():
    _db["CONN_MAX_AGE"] = None

# A crashed relay's lease runs out after this (the crash tests shorten it).
OUTBOX = {**_suite.OUTBOX, "RELAY_LEASE": float(os.environ.get("DIO_RELAY_LEASE", "30"))}
