"""What the outbox looks like now: one read (:func:`observe`, on the system alias) for
``outbox_status``, health, metrics and the admin: one query per fact, one meaning everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Count

from outbox import store
from outbox.store import SQL, Publisher, ReaderState
from tenancy.aliases import system_alias
from tenancy.statements import fetch_one

#: What pg_stat_activity shows in place of another role's query to a role
#: that is not a member of pg_read_all_stats (its start and state are NULL).
HIDDEN = "<insufficient privilege>"


def hidden(publisher: Publisher) -> bool:
    """Whether the server hid the publisher's query, state and start from the system role."""
    return publisher.pid is not None and publisher.query in (None, HIDDEN)


@dataclass(frozen=True)
class Powers:
    """What the role an alias connects as may do about another role's session.

    Attributes:
        role: that role.
        reads_all_stats: it sees other roles' queries and transaction starts
            (a superuser, or a member of ``pg_read_all_stats``).
        may_end: it may end a session of ``holder`` with
            ``pg_terminate_backend()`` (a superuser, a member of
            ``pg_signal_backend`` for a holder that is no superuser, or a member
            of the holder's role).
    """

    role: str
    reads_all_stats: bool
    may_end: bool


def powers(using: str | None = None, holder: str | None = None) -> Powers:
    """What the role of ``using`` (the system alias) may see and end of ``holder``'s sessions."""
    role, superuser, signal, stats, member = fetch_one(system_alias(using), SQL["role_powers"],
                                                 {"holder": holder or ""})
    return Powers(role, bool(superuser or stats), bool(superuser or signal or member))


@dataclass(frozen=True)
class Observation:
    """The outbox as the system role sees it.

    Attributes:
        allocated: the last message id handed out.
        readers: every consumer partition and relay, by name and partition.
        publishers: the transactions that published and are still open, lowest
            bound first. Each holds back the later messages of its own tenants
            (and only theirs) until it ends.
        held_back: committed messages waiting for one of ``publishers``.
        parked: dead-letter rows per consumer.
        messages: all messages in the outbox (counted only when asked: a full count).
    """

    allocated: int
    readers: list[ReaderState]
    publishers: list[Publisher]
    held_back: int
    parked: dict[str, int]
    messages: int | None = None

    @property
    def oldest_unpassed_age(self) -> timedelta | None:
        """The age of the oldest first-unpassed message of any reader (None: all caught up)."""
        ages = [r.lag for r in self.readers if r.lag is not None]
        return max(ages) if ages else None

    def holding(self, tenant_id: int | None) -> Publisher | None:
        """The open publisher, lowest bound first, that holds ``tenant_id`` back (if any)."""
        if tenant_id is None:
            return None
        return next((p for p in self.publishers if p.any_tenant or tenant_id in p.tenants),
                    None)


def observe(using: str | None = None, *, count_messages: bool = False) -> Observation:
    """Read the outbox's state (see :class:`Observation`).

    A publisher's query text, state and start need the system role to be a
    member of ``pg_read_all_stats`` (else they are None; its pid, role and
    application name are always there).

    Args:
        using: the system alias (``TENANCY["SYSTEM_DATABASE"]`` when omitted).
        count_messages: also count every message (``outbox_status`` does).
    """
    alias = system_alias(using)
    allocated = store.last_allocated(alias)
    readers = store.reader_states(alias)
    publishers = store.publishers_in_flight(alias)
    held_back = store.count_waiting(alias, publishers)
    from outbox.models import DeadLetter, OutboxMessage

    parked = DeadLetter.objects.using(alias).values_list("consumer").annotate(n=Count("*"))
    total = OutboxMessage.objects.using(alias).count() if count_messages else None
    return Observation(allocated, readers, publishers, held_back, dict(parked.order_by()),
                       total)


def status(using: str | None = None) -> Observation:
    """What ``outbox_status`` prints: :func:`observe`, with every message counted."""
    return observe(using, count_messages=True)
