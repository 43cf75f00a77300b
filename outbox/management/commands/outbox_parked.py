from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser


def _row_id(value: str) -> tuple[int, int]:
    try:
        tenant, row = value.split("/")
        return int(tenant), int(row)
    except ValueError:
        raise CommandError(f"{value!r} is not TENANT/ID (as listed by outbox_parked)") from None


class Command(BaseCommand):
    help = (
        "List messages parked by consumers; with --redrive, handle them again "
        "(each deleted once its handler succeeds)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="*", metavar="TENANT/ID", help="dead-letter rows")
        parser.add_argument("--consumer", help="only this consumer's")
        parser.add_argument("--tenant", type=int, help="only this tenant's")
        parser.add_argument("--redrive", action="store_true", help="handle them again")
        parser.add_argument("--limit", type=int, default=100, help="rows listed (default 100)")

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox.deadletters import list_parked, redrive

        ids = [_row_id(v) for v in options["ids"]] or None
        try:
            if options["redrive"]:
                result = redrive(options["consumer"], ids, tenant_id=options["tenant"])
                self.stdout.write(
                    f"re-driven: {result.handled} handled, {result.failed} failed again, "
                    f"{result.missing} not found"
                )
                if result.failed:
                    raise CommandError(f"{result.failed} parked message(s) failed again")
                return
            if ids is not None:
                raise CommandError("TENANT/ID arguments are only used with --redrive")
            rows = list_parked(options["consumer"], options["tenant"], options["limit"])
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        for p in rows:
            error = (p.error.strip().splitlines() or [""])[-1][:80]
            self.stdout.write(
                f"{p.tenant_id}/{p.id}  {p.consumer}  {p.topic}  key={p.key}  "
                f"attempts={p.attempts}  parked={p.parked_at:%Y-%m-%d %H:%M:%S}  {error}"
            )
        self.stdout.write(f"{len(rows)} parked message(s)")
