from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_idempotency_outbox.cli import port_number, serve_metrics
from outbox.management import one_line_errors


class Command(BaseCommand):
    help = ("Run the outbox consumers of OUTBOX['CONSUMERS'] (or those named) until SIGTERM; "
            "--once handles what is ready and exits.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="*", metavar="NAME", help="consumer names")
        parser.add_argument("--once", action="store_true", help="exit when nothing is left")
        parser.add_argument(
            "--metrics-port", type=port_number, metavar="PORT",
            help="serve Prometheus metrics (this process's and the outbox gauges) on PORT",
        )
        parser.add_argument("--metrics-addr", default="0.0.0.0", metavar="ADDR",
                            help="address --metrics-port listens on (default 0.0.0.0)")

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox.consumers import run_consumers, select_consumers

        with one_line_errors():
            consumers = select_consumers(options["names"])
            if not consumers:
                raise CommandError('no consumers: list them in OUTBOX["CONSUMERS"]')
            serve_metrics(options["metrics_port"], options["metrics_addr"])
            if not options["once"]:
                names = ", ".join(c.name for c in consumers)
                self.stdout.write(f"consumers {names}: running (SIGTERM to stop)")
            handled = run_consumers(consumers, once=options["once"])
        self.stdout.write(f"{handled} message(s) handled")
