"""The shop's Celery app: ``celery -A example_project worker -B``."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

app = Celery("example_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.broker_connection_retry_on_startup = True
app.conf.task_acks_late = True
# The receivers (shop.tasks.send_receipt) are outbox.ReceiverTask, which also
# rejects on a lost pool process; these make the app's other tasks do the same.
app.conf.task_reject_on_worker_lost = True
app.autodiscover_tasks(["example_project.shop", "idempotency", "outbox"])
