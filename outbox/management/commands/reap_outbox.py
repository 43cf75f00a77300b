from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = (
        "Delete outbox messages older than OUTBOX['RETENTION'] that every consumer and "
        "relay has passed, and old receiver records. Runs as the system role."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, help="rows deleted per transaction")

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox.retention import reap

        size = options["batch_size"]
        if size is not None and size < 1:
            raise CommandError("--batch-size must be at least 1")
        try:
            result = reap(batch_size=size)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"deleted {result.messages} message(s) and {result.received} receiver record(s)"
        )
        from outbox.conf import outbox_settings

        slot = outbox_settings.REPLICATION_SLOT
        if slot is not None and result.slot_horizon is None and options["verbosity"] >= 1:
            self.stdout.write(
                f"no message may be deleted yet: the replication slot {slot} does not exist"
            )
        elif result.horizon is None and options["verbosity"] >= 1:
            self.stdout.write(
                "no message may be deleted yet: a configured consumer or relay has not started"
            )
