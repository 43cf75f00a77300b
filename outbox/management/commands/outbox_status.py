from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand

from outbox.management import one_line_errors


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
    help = ("Show the outbox's state: lag per consumer and partition, the oldest message "
            "not yet passed, parked messages, and the open transactions that published (each "
            "holds back its own tenants' later messages).")

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox.observation import Powers, hidden, powers, status

        with one_line_errors("could not read the outbox: "):
            s = status()
            held_by = {p.user for p in s.publishers if p.pid is not None}
            can: dict[str | None, Powers] = {user: powers(holder=user) for user in held_by}
        out = self.stdout.write
        out(f"messages: {s.messages}   last id handed out: {s.allocated}")
        if s.oldest_unpassed_age is not None:
            out(f"oldest message not passed by every reader: {_age(s.oldest_unpassed_age)} old")
        elif s.readers:
            out("oldest message not passed by every reader: none, every reader is up to date")
        if s.readers:
            out(f"{'reader':<32} {'part':>6} {'behind':>8} {'last run':>9}  notes")
            for r in s.readers:
                part = f"{r.partition}/{r.partition_count}"
                notes = []
                if r.position.held:
                    held = ", ".join(str(t) for t in sorted(r.position.held))
                    notes.append(f"held back: tenant(s) {held}")
                if r.attempts:
                    error = (r.last_error.splitlines() or [""])[-1][:60]
                    tenant = f" (tenant {r.failing_tenant})" if r.failing_tenant is not None else ""
                    notes.append(f"attempt {r.attempts}{tenant}: {error}")
                out(f"{r.name:<32} {part:>6} {r.behind:>8} {_age(r.last_processed_age):>9}  "
                    + "; ".join(notes))
        else:
            out("no consumer or relay has run yet")
        parked = sum(s.parked.values())
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(s.parked.items()))
        out(f"parked: {parked}" + (f" ({detail})" if detail else ""))
        if not s.publishers:
            return
        out(f"open transactions that published: {len(s.publishers)}, holding back "
            f"{s.held_back} committed message(s) of their own tenants")
        for p in s.publishers:
            tenants = ", ".join(str(t) for t in p.tenants[:10]) + (
                f" and {len(p.tenants) - 10} more" if len(p.tenants) > 10 else "")
            if p.any_tenant:  # a tenant's key was held by someone else: all are held back
                tenants = "any (all held back)"
            since = p.since.isoformat(timespec="seconds") if p.since else "-"
            if p.pid is None:
                out(f"  prepared transaction {p.query!r} (role {p.user}) since {since} "
                    f"({_age(p.age)}), tenant(s) {tenants}, {p.waiting} waiting: "
                    "COMMIT PREPARED or ROLLBACK PREPARED it")
                continue
            me = can[p.user]
            query = (f"(its query, start and state are hidden from {me.role}: GRANT "
                     f"pg_read_all_stats TO {me.role})" if hidden(p)
                     else " ".join((p.query or "").split())[:200])
            out(f"  pid {p.pid} role {p.user} application {p.application or '-'} since {since} "
                f"({_age(p.age)}) state {p.state or '-'}, tenant(s) {tenants}, "
                f"{p.waiting} waiting: {query}")
            who = (f"{me.role} (this command's role) may" if me.may_end else
                   f"{me.role} (this command's role) may not: a superuser, a member of "
                   f"pg_signal_backend or of {p.user} may")
            out(f"    end it: SELECT pg_terminate_backend({p.pid}); -- rolls its transaction "
                f"back and closes its session; {who}")
