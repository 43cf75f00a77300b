"""Settings of the processes the Django tasks tests start: the outbox on Django's Tasks
framework, with django-tasks-db as the backend (its tables in the test database).

The outbox's process settings (tests/outbox/support/process_settings.py), plus the Tasks apps
(``django_tasks`` on Django 5.2; Django 6 has ``django.tasks`` built in),
django-tasks-db's backend, and the relay sending through
:class:`outbox.django_tasks.DjangoTasksTransport` to the receiver task of
tests/outbox/support/tasks_receiver.py. Short retries, as in
tests/outbox/support/fault_process_settings.py.
"""

import importlib.util
import os

from tests.outbox.support.process_settings import *  # noqa: F403
from tests.outbox.support.process_settings import DATABASE_ROUTERS, INSTALLED_APPS, OUTBOX

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]
if importlib.util.find_spec("django.tasks") is None:  # Django 5.2: the backport
    INSTALLED_APPS.append("django_tasks")

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

OUTBOX = {
    **OUTBOX,
    "TRANSPORT": "outbox.django_tasks.DjangoTasksTransport",
    "TASKS_TASK": "tests.outbox.support.tasks_receiver.receive",
    "RECEIVER_RETRY_BACKOFF_MAX": float(os.environ.get("DIO_RECEIVER_RETRY_BACKOFF_MAX", "0.5")),
    "RECEIVER_MAX_ATTEMPTS": int(os.environ.get("DIO_RECEIVER_MAX_ATTEMPTS", "60")),
}


class TasksTablesOnTheOwner:
    """Sends django-tasks-db's rows to the owner alias, while its migrations run as it.

    Its migrations update rows with the router's alias, not the one being
    migrated: on another connection than the migration's own, they would wait
    for the migration's lock for ever.
    """

    def db_for_read(self, model, **hints):  # type: ignore[no-untyped-def]
        return "owner" if model._meta.app_label == "django_tasks_database" else None

    db_for_write = db_for_read


if os.environ.get("DIO_TASKS_MIGRATE"):
    DATABASE_ROUTERS = [f"{__name__}.TasksTablesOnTheOwner", *DATABASE_ROUTERS]
if os.environ.get("DIO_TASKS_NO_ROUTER"):  # the check's test: the queue on the app alias
    DATABASE_ROUTERS = []
