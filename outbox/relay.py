"""The relay: from ``outbox_messages`` to a broker, at least once (docs/outbox.md, "The relay").

It reads the stream on the system alias and keeps its offset row on the worker
alias. Its effect is outside the database, so it cannot share a transaction
with the offset; each round is::

    1. claim the lease on the offset row      (an UPDATE, committed; only when not
                                               held: then the position here is current)
    2. read the next batch after the position (a SELECT; for a full batch, the one
                                               after is read meanwhile: _ReadAhead)
    3. sign it (SIGNING_KEYS) and send it     (no transaction open)
    4. advance the offset: compare-and-set on the old position and the lease

A crash between 3 and 4 sends the batch again (receivers drop duplicates by
message id); a broker error keeps the offset and retries after a growing pause.
The lease lets one relay of many work; a heartbeat thread renews it. It lives
in a row, each renewal a statement of its own, so relays work through
pgbouncer in transaction mode (a session advisory lock would stay on the
pooled connection). It decides who works, never what is delivered: the
compare-and-set keeps a relay that lost it from moving the offset.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import close_old_connections

from django_idempotency_outbox import tracing
from django_idempotency_outbox.durations import backoff
from outbox import metrics, signing, store
from outbox.conf import outbox_settings
from outbox.consumers import require_cross_tenant_reader
from outbox.exceptions import RewindRefused
from outbox.loops import DATABASE_ERRORS, close_connections, run_loop, stop_on_signals
from outbox.publishing import wake_up
from outbox.stream import Batch, Envelope, Message, Position
from outbox.transports import Transport, get_transport
from tenancy.aliases import system_alias, worker_alias
from tenancy.leases import Lease, owner_id

logger = logging.getLogger("outbox")

#: The relay's name unless it is given one (``relay_outbox --name``): its
#: offset row is ``relay:default``.
DEFAULT_NAME = "default"
#: Messages read and sent per round (``relay_outbox --batch-size``).
BATCH_SIZE = 1000
#: The first pause after the broker failed, in seconds, doubled for each
#: further failure up to the second: a broker back after an outage is used
#: again within half a minute.
BROKER_BACKOFF = 0.5
BROKER_BACKOFF_MAX = 30.0


def relay_readers(names: Iterable[str]) -> list[str]:
    """What retention waits for and health checks: the relays among reader ``names`` (every
    relay that has run, whatever its name), or ``relay:default`` when none has yet."""
    found = sorted({name for name in names if name.startswith("relay:")})
    return found or [f"relay:{DEFAULT_NAME}"]


class _Heartbeat:
    """Renews a relay's lease every quarter of its length, in a thread (so on a connection)
    of its own, from the claim until :meth:`stop`.

    A renewal that finds the lease another's (taken over, or dropped by
    :func:`rewind`) sets :attr:`lost` and ends: the relay reads its position
    again rather than keep one the row no longer backs. A database error is
    logged and the next beat tries on a new connection.
    """

    def __init__(self, relay: Relay, lease: float) -> None:
        self.lost = threading.Event()
        self._relay = relay
        self._lease = lease
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"outbox relay {relay.name} heartbeat", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        relay = self._relay
        try:
            while not self._done.wait(self._lease / 4):
                try:
                    renewed = relay.lease.renew(self._lease)
                except DATABASE_ERRORS as exc:
                    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    logger.warning("outbox: relay %s could not renew its lease (%s)",
                                   relay.name, first_line)
                    close_connections(relay.lease_alias)
                    continue
                if not renewed:
                    logger.warning(
                        "outbox: relay %s lost its lease to another relay (or a rewind "
                        "dropped it); it reads its position again", relay.name,
                    )
                    self.lost.set()
                    return
        finally:
            close_connections(relay.lease_alias)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


class _ReadAhead:
    """Reads the relay's next batch on a thread of its own while the current one is sent.

    It is the read the next round would make, made earlier (the fence makes any
    read gap-safe, whenever it runs), used only by a round that starts where it
    was read from. The thread's connection is closed by :meth:`close`.
    """

    def __init__(self, relay: Relay) -> None:
        self._relay = relay
        self._pool: ThreadPoolExecutor | None = None
        self._after: Position | None = None
        self._pending: Future[Batch[Any]] | None = None

    def start(self, position: Position) -> None:
        """Begin reading the batch after ``position``."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                1, thread_name_prefix=f"outbox relay {self._relay.name} read-ahead"
            )
        self.drop()
        self._after = position
        self._pending = self._pool.submit(self._read, position)

    def take(self, position: Position) -> Batch[Any] | None:
        """The batch read after ``position``, if that is what was read; else None."""
        pending, after = self._pending, self._after
        self._pending = self._after = None
        if pending is None or after != position:
            return None
        try:
            return pending.result()
        except Exception:  # noqa: BLE001 - the round reads again, and meets the error itself
            return None

    def drop(self) -> None:
        """Forget a read under way (its result is not used)."""
        self._pending = self._after = None

    def close(self) -> None:
        """Stop the thread, closing its connection."""
        if self._pool is not None:
            self._pool.submit(close_connections, self._relay.alias).result()
            self._pool.shutdown(wait=True)
            self._pool = None
        self.drop()

    def _read(self, position: Position) -> Batch[Any]:
        relay = self._relay
        close_old_connections()  # this thread's connection, as run_loop does for the relay's
        return relay._read(position)


@contextmanager
def _relay_spans(relay: str, messages: Sequence[Message | Envelope]) -> Iterator[None]:
    """An ``outbox.relay`` span per message, child of its publisher's trace, around the send."""
    if not tracing.enabled():
        yield
        return
    spans = []
    for item in messages:
        message = item.message() if isinstance(item, Envelope) else item
        spans.append(tracing.start_message_span(
            "outbox.relay", message.headers,
            {**tracing.message_attributes(message), "outbox.relay": relay}, kind="PRODUCER",
        ))
    try:
        yield
    except BaseException as exc:
        for span in spans:
            tracing.fail(span, exc)
        raise
    finally:
        for span in spans:
            span.end()


class Relay:
    """Moves committed messages to a transport, in id order.

    Args:
        transport: a :class:`~outbox.transports.Transport`; ``OUTBOX["TRANSPORT"]``
            when omitted.
        name: the relay's offset is the row ``relay:<name>``; ``default`` when
            omitted. Relays with different names each deliver everything.
        batch_size: messages per round; 1000 when omitted.
    """

    def __init__(
        self,
        transport: Transport | str | None = None,
        *,
        name: str | None = None,
        batch_size: int | None = None,
    ) -> None:
        self.transport = get_transport(transport)
        self.name = name or DEFAULT_NAME
        self.offset_name = f"relay:{self.name}"
        self.batch_size = batch_size or BATCH_SIZE
        self.alias = system_alias()  # reads the stream across tenants
        self.lease_alias = worker_alias()  # the offset row: lease, heartbeat, advance
        # On its offset row: a claim returns its position (last_id, held); the advance
        # compares the owner (store.advance_leased).
        self.lease = Lease("outbox", self.offset_name, self.lease_alias, owner_id())
        self.owner = self.lease.owner
        self.stop = threading.Event()
        self.sent = 0
        self._broker_failures = 0
        self._checked = False
        # While the lease is ours (the heartbeat keeps it), the position is
        # known here: no statement per poll but the read.
        self._position: Position | None = None
        self._heartbeat: _Heartbeat | None = None
        self._read_ahead = _ReadAhead(self)

    def _claim(self) -> Position | None:
        heartbeat = self._heartbeat
        if self._position is not None and heartbeat is not None and not heartbeat.lost.is_set():
            return self._position
        self._stop_heartbeat()
        self._position = None
        lease = outbox_settings.RELAY_LEASE
        row = self.lease.claim(lease)
        if row is None and store.create_offsets(self.lease_alias, self.offset_name, 1):
            row = self.lease.claim(lease)  # the row was missing: it starts at the outbox's start
        if row is None:
            return None
        self._position = Position.of_row(*row)
        self._heartbeat = _Heartbeat(self, lease)
        return self._position

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None

    def _read(self, position: Position) -> Batch[Message] | Batch[Envelope]:
        """The batch after ``position``, as the transport takes it (Envelopes: PostgreSQL
        writes the JSON)."""
        if self.transport.reads_envelopes:
            return store.read_envelopes(self.alias, position, self.batch_size)
        return store.read_batch(self.alias, position, self.batch_size)

    def step(self) -> bool:
        """One round; True when another round may find work at once."""
        try:
            return self._step()
        except DATABASE_ERRORS:
            self._position = None  # did the last advance commit? ask the database
            raise

    def _step(self) -> bool:
        if not self._checked:
            require_cross_tenant_reader(self.alias)
            self._checked = True
        position = self._claim()
        if position is None:
            return False  # another relay holds the lease
        batch: Batch[Message] | Batch[Envelope] | None = self._read_ahead.take(position)
        if batch is None:
            batch = self._read(position)
        if not batch.messages:
            # Nothing to send, but the position may still move: past ids that
            # were rolled back, and off tenants whose publisher has ended.
            moved = batch.position_after(position)
            if moved != position:
                advanced = store.advance_leased(
                    self.lease_alias, self.offset_name, self.owner, position, moved
                )
                self._position = moved if advanced else None
            return False
        if self._heartbeat is None or self._heartbeat.lost.is_set():
            self._position = None  # another relay took over while this one read
            return False
        moved = batch.position_after(position)
        if not batch.complete:  # more is waiting: read it while this batch is sent
            self._read_ahead.start(moved)
        keys = outbox_settings.SIGNING_KEYS
        if keys:  # every envelope carries the signature receivers verify
            batch = signing.signed(batch, keys[0])
        try:
            with _relay_spans(self.name, batch.messages):
                self.transport.send(batch.messages)  # type: ignore[arg-type]
        except DATABASE_ERRORS:
            raise
        except Exception as exc:
            self._position = None  # re-read the offset and renew the lease next time
            self._broker_failures += 1
            pause = backoff(self._broker_failures, BROKER_BACKOFF, BROKER_BACKOFF_MAX)
            logger.warning(
                "outbox: relay %s could not send %d message(s) (%s: %s); "
                "sending them again in %.1f s",
                self.name, len(batch.messages), type(exc).__name__, exc, pause,
            )
            self.stop.wait(pause)
            return True
        if self._broker_failures:
            logger.info("outbox: relay %s reaches the broker again", self.name)
            self._broker_failures = 0
        if not store.advance_leased(self.lease_alias, self.offset_name, self.owner, position,
                                    moved):
            self._position = None
            logger.warning(
                "outbox: relay %s lost its lease while sending; another relay will send "
                "those %d message(s) again (receivers de-duplicate them)",
                self.name, len(batch.messages),
            )
            return False
        self._position = moved
        self.sent += len(batch.messages)
        metrics.relayed(self.name, len(batch.messages))
        return not batch.complete

    def drain(self) -> int:
        """Relay until nothing is left below the fence; return messages sent.

        A database error propagates (this is for one-shot use: tests, tasks).
        The lease is kept, no longer renewed, when it returns: call
        :meth:`release` to hand over at once.
        """
        before = self.sent
        try:
            run_loop(self.step, name=f"relay {self.name}", stop=self.stop, once=True)
        finally:
            self._stop_heartbeat()
            self._read_ahead.close()
        return self.sent - before

    def run(self) -> None:
        """Relay until SIGTERM/SIGINT (or :attr:`stop` is set), surviving outages."""
        with stop_on_signals(self.stop):
            try:
                run_loop(self.step, name=f"relay {self.name}", stop=self.stop, wake_up=wake_up)
            finally:
                self._read_ahead.close()
                self.release()
                self.transport.close()

    def release(self) -> None:
        """Give the lease up, so that another relay takes over at once."""
        self._stop_heartbeat()
        self._position = None
        try:
            self.lease.release()
        except DATABASE_ERRORS:
            pass  # the lease runs out by itself


@dataclass(frozen=True)
class Rewind:
    """What :func:`rewind` did (or, on a dry run, would do).

    Attributes:
        relay: the relay's name.
        target: the first message sent again (None: nothing to send again).
        resend: messages sent again, per topic: those the relay had passed
            from the target on.
        moved: the relay's position was set back (False on a dry run, and when
            there was nothing to send again).
        note: why nothing is sent again, when that is the case.
    """

    relay: str
    target: store.StreamMark | None
    resend: dict[str, int]
    moved: bool
    note: str = ""

    @property
    def count(self) -> int:
        return sum(self.resend.values())


def rewind(
    to: datetime | uuid.UUID,
    *,
    name: str | None = None,
    dry_run: bool = False,
    using: str | None = None,
) -> Rewind:
    """Set the relay back so that it sends again every message from ``to`` on.

    For a broker that lost messages the relay had sent: the outbox keeps them
    until ``OUTBOX["RETENTION"]``, and receivers skip what they had handled.
    The lease is dropped with the move, so a running relay's heartbeat finds it
    gone and the relay reads the new position; a round under way fails its
    compare-and-set and sends its batch again (docs/outbox.md).

    Args:
        to: a message id (that message and everything after it in delivery
            order), or a time with a time zone (every message published since,
            and possibly a few published shortly before, which sort after them).
        name: the relay (``default`` unless given).
        dry_run: say what would be sent again; change nothing.
        using: the system alias.

    Raises:
        RewindRefused: the target is not in the outbox, or is older than what
            retention keeps (``RETENTION``: messages after it may be deleted
            already, and receivers have forgotten their ids: they would run
            those messages' effects a second time).
    """
    alias = system_alias(using)
    require_cross_tenant_reader(alias)
    relay = name or DEFAULT_NAME
    offset_name = f"relay:{relay}"
    if isinstance(to, uuid.UUID):
        target = store.mark_of_message(alias, to)
        if target is None:
            raise RewindRefused(
                f"message {to} is not in the outbox: reap_outbox deleted it, or it was never "
                "published. Rewind to a time instead."
            )
        since = target.created_at
    else:
        if to.tzinfo is None:
            raise ValueError(f"{to.isoformat()} has no time zone; give one (e.g. +00:00)")
        since = to
        target = None
    _refuse_past_retention(alias, since)
    if target is None:
        target = store.first_mark_since(alias, since)
        if target is None:
            return Rewind(relay, None, {}, False, f"nothing was published since {since}")
    positions = [r.position for r in store.reader_positions(alias)
                 if r.name == offset_name and r.partition == 0]
    if not positions:
        return Rewind(relay, target, {}, False,
                      f"relay {relay} has not run yet: it will send everything from the start")
    current = positions[0]
    if target.before >= current.last:
        return Rewind(relay, target, {}, False,
                      f"relay {relay} has not sent message {target.message_id} yet")
    resend = store.count_between(alias, target.before, current)
    moved = not dry_run and store.set_relay_position(
        worker_alias(), offset_name, target.before
    )
    if moved:
        logger.warning(
            "outbox: relay %s rewound to message %s (published %s): %d message(s) are sent again",
            relay, target.message_id, target.created_at.isoformat(), sum(resend.values()),
        )
    return Rewind(relay, target, resend, moved)


def _refuse_past_retention(alias: str, since: datetime) -> None:
    now = store.database_now(alias)
    kept = now - timedelta(seconds=outbox_settings.RETENTION)
    if since < kept:
        oldest = store.oldest_mark(alias)
        has = (f"the oldest message kept is {oldest.message_id}, published {oldest.created_at}"
               if oldest else "the outbox is empty")
        raise RewindRefused(
            f"{since} is older than what the outbox keeps: reap_outbox deletes messages older "
            f'than OUTBOX["RETENTION"] that every reader has passed, so messages published '
            f"between {since} and {kept} may be missing and would not be sent again, and "
            f"receivers have forgotten their ids ({has}). Rewind to {kept} or later."
        )
