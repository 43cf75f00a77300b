from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_idempotency_outbox.cli import non_negative_seconds
from outbox.management import one_line_errors


class Command(BaseCommand):
    help = ("Exit 0 when the outbox is moving, 1 when a consumer or the relay is more than "
            "--max-lag seconds behind or the relay's lease is stale (for liveness and "
            "readiness probes).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("readers", nargs="*", metavar="READER",
                            help="consumer names or relay:<name> (default: all configured)")
        parser.add_argument("--max-lag", type=non_negative_seconds, metavar="SECONDS",
                            help='oldest unpassed message allowed (OUTBOX["HEALTH_MAX_LAG"])')
        parser.add_argument("--max-lease-age", type=non_negative_seconds, metavar="SECONDS",
                            help="how long a relay's lease may have run out (default 10)")
        parser.add_argument("--no-relay", action="store_true",
                            help="do not check the relay (e.g. a consumer pod's probe)")

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox.health import check

        with one_line_errors("unhealthy: cannot read the outbox: "):
            verdict = check(max_lag=options["max_lag"], max_lease_age=options["max_lease_age"],
                            readers=options["readers"],
                            relay=False if options["no_relay"] else None)
        if not verdict.ok:
            for problem in verdict.problems[:-1]:
                self.stderr.write(f"unhealthy: {problem}")
            raise CommandError(f"unhealthy: {verdict.problems[-1]}")
        if not verdict.readers:
            self.stdout.write("ok: no reader to check")
            return
        worst = max((r.lag.total_seconds() if r.lag else 0.0) for r in verdict.readers)
        self.stdout.write(f"ok: {len(verdict.readers)} reader(s), oldest unpassed message "
                          f"{worst:.1f} s old")
