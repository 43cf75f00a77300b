from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_idempotency_outbox.cli import positive_int
from outbox.management import one_line_errors


class Command(BaseCommand):
    help = ("Delete outbox messages older than OUTBOX['RETENTION'] that every consumer and "
            "relay has passed, and old receiver records. Runs as the system role.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=positive_int, help="rows deleted per transaction")

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox.conf import outbox_settings
        from outbox.retention import reap

        with one_line_errors():
            result = reap(batch_size=options["batch_size"])
        self.stdout.write(
            f"deleted {result.messages} message(s) and {result.received} receiver record(s)"
        )
        slot = outbox_settings.REPLICATION_SLOT
        if slot is not None and result.slot_horizon is None and options["verbosity"] >= 1:
            self.stdout.write(
                f"no message may be deleted yet: the replication slot {slot} does not exist"
            )
        elif result.horizon is None and options["verbosity"] >= 1:
            self.stdout.write(
                "no message may be deleted yet: a configured consumer or relay has not started"
            )
