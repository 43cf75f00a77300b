from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = (
        "Run the outbox consumers of OUTBOX['CONSUMERS'] (or those named) until SIGTERM; "
        "--once handles what is ready and exits."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="*", metavar="NAME", help="consumer names")
        parser.add_argument("--once", action="store_true", help="exit when nothing is left")

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox.consumers import run_consumers, select_consumers

        try:
            consumers = select_consumers(options["names"])
            if not consumers:
                raise CommandError('no consumers: list them in OUTBOX["CONSUMERS"]')
            if not options["once"]:
                names = ", ".join(c.name for c in consumers)
                self.stdout.write(f"consumers {names}: running (SIGTERM to stop)")
            handled = run_consumers(consumers, once=options["once"])
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"{handled} message(s) handled")
