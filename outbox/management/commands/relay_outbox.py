from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = (
        "Relay committed outbox messages to the broker (OUTBOX['TRANSPORT']) until "
        "SIGTERM; --once relays what is ready and exits."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="exit when nothing is left")
        parser.add_argument("--name", help="relay name (its offset row is relay:<name>)")
        parser.add_argument("--transport", help="dotted path of a transport class")
        parser.add_argument("--batch-size", type=int, help="messages per round")

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox.relay import Relay

        if options["batch_size"] is not None and options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        try:
            relay = Relay(options["transport"], name=options["name"],
                          batch_size=options["batch_size"])
            if options["once"]:
                try:
                    sent = relay.drain()
                finally:
                    relay.release()
            else:
                self.stdout.write(f"relay {relay.name}: running (SIGTERM to stop)")
                relay.run()
                sent = relay.sent
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"relay {relay.name}: {sent} message(s) sent")
