"""Settings for the library's processes that the tests start (manage.py, celery).

The test run's own settings (its settings module is passed down in
``DIO_BASE_SETTINGS``, the rest of its environment is inherited), with
persistent connections: a long-running loop then keeps its sessions between
batches, as in production, so cutting them (pg_terminate_backend) tests the
reconnection for real.
"""

import importlib
import json
import os

_base = importlib.import_module(os.environ.get("DIO_BASE_SETTINGS", "tests.settings"))
globals().update({name: value for name, value in vars(_base).items() if name.isupper()})
DATABASES = _base.DATABASES

for _db in DATABASES.values():
    _db["CONN_MAX_AGE"] = None

# A crashed relay's lease runs out after this (the library's default unless a
# test sets it).
OUTBOX = dict(_base.OUTBOX)
if "DIO_RELAY_LEASE" in os.environ:
    OUTBOX["RELAY_LEASE"] = float(os.environ["DIO_RELAY_LEASE"])

# Relays and receivers that sign and verify (tests/outbox/test_signing.py): a
# JSON list of secrets.
if "DIO_SIGNING_KEYS" in os.environ:
    OUTBOX["SIGNING_KEYS"] = json.loads(os.environ["DIO_SIGNING_KEYS"])
