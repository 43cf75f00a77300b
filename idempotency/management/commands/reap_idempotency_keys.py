from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_idempotency_outbox.cli import non_negative_seconds, positive_int
from idempotency.reaper import reap_expired_keys


class Command(BaseCommand):
    help = (
        "Delete expired idempotency keys of every tenant in bounded batches, on the system "
        "database alias, and report keys stuck unfinished."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=None,
            help="Rows per delete transaction (default: 100).",
        )
        parser.add_argument(
            "--pause", type=non_negative_seconds, default=None, metavar="SECONDS",
            help="Pause between two batches (default: 0.01).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )
        parser.add_argument(
            "--database",
            default=None,
            help='Database alias to use (default: TENANCY["SYSTEM_DATABASE"]).',
        )

    def handle(self, *args: Any, **options: Any) -> None:
        verbose = options["verbosity"] >= 2
        try:
            report = reap_expired_keys(
                batch_size=options["batch_size"],
                pause=options["pause"],
                dry_run=options["dry_run"],
                using=options["database"],
                progress=self.stdout.write if verbose else None,
            )
        except (ImproperlyConfigured, ValueError, RuntimeError) as exc:
            raise CommandError(str(exc)) from exc
        verb = "Would delete" if report.dry_run else "Deleted"
        batches = "" if report.dry_run else f" in {report.batches} batches"
        self.stdout.write(
            f"{verb} {report.deleted} expired idempotency keys of {report.tenants} tenants"
            f"{batches} ({report.seconds:.2f} s)."
        )
        if report.gave_up:
            verb = "Would give up" if report.dry_run else "Gave up"
            self.stdout.write(self.style.ERROR(
                f"{verb} on {report.gave_up} pending keys untouched for "
                f'IDEMPOTENCY["GIVE_UP_AFTER"]: they answer the abandoned problem from now on, '
                "and may have partly taken effect:"
            ))
            for given in report.given_up:
                self.stdout.write(
                    f"  tenant {given.tenant_id} scope {given.scope} key {given.key!r} "
                    f"stopped at {given.recovery_point or 'started'}"
                )
        if report.stuck_count:
            self.stdout.write(
                self.style.WARNING(
                    f"{report.stuck_count} keys are stuck unfinished (oldest first):"
                )
            )
            for stuck in report.stuck:
                if stuck.scope in report.completable:
                    fate = "the completer will finish it"
                elif stuck.expired:
                    fate = "expired unfinished: needs a human"
                else:
                    fate = "waits for the client's retry"
                self.stdout.write(
                    f"  tenant {stuck.tenant_id} scope {stuck.scope} key {stuck.key!r} "
                    f"at {stuck.recovery_point or 'started'} since "
                    f"{stuck.created_at.isoformat()}: {fate}"
                )
