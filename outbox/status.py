"""What ``outbox_status`` reports: lag, stuck messages, and what holds delivery back."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from outbox import store
from outbox.store import Blocker, ReaderLag
from tenancy.aliases import system_alias


@dataclass(frozen=True)
class Status:
    fence: int
    readers: list[ReaderLag]
    oldest_unpassed_age: timedelta | None
    held_back: int
    parked: dict[str, int]
    blocker: Blocker | None
    messages: int


def status(using: str | None = None) -> Status:
    """Collect the outbox's health, as the system role sees it.

    ``blocker`` is the running transaction with the oldest transaction id, when
    messages are waiting behind the fence. Its query text and age need the
    system role to be a member of ``pg_read_all_stats`` (else they are None).
    """
    alias = system_alias(using)
    fence = store.current_fence(alias)
    readers = store.reader_lags(alias, fence)
    total = store.count_messages(alias)
    held_back = store.count_held_back(alias, fence)
    oldest = None
    if readers:
        oldest = store.oldest_unpassed_age(alias, min(r.position for r in readers))
    parked = store.parked_counts(alias)
    blocker = store.find_blocker(alias, fence) if held_back else None
    return Status(fence, readers, oldest, held_back, parked, blocker, total)
