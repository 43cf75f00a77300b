"""Settings for the test suite: a real PostgreSQL with the three roles.

``scripts/services start`` writes the connection details to ``.run/env``;
``make test`` exports them. Each alias logs in as a different role:

- ``default``: the app role (NOSUPERUSER, NOBYPASSRLS, not the owner): every
  test runs as the web process would.
- ``worker``: the worker role (RLS-bound, like the app role): consumers'
  batches and the relays' leases; the only role with privileges on
  ``consumer_offsets``.
- ``system``: the system role, for cross-tenant upkeep.
- ``owner``: the owner role; only the test harness uses it (migrate, cleanup).

The library's privileges are not granted by hand: ``migrate`` as the owner
applies ``tenancy.privileges.matrix()`` (and, with ``GRANT_PROJECT_TABLES``, the
test app's and Django's tables), as in a deployment.

``DIO_POOLED`` puts aliases behind the private pgbouncer (transaction
pooling, ``scripts/services start pgbouncer``, which exports
``DIO_PGBOUNCER_PORT``): ``DIO_POOLED=app`` routes ``default`` through it
(what ``make test-pooled`` runs), ``DIO_POOLED=app,system`` the system alias
too, ``worker`` the worker alias. The owner alias always connects directly:
migrations and the harness's cleanup are not what a pooler is for. Processes
the tests start inherit the environment, so they connect the same way.
"""

import os
from typing import Any

from django.core.exceptions import ImproperlyConfigured

_NAME = os.environ.get("DIO_TEST_DB", "dio_test")

#: Aliases DIO_POOLED may name, and the alias each one means.
_POOLABLE = {"app": "default", "system": "system", "worker": "worker"}


def _pooled_aliases() -> set[str]:
    names = {n.strip() for n in os.environ.get("DIO_POOLED", "").split(",") if n.strip()}
    unknown = names - _POOLABLE.keys()
    if unknown:
        raise ImproperlyConfigured(
            f"DIO_POOLED names {', '.join(sorted(unknown))}; expected some of app, worker, system"
        )
    if names and not os.environ.get("DIO_PGBOUNCER_PORT"):
        raise ImproperlyConfigured(
            "DIO_POOLED needs pgbouncer: run under `scripts/services run pg redis pgbouncer --`"
            " (or `make test-pooled`), which exports DIO_PGBOUNCER_PORT"
        )
    return {_POOLABLE[n] for n in names}


POOLED_ALIASES = _pooled_aliases()


def _database(alias: str, role_env: str, default_role: str) -> dict[str, Any]:
    role = os.environ.get(role_env, default_role)
    db: dict[str, Any] = {
        # The roles' aliases use the library's backend, as tenancy.databases() writes them.
        "ENGINE": ("django.db.backends.postgresql" if alias == "owner"
                   else "tenancy.backends.postgresql"),
        "NAME": _NAME,
        "USER": role,
        "PASSWORD": os.environ.get(role_env + "_PASSWORD", role),
        "HOST": os.environ.get("DIO_PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("DIO_PGPORT", "5432"),
        "CONN_MAX_AGE": int(os.environ.get("DIO_CONN_MAX_AGE", "0")),
        "TEST": {"NAME": _NAME},
    }
    if alias in POOLED_ALIASES:
        db.update(
            HOST=os.environ.get("DIO_PGBOUNCER_HOST", "127.0.0.1"),
            PORT=os.environ["DIO_PGBOUNCER_PORT"],
            # What a pooled alias needs (docs/scaling.md). No prepared
            # statements: pgbouncer 1.18 in transaction mode does not follow
            # them from one server connection to the next. Django's psycopg 3
            # backend already defaults to None; said here, not assumed.
            OPTIONS={"prepare_threshold": None},
            # A client connection to pgbouncer holds no server connection
            # between transactions, so keeping it costs the server nothing and
            # saves a SCRAM handshake per request: persistent, as in production.
            CONN_MAX_AGE=None,
            # ...and checked before a request reuses it, so one that pgbouncer
            # closed (a restart, the harness's KILL) is replaced instead of
            # failing the next request.
            CONN_HEALTH_CHECKS=True,
            # A server-side cursor outside a transaction would outlive the
            # server connection it was declared on.
            DISABLE_SERVER_SIDE_CURSORS=True,
        )
    return db


DATABASES = {
    "default": _database("default", "DIO_APP_ROLE", "dio_app"),
    "worker": _database("worker", "DIO_WORKER_ROLE", "dio_worker"),
    "system": _database("system", "DIO_SYSTEM_ROLE", "dio_system"),
    "owner": _database("owner", "DIO_OWNER_ROLE", "dio_owner"),
}

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.testapp.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",  # the admin's CSS and JS, for the browser tests
    "rest_framework",
    "tenancy",
    "idempotency",
    "outbox",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.middleware.common.CommonMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["tests.testapp.auth.HeaderAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "UNAUTHENTICATED_USER": None,
}

TENANCY: dict[str, Any] = {
    "TENANT_RESOLVER": "tests.testapp.auth.tenant_of",
    "SYSTEM_DATABASE": "system",
    "WORKER_DATABASE": "worker",
    # The test app's tables (and Django's) are granted by migrate too.
    "GRANT_PROJECT_TABLES": True,
    # Opened to the app role without row-level security: Django's own tables, and the
    # plain orders that the benchmarks compare with (no RLS on purpose).
    "SHARED_TABLES": ["admin", "auth", "contenttypes", "sessions", "testapp_plain_order"],
}

# Consumers' handlers write through the ORM: inside a batch the router sends
# their queries to the worker alias, where the batch's transaction is open.
DATABASE_ROUTERS = ["tenancy.routers.AppDatabaseRouter"]
#: DIO_VERIFIED_CONTEXT=1 (``make test-verified``): the verified tenant context,
#: with this key installed and the mode turned on by the harness (tests/dbsetup.py).
VERIFIED_CONTEXT_KEY = {"KEY_ID": "tests-1", "KEY": "tests-only-verified-context-key-0123456789"}
if os.environ.get("DIO_VERIFIED_CONTEXT"):
    TENANCY["VERIFIED_CONTEXT"] = VERIFIED_CONTEXT_KEY

IDEMPOTENCY: dict[str, Any] = {}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}

# The outbox's test consumers; the Celery transport sends to the test worker's
# task (tests/outbox/support/order_worker_app.py) on a per-run queue.
OUTBOX: dict[str, Any] = {
    "CONSUMERS": [
        "tests.outbox.support.recorders.OrderRecorder",
        "tests.outbox.support.recorders.PartitionedRecorder",
        "tests.outbox.support.recorders.SlowRecorder",
    ],
    "CELERY_APP": "tests.outbox.support.order_worker_app.app",
    "CELERY_TASK": "tests.outbox.receive_order",
    "CELERY_QUEUE": os.environ.get("DIO_CELERY_QUEUE", "dio-outbox-tests"),
}

CELERY_BROKER_URL = os.environ.get("DIO_REDIS_URL", "redis://127.0.0.1:6379/0")
