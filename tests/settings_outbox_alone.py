"""The outbox installed without the idempotency app (tests/test_layers.py).

Its own database (``<DIO_TEST_DB>_outbox_alone``), the same roles as the
suite; no ``idempotency`` in ``INSTALLED_APPS``, no test app: a project that
publishes and consumes events and has no use for keys.
"""

import os
import sys

from tests.settings import _database

# Importing idempotency fails in these processes: nothing the outbox runs may need it.
sys.modules["idempotency"] = None  # type: ignore[assignment]

_NAME = os.environ.get("DIO_TEST_DB", "dio_test") + "_outbox_alone"


def _alone(alias: str, role_env: str, default_role: str) -> dict:
    database = _database(alias, role_env, default_role)
    database.update(NAME=_NAME, TEST={"NAME": _NAME})
    return database


DATABASES = {
    "default": _alone("default", "DIO_APP_ROLE", "dio_app"),
    "worker": _alone("worker", "DIO_WORKER_ROLE", "dio_worker"),
    "system": _alone("system", "DIO_SYSTEM_ROLE", "dio_system"),
    "owner": _alone("owner", "DIO_OWNER_ROLE", "dio_owner"),
}

SECRET_KEY = "tests-only-not-secret"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "tenancy", "outbox"]
TENANCY = {"GRANT_PROJECT_TABLES": True, "SHARED_TABLES": ["contenttypes"]}
OUTBOX = {
    "CONSUMERS": ["tests.outbox_alone.Echo"],
    "TRANSPORT": "outbox.transports.LoggingTransport",
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"outbox.transport": {"handlers": ["console"], "level": "INFO"}},
}
