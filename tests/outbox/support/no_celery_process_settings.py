"""The Django tasks settings in a project without Celery: importing Celery (or kombu,
its messaging library) fails, as where it is not installed.

The blocker goes in first, before Django loads an app; the test checks that
it held (no module of Celery's was loaded) at the end of each command.
"""

from tests.outbox.support.blocked import block

block("celery", "kombu", "amqp", "billiard", "vine", why="no Celery here", label="celery")

from tests.outbox.support.tasks_process_settings import *  # noqa: E402, F403
