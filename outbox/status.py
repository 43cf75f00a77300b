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

    ``fence`` is the first id readers may not read yet. ``held_back`` counts
    the committed messages at or above it, which wait for a publishing
    transaction still in flight; ``blocker`` is that transaction (the one
    with the lowest bound), whether or not anything waits for it yet. Its
    query text, state and age need the system role to be a member of
    ``pg_read_all_stats`` (else they are None; its pid is always there).
    """
    alias = system_alias(using)
    fence = store.current_fence(alias)
    # Every statement below runs after the fence was taken, so a message it
    # counts as held back was committed then or later.
    readers = store.reader_lags(alias, fence)
    total = store.count_messages(alias)
    held_back = store.count_held_back(alias, fence)
    oldest = None
    if readers:
        oldest = store.oldest_unpassed_age(alias, min(r.position for r in readers))
    parked = store.parked_counts(alias)
    blocker = store.find_blocker(alias)
    return Status(fence, readers, oldest, held_back, parked, blocker, total)
