"""Is the outbox moving? The answer liveness and readiness probes ask for.

Unhealthy (each problem says why) when a reader has a committed message older
than ``OUTBOX["HEALTH_MAX_LAG"]`` that it has not passed, whatever holds it
back (a slow or stopped reader, a failing head message, an open transaction
that published for its tenant); when a prepared transaction that published is
older than that (nothing but ``COMMIT``/``ROLLBACK PREPARED`` ends it); when a
role's settings drift from ``create_roles``'s on a parameter delivery rests on
(``tenancy.provision.GUARANTEED``); or when no relay renews its lease (a
running one does, every quarter of ``RELAY_LEASE``, even idle) within
:data:`MAX_LEASE_AGE`. Consumers hold no lease: a dead one shows as lag.
``outbox_health`` and :func:`outbox.health_view` both answer from :func:`check`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from outbox.conf import outbox_settings
from outbox.consumers import configured_consumers
from outbox.observation import Observation, observe
from outbox.relay import relay_readers
from outbox.store import Publisher, ReaderState
from tenancy.aliases import system_alias
from tenancy.provision import role_drift

#: Seconds a relay's lease may have run out before the relay counts as not
#: running (``outbox_health --max-lease-age``): a running relay renews it every
#: quarter of ``RELAY_LEASE``, idle or not, so ten seconds is a stopped relay.
MAX_LEASE_AGE = 10.0


@dataclass(frozen=True)
class Health:
    """The verdict, with one line per problem and the readers it looked at."""

    problems: list[str] = field(default_factory=list)
    readers: list[ReaderState] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check(
    *,
    max_lag: float | None = None,
    max_lease_age: float | None = None,
    readers: Sequence[str] = (),
    relay: bool | None = None,
    using: str | None = None,
) -> Health:
    """Check the configured readers (or only those named).

    Args:
        max_lag: seconds (``HEALTH_MAX_LAG``).
        max_lease_age: seconds (:data:`MAX_LEASE_AGE`).
        readers: consumer names, or ``relay:<name>``; empty: every configured
            consumer, and the relays when ``relay``.
        relay: check the relays' leases (when None: unless ``OUTBOX["TRANSPORT"]``
            is None; only when no ``readers`` are named, or a relay is among
            them). The relays are every relay that has run, or ``relay:default``
            when none has yet.
        using: the system alias.

    Raises:
        django.db.DatabaseError: the database could not be asked (which is
            itself unhealthy: the callers say so).
    """
    lag_limit = outbox_settings.HEALTH_MAX_LAG if max_lag is None else max_lag
    lease_limit = MAX_LEASE_AGE if max_lease_age is None else max_lease_age
    seen = observe(using)
    wanted = list(readers)
    if not wanted:
        wanted = [c.name for c in configured_consumers()]
        if outbox_settings.TRANSPORT is not None if relay is None else relay:
            wanted.extend(relay_readers(r.name for r in seen.readers))
    rows = [r for r in seen.readers if r.name in wanted]
    present = {r.name for r in rows}
    problems = [f"{name}: has never run (no offset row)" for name in wanted if name not in present]
    for r in rows:
        if r.lag is not None and r.lag.total_seconds() > lag_limit:
            problems.append(
                f"{r.where}: {r.behind} message(s) not passed, the first "
                f"{r.lag.total_seconds():.0f} s old (limit {lag_limit:g} s): {_why(r, seen)}"
            )
        if r.is_relay:
            if r.lease_left is None:
                problems.append(f"{r.where}: no relay holds the lease (none is running)")
            elif -r.lease_left > lease_limit:
                problems.append(
                    f"{r.where}: its lease ran out {-r.lease_left:.0f} s ago (limit "
                    f"{lease_limit:g} s): its relay stopped renewing it ({r.lease_owner})"
                )
    problems.extend(_stalled(p, lag_limit) for p in seen.publishers
                    if p.pid is None and p.age is not None
                    and p.age.total_seconds() > lag_limit)
    problems.extend(
        f"the {d.said} (TENANCY[\"ROLE_SETTINGS\"]): {d.breaks}; {d.fix}"
        for d in role_drift(system_alias(using)) if d.delivery
    )
    return Health(problems, rows)


def _stalled(prepared: Publisher, limit: float) -> str:
    """A prepared transaction that published: it holds its tenants until someone ends it."""
    held = ("every tenant" if prepared.any_tenant
            else "tenant(s) " + ", ".join(str(t) for t in prepared.tenants))
    age = prepared.age.total_seconds() if prepared.age is not None else 0.0
    return (f"a prepared transaction {prepared.query!r} (role {prepared.user}) published and "
            f"has held back {held} for {age:.0f} s (limit {limit:g} s): nothing ends it but "
            f"COMMIT PREPARED or ROLLBACK PREPARED {prepared.query!r}, run by a superuser or "
            "its role; outbox_status shows it")


def _why(reader: ReaderState, seen: Observation) -> str:
    """What holds ``reader``'s first unpassed message back, as far as the database can tell."""
    holder = seen.holding(reader.first_unpassed_tenant)
    if holder is not None:
        who = ("a prepared transaction" if holder.pid is None
               else f"pid {holder.pid}, role {holder.user}, application "
                    f"{holder.application or '-'}")
        age = f", open {holder.age.total_seconds():.0f} s" if holder.age is not None else ""
        return (f"tenant {reader.first_unpassed_tenant} is held back by an open transaction "
                f"that published for it ({who}{age}); outbox_status shows it")
    if reader.attempts:
        return f"its head message has failed {reader.attempts} time(s) and is retried"
    if reader.is_relay:
        return "the relay is not keeping up, or not running"
    return "the consumer is not keeping up, or not running"
