"""The outbox's process settings where django-tasks-db is not installed: importing it
fails (tests/outbox/support/blocked.py), and nothing names it."""

from tests.outbox.support.blocked import block

block("django_tasks_db", why="no django-tasks-db here", label="django_tasks_db")

from tests.outbox.support.process_settings import *  # noqa: E402, F403
