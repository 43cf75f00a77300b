"""Leases kept in a row by the database clock: how a job runs one instance at a time.

A job that must run alone across processes and hosts (the outbox's relay,
the idempotency key reaper) holds a lease: an owner and an expiry, in a row.
It is claimed, renewed and given up by single statements that each commit on
their own, so it holds through a transaction pooler, where a session advisory
lock would stay on whichever pooled server session took it; a job that dies
leaves a lease that runs out by itself. Every time comes from ``now()``:
hosts' clocks may disagree, the database's is one.

The lease decides who works, never what is written: a job's writes still
check that the lease is theirs (the relay's advance is a compare-and-set on
its position and its lease's owner).

Each app keeps its leases where its job keeps its state, and names their
statements in its query file: ``claim_lease`` (a compare-and-set that returns
a row when the lease is taken, none while another owner's runs),
``renew_lease``, ``release_lease`` and, where a job reports who holds it,
``lease_holder``; each takes ``%(name)s``, ``%(owner)s`` and ``%(seconds)s``.
The relay's lease lives on its offset row (``consumer_offsets``), so that its
claim returns the position and its advance compares the owner in the same
statement; the key reaper's in a row of ``idempotency_leases``.

(Phases mode's per-request lease is another thing: a fencing token on the
request's own key row; see :mod:`idempotency.store`.)
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import Any

from django_idempotency_outbox.sqlfiles import queries
from tenancy.statements import affected, fetch_one


def owner_id() -> str:
    """A name for one holder: ``host:pid:random``, what ``outbox_status`` and errors show."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Lease:
    """The lease ``name`` of ``package``'s query file, held by ``owner`` through ``using``.

    Each method is one statement in a transaction of its own (the caller has
    none open on ``using``).
    """

    package: str
    name: str
    using: str
    owner: str = field(default_factory=owner_id)

    def _params(self, **params: Any) -> dict[str, Any]:
        return {"name": self.name, "owner": self.owner, **params}

    def claim(self, seconds: float) -> tuple[Any, ...] | None:
        """Take or renew the lease for ``seconds``.

        Returns:
            The claim's row (what its ``RETURNING`` names), or None while
            another owner's lease runs.
        """
        row = fetch_one(self.using, self._sql("claim_lease"), self._params(seconds=seconds))
        return None if row is None else tuple(row)

    def renew(self, seconds: float) -> bool:
        """Extend the lease to ``seconds`` from now; False when it is no longer ``owner``'s."""
        return affected(self.using, self._sql("renew_lease"), self._params(seconds=seconds)) == 1

    def release(self) -> None:
        """Give the lease up at once (nothing when it is another's)."""
        affected(self.using, self._sql("release_lease"), self._params())

    def holder(self) -> tuple[str, Any] | None:
        """Who holds it and until when (None: no such lease row)."""
        row = fetch_one(self.using, self._sql("lease_holder"), self._params())
        return None if row is None else (row[0], row[1])

    def _sql(self, statement: str) -> str:
        return queries(self.package)[statement]
