from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, close_old_connections

from django_idempotency_outbox.errors import ConfigurationError


class Command(BaseCommand):
    help = (
        "Make ready again the outbox's receiver tasks of django-tasks-db whose worker died "
        "mid-task (RUNNING past --stalled-after, 30 s unless given, and held by no receiver) or "
        "that could not settle their message (FAILED)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--every", type=float, metavar="SECONDS",
                            help="look again every SECONDS until SIGTERM (default: once)")
        parser.add_argument("--stalled-after", type=float, metavar="SECONDS",
                            help="how long a RUNNING task may run before it counts as "
                            "stalled (default 30)")

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox.django_tasks import requeue_stalled

        every, after = options["every"], options["stalled_after"]
        if every is not None and every <= 0:
            raise CommandError("--every must be above 0")
        if after is not None and after <= 0:
            raise CommandError("--stalled-after must be above 0")
        stop = threading.Event()
        if every is not None:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            self.stdout.write(f"requeue_outbox_tasks: looking every {every:g} s "
                              "(SIGTERM to stop)")
        while True:
            close_old_connections()
            try:
                count = requeue_stalled(stalled_after=after)
            except ConfigurationError as exc:
                raise CommandError(str(exc)) from exc
            except DatabaseError as exc:
                if every is None:
                    raise CommandError(f"the database failed: {exc}") from exc
                self.stderr.write(f"requeue_outbox_tasks: the database failed ({exc}); "
                                  "trying again")
                count = 0
            if count or every is None:
                self.stdout.write(f"{count} receiver task(s) made ready again")
            if every is None or stop.wait(every):
                return
