from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError


def _age(value: timedelta | None) -> str:
    if value is None:
        return "-"
    seconds = value.total_seconds()
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


class Command(BaseCommand):
    help = (
        "Show the outbox's health: lag per consumer and partition, the oldest message "
        "not yet passed, parked messages, and the publishing transaction holding delivery back."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        pass

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox.status import status

        try:
            s = status()
        except DatabaseError as exc:
            raise CommandError(f"could not read the outbox: {exc}".splitlines()[0]) from exc
        out = self.stdout.write
        out(f"messages: {s.messages}   fence (first id not readable yet): {s.fence}")
        if s.oldest_unpassed_age is not None:
            out(f"oldest message not passed by every reader: {_age(s.oldest_unpassed_age)} old")
        elif s.readers:
            out("oldest message not passed by every reader: none, every reader is up to date")
        if s.readers:
            out(f"{'reader':<32} {'part':>6} {'behind':>8} {'last run':>9}  error")
            for r in s.readers:
                part = f"{r.partition}/{r.partition_count}"
                error = (r.last_error.splitlines() or [""])[-1][:60]
                tenant = f" (tenant {r.failing_tenant})" if r.failing_tenant is not None else ""
                note = f"attempt {r.attempts}{tenant}: {error}" if r.attempts else ""
                out(f"{r.name:<32} {part:>6} {r.behind:>8} {_age(r.last_processed_age):>9}  {note}")
        else:
            out("no consumer or relay has run yet")
        parked = sum(s.parked.values())
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(s.parked.items()))
        out(f"parked: {parked}" + (f" ({detail})" if detail else ""))
        b = s.blocker
        if s.held_back or b is not None:
            out(f"held back by an open transaction that published: {s.held_back} message(s)")
        if b is not None:
            if b.pid is None:
                out(f"  prepared transaction {b.query!r} bound {b.bound} age {_age(b.age)} "
                    f"db {b.database} user {b.user}: COMMIT PREPARED or ROLLBACK PREPARED it")
            else:
                query = " ".join((b.query or "(hidden: grant pg_read_all_stats)").split())[:200]
                out(
                    f"  pid {b.pid} bound {b.bound} age {_age(b.age)} db {b.database} "
                    f"user {b.user} state {b.state}: {query}"
                )
