from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_idempotency_outbox.cli import (
    message_id_or_time,
    port_number,
    positive_int,
    serve_metrics,
)
from outbox.exceptions import RewindRefused
from outbox.management import one_line_errors


class Command(BaseCommand):
    help = ("Relay committed outbox messages to the broker (OUTBOX['TRANSPORT']) until "
            "SIGTERM; --once relays what is ready and exits; --rewind-to sets the relay back "
            "so that it sends again what a broker lost.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="exit when nothing is left")
        parser.add_argument("--name", help="relay name (its offset row is relay:<name>)")
        parser.add_argument("--transport", help="dotted path of a transport class")
        parser.add_argument("--batch-size", type=positive_int, help="messages per round")
        parser.add_argument(
            "--metrics-port", type=port_number, metavar="PORT",
            help="serve Prometheus metrics (this process's and the outbox gauges) on PORT",
        )
        parser.add_argument("--metrics-addr", default="0.0.0.0", metavar="ADDR",
                            help="address --metrics-port listens on (default 0.0.0.0)")
        parser.add_argument(
            "--rewind-to", type=message_id_or_time, metavar="MESSAGE_ID|TIME",
            help="set the relay back to just before this message (a UUID) or the first "
                 "message published at or after this ISO 8601 time, then exit; the running "
                 "relay sends everything from there again",
        )
        parser.add_argument(
            "--dry-run", action="store_true",
            help="with --rewind-to: say how many messages would be sent again; change nothing",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox.relay import Relay

        if options["rewind_to"] is not None:
            self._rewind(options)
            return
        if options["dry_run"]:
            raise CommandError("--dry-run goes with --rewind-to")
        serve_metrics(options["metrics_port"], options["metrics_addr"])
        with one_line_errors():
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
        self.stdout.write(f"relay {relay.name}: {sent} message(s) sent")

    def _rewind(self, options: dict[str, Any]) -> None:
        from outbox.relay import rewind

        if options["once"]:
            raise CommandError("--rewind-to only moves the relay's position; leave out --once")
        with one_line_errors(also=(RewindRefused, ValueError)):
            done = rewind(options["rewind_to"], name=options["name"], dry_run=options["dry_run"])
        if done.note:
            self.stdout.write(f"relay {done.relay}: nothing to send again: {done.note}")
            return
        assert done.target is not None
        topics = ", ".join(f"{topic} {count}" for topic, count in done.resend.items())
        where = (f"message {done.target.message_id} "
                 f"(published {done.target.created_at.isoformat()})")
        if options["dry_run"]:
            self.stdout.write(
                f"relay {done.relay}: --dry-run: rewinding to {where} would send "
                f"{done.count} message(s) again: {topics}"
            )
        elif done.moved:
            self.stdout.write(
                f"relay {done.relay}: rewound to {where}; {done.count} message(s) will be sent "
                f"again: {topics}"
            )
        else:
            raise CommandError(
                f"relay {done.relay}: its position moved while rewinding; run the command again"
            )
