from __future__ import annotations

import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from outbox.management import one_line_errors


class Command(BaseCommand):
    help = ("Make ready again the outbox's receiver tasks of django-tasks-db whose worker died "
            "mid-task (RUNNING past --stalled-after, 30 s unless given, and held by no receiver) "
            "or that could not settle their message (FAILED).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--every", type=float, metavar="SECONDS",
                            help="look again every SECONDS until SIGTERM (default: once)")
        parser.add_argument("--stalled-after", type=float, metavar="SECONDS",
                            help="how long a RUNNING task may run before it counts as "
                            "stalled (default 30)")

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox.django_tasks import requeue_stalled
        from outbox.loops import run_loop, stop_on_signals

        every, after = options["every"], options["stalled_after"]
        if every is not None and every <= 0:
            raise CommandError("--every must be above 0")
        if after is not None and after <= 0:
            raise CommandError("--stalled-after must be above 0")

        def step() -> bool:
            count = requeue_stalled(stalled_after=after)
            if count or every is None:
                self.stdout.write(f"{count} receiver task(s) made ready again")
            return False

        if every is not None:
            self.stdout.write(f"requeue_outbox_tasks: looking every {every:g} s "
                              "(SIGTERM to stop)")
        stop = threading.Event()
        with one_line_errors(), stop_on_signals(stop):
            run_loop(step, name="requeue_outbox_tasks", stop=stop, once=every is None, idle=every)
