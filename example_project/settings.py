"""Settings of the example shop, read from the environment (django-environ).

``make demo`` writes the environment to ``.run/demo/env`` and exports it:

- ``DATABASE_URL``: the app role (RLS applies to it): the web process; with
  ``DATABASE_POOLED=1`` it goes through pgbouncer in transaction mode (what
  ``make demo`` does), with the options docs/scaling.md lists.
- ``WORKER_DATABASE_URL``: the worker role (RLS applies to it too): the
  consumers' batches and the relay's lease, the only role that moves offsets.
- ``SYSTEM_DATABASE_URL``: the system role: reaper, relay reads, completer.
- ``OWNER_DATABASE_URL``: the owner role: ``manage.py migrate --database owner``.
- ``CELERY_BROKER_URL``: Redis, or RabbitMQ (``amqp://...``, with publisher confirms).
- ``GATEWAY_URL``: the fake payment gateway (example_project/gateway.py).

The soak (example_project/soak) also sets ``CELERY_VISIBILITY_TIMEOUT`` (Redis's
visibility timeout, an hour unless set) and ``RECEIVER_RETRY_BACKOFF_MAX``
(seconds, kept below it); ``CONN_HEALTH_CHECKS`` is on unless set to false.
"""

from datetime import timedelta
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent
env = environ.Env()

_LOCAL = "postgres://{0}:{0}@127.0.0.1:5432/shop"

SECRET_KEY = env("SECRET_KEY", default="demo-only-not-secret")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": env.db("DATABASE_URL", default=_LOCAL.format("shop_app")),
    "worker": env.db("WORKER_DATABASE_URL", default=_LOCAL.format("shop_worker")),
    "system": env.db("SYSTEM_DATABASE_URL", default=_LOCAL.format("shop_system")),
    "owner": env.db("OWNER_DATABASE_URL", default=_LOCAL.format("shop_owner")),
}
for _db in DATABASES.values():
    _db["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=60)
    # A kept connection that PostgreSQL closed (a restart, a failover) is
    # replaced at the start of the next request; without this, each one would
    # answer one 500 first (docs/operations.md).
    _db["CONN_HEALTH_CHECKS"] = env.bool("CONN_HEALTH_CHECKS", default=True)
if env.bool("DATABASE_POOLED", default=False):
    DATABASES["default"].update(
        CONN_MAX_AGE=None, CONN_HEALTH_CHECKS=True, DISABLE_SERVER_SIDE_CURSORS=True,
        OPTIONS={**DATABASES["default"].get("OPTIONS", {}), "prepare_threshold": None},
    )
# Consumers' handlers write through the ORM: inside a batch this router sends
# their queries to the worker alias, where the batch's transaction is open.
DATABASE_ROUTERS = ["tenancy.routers.AppDatabaseRouter"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "tenancy",
    "idempotency",
    "outbox",
    "example_project.shop",
]

MIDDLEWARE = [
    "django.middleware.common.CommonMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # X-Frame-Options: DENY on every answer: no page of the shop (the admin's
    # re-drive and discard buttons among them) can be framed by another site.
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.TokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # DRF's errors as problem details, like the library's own answers.
    "EXCEPTION_HANDLER": "django_idempotency_outbox.drf.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Example shop",
    "DESCRIPTION": "A multi-tenant shop built on django-idempotency-outbox.",
    "VERSION": "1.0",
    "SERVE_INCLUDE_SCHEMA": False,  # the schema's own URL is not part of the API
}

TENANCY = {
    "TENANT_RESOLVER": "example_project.shop.tenancy.merchant_of",
    "SYSTEM_DATABASE": "system",
    "WORKER_DATABASE": "worker",
    # migrate as the owner grants the shop's tables too (docs/roles.md)...
    "GRANT_PROJECT_TABLES": True,
    # ...and these, without row-level security: the web process reads them before it
    # knows the merchant (users, tokens, sessions, memberships), or they hold no
    # merchant's rows. Every other table without RLS stays closed to it (tenancy.W040).
    "SHARED_TABLES": ["admin", "auth", "authtoken", "contenttypes", "sessions",
                      "shop_merchant", "shop_membership"],
    # The roles' timeouts in the shop's database, as scripts/demo sets them (create_roles
    # would): check reports a role whose sessions start otherwise (tenancy.E041), health
    # too where delivery rests on it.
    "ROLE_SETTINGS": {
        "app": {"statement_timeout": "5s", "idle_in_transaction_session_timeout": "15s"},
        "worker": {"statement_timeout": "30s", "idle_in_transaction_session_timeout": "60s"},
        "system": {"statement_timeout": "60s", "idle_in_transaction_session_timeout": "60s"},
    },
}

IDEMPOTENCY = {
    "COMPLETE_AFTER": timedelta(minutes=2),
}

OUTBOX = {
    "CONSUMERS": ["example_project.shop.consumers.SalesProjection"],
    "CELERY_APP": "example_project.celery.app",
    "CELERY_TASK": {"order.paid": "shop.send_receipt", "*": "shop.ignore_event"},
    # Kept below the broker's visibility timeout (outbox.W104).
    "RECEIVER_RETRY_BACKOFF_MAX": timedelta(seconds=env.int("RECEIVER_RETRY_BACKOFF_MAX",
                                                             default=300)),
}

# The admin's styles, served by the demo's own web server (example_project/urls.py).
STATIC_URL = "static/"

# Metrics (prometheus_client) and tracing (OpenTelemetry) are on: both extras
# are installed. The demo's spans go to a file (example_project/telemetry.py).
OBSERVABILITY = {"METRICS": True, "TRACING": True}

CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="redis://127.0.0.1:6379/0")
# A task delivered to a worker that dies before acknowledging it (acks_late)
# goes back to its queue only once this much time has passed since its
# delivery: Redis's default is an hour. The soak shortens it.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3600)
}
if CELERY_BROKER_URL.startswith("amqp"):
    # RabbitMQ: the relay moves past a batch only once RabbitMQ confirmed it
    # (outbox.E110 without this); there is no visibility timeout there.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"confirm_publish": True}
CELERY_BEAT_SCHEDULE = {
    "reap-idempotency-keys": {"task": "idempotency.tasks.reap_expired_keys", "schedule": 3600.0},
    "complete-idempotency-keys": {
        "task": "idempotency.tasks.complete_abandoned_keys",
        "schedule": 60.0,
    },
    # The admin's re-drive and discard jobs: the worker has the consumers' code.
    "work-parked-jobs": {"task": "outbox.work_parked_jobs", "schedule": 5.0},
}

GATEWAY_URL = env("GATEWAY_URL", default="http://127.0.0.1:8111")
GATEWAY_TIMEOUT = env.float("GATEWAY_TIMEOUT", default=1.0)

EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
DEFAULT_FROM_EMAIL = "shop@example.com"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "INFO"},
}
