from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_idempotency_outbox.cli import non_negative_seconds, positive_int
from idempotency.completer import complete_abandoned_keys


class Command(BaseCommand):
    help = (
        "Finish phases-mode requests that clients abandoned: pending keys of completable "
        "programs whose lease ran out and that nobody touched for a while."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than", type=non_negative_seconds, default=None, metavar="SECONDS",
            help='Untouched for at least this long (default: IDEMPOTENCY["COMPLETE_AFTER"]).',
        )
        parser.add_argument(
            "--limit", type=positive_int, default=None,
            help="At most this many keys (default: 100).",
        )
        parser.add_argument(
            "--database", default=None,
            help='Alias that finds keys across tenants (default: TENANCY["SYSTEM_DATABASE"]).',
        )

    def handle(self, *args: Any, **options: Any) -> None:
        verbose = options["verbosity"] >= 2
        older = options["older_than"]
        try:
            report = complete_abandoned_keys(
                older_than=older,
                limit=options["limit"],
                using=options["database"],
                progress=self.stdout.write if verbose else None,
            )
        except (ImproperlyConfigured, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"Found {report.found} abandoned keys: {report.completed} completed, "
            f"{report.failed} failed again, {report.skipped} skipped ({report.seconds:.2f} s)."
        )
        if report.gave_up:
            self.stdout.write(self.style.ERROR(
                f"Gave up on {report.gave_up} keys after IDEMPOTENCY[\"COMPLETE_MAX_ATTEMPTS\"] "
                "failed attempts: they answer the abandoned problem from now on, and may have "
                "partly taken effect (-v 2 lists them)."
            ))
        if report.failed or report.gave_up:
            raise CommandError(
                f"{report.failed} keys failed again; they stay pending."
                if report.failed else f"{report.gave_up} keys were given up on."
            )
