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

Each app keeps its lease where its job keeps its state: the relay's on its
offset row (``consumer_offsets``), so that its advance compares the owner in
the same statement; the key reaper's in a row of ``idempotency_leases``.
:class:`LeaseRow` writes the statements for a table's columns.

(Phases mode's per-request lease is another thing: a fencing token on the
request's own key row, claimed by the claim's ``INSERT``, renewed inside each
phase's transaction and taken over by a compare-and-set on the token; see
:mod:`idempotency.store`.)
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field


def owner_id() -> str:
    """A name for one holder: ``host:pid:random``, what ``outbox_status`` and errors show."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LeaseRow:
    """The statements of a lease kept in the columns ``owner`` and ``until`` of one row.

    Parameters are named: ``%(name)s`` (in ``row``, the condition that picks
    the lease's row), ``%(owner)s`` and ``%(seconds)s``.

    Attributes:
        table: the table holding the row.
        row: the SQL condition naming the row, e.g. ``name = %(name)s``.
        owner, until: the holder's column (``''`` when none) and the expiry's.
        returning: what a successful claim returns (default: the expiry).
    """

    table: str
    row: str
    owner: str = "lease_owner"
    until: str = "lease_until"
    returning: str = ""
    claim: str = field(init=False, repr=False)
    renew: str = field(init=False, repr=False)
    release: str = field(init=False, repr=False)
    holder: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        table, row, owner, until = self.table, self.row, self.owner, self.until
        expiry = "now() + make_interval(secs => %(seconds)s)"
        # A compare-and-set by the database clock: taken when free, run out,
        # or already this owner's (a claim renews the owner's own lease).
        claim = (
            f"UPDATE {table}\n   SET {owner} = %(owner)s, {until} = {expiry}\n"
            f" WHERE {row}\n"
            f"   AND ({owner} = %(owner)s OR {until} IS NULL OR {until} < now())\n"
            f"RETURNING {self.returning or until}"
        )
        # Only while it is still this owner's. The commit does not wait for the
        # WAL flush (set for this statement's own transaction): a renewal lost
        # in a crash costs nothing, since everyone reconnects after one, and a
        # slow flush must not make a live holder miss its renewal.
        renew = (
            f"UPDATE {table}\n   SET {until} = {expiry}\n"
            "  FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async\n"
            f" WHERE {row} AND {owner} = %(owner)s"
        )
        # Given up at once, so that another instance takes over without waiting.
        release = (
            f"UPDATE {table} SET {until} = NULL, {owner} = ''\n"
            f" WHERE {row} AND {owner} = %(owner)s"
        )
        holder = f"SELECT {owner}, {until} FROM {table} WHERE {row}"
        for name, sql in (("claim", claim), ("renew", renew), ("release", release),
                          ("holder", holder)):
            object.__setattr__(self, name, sql)
