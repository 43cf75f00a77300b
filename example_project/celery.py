"""The shop's Celery app: ``celery -A example_project worker -B``."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

app = Celery("example_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.broker_connection_retry_on_startup = True
app.conf.task_acks_late = True
app.autodiscover_tasks(["example_project.shop", "idempotency"])
