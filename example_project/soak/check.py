"""After the drain: what happened, counted in the database, and the invariants.

Everything is read with one PostgreSQL superuser session over the cluster's
Unix socket (row-level security does not hide rows from it), the gateway's
own list of charges, and the broker's queue and unacknowledged tasks (Redis's
list and hash, or RabbitMQ's counts from rabbitmqctl).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.request import urlopen

import psycopg
import redis

from .load import Intent


def connect(database: str) -> psycopg.Connection:
    return psycopg.connect(host=os.environ["DIO_PGSOCKET"], port=os.environ["DIO_PGPORT"],
                           user="postgres", dbname=database, autocommit=True)


def gateway_charges(gateway_url: str) -> list[dict]:
    with urlopen(gateway_url + "/charges", timeout=10) as answer:
        return json.load(answer)


def broker_backlog(broker_url: str) -> int:
    """Tasks queued or delivered and not yet acknowledged."""
    if broker_url.startswith("amqp"):
        return rabbitmq_backlog()
    client = redis.Redis.from_url(broker_url)
    try:
        return int(client.llen("celery")) + int(client.hlen("unacked"))
    finally:
        client.close()


def rabbitmq_backlog() -> int:
    """Tasks in the shop's queue (``celery``) of the private RabbitMQ, ready or unacknowledged.

    Only that queue: Celery's workers also have queues of their own for
    remote control and events, where a worker that was killed may leave a
    broadcast nobody reads.
    """
    root = Path(__file__).resolve().parents[2]
    listed = subprocess.run(
        [str(root / "scripts" / "services"), "rabbitmqctl", "list_queues", "name", "messages"],
        capture_output=True, text=True, timeout=60, check=True).stdout
    return sum(int(fields[1]) for fields in (line.split() for line in listed.splitlines())
               if len(fields) == 2 and fields[0] == "celery" and fields[1].isdigit())


def empty_broker(broker_url: str) -> None:
    """Nothing left from an earlier run: Redis's database flushed, RabbitMQ's queue deleted."""
    if broker_url.startswith("amqp"):
        from kombu import Connection

        with Connection(broker_url) as connection:
            connection.default_channel.queue_delete("celery")
        return
    client = redis.Redis.from_url(broker_url)
    client.flushdb()
    client.close()


@dataclass
class Snapshot:
    orders: dict[str, list[tuple]]      # email -> [(id, tenant, quantity, total, status)]
    created: Counter[int]               # order id -> order.created messages
    paid: Counter[int]                  # order id -> order.paid messages
    messages: int
    projection: dict[int, tuple]        # tenant -> (orders, units, revenue)
    payments: dict[int, list[str]]      # order id -> charge ids
    receipts: Counter[int]              # order id -> receipts
    pending_keys: int
    keys: int
    parked: int
    charges: list[dict]
    backlog: int


def snapshot(database: str, gateway_url: str, broker_url: str) -> Snapshot:
    with connect(database) as conn:
        orders: dict[str, list[tuple]] = {}
        for email, *row in conn.execute(
            "SELECT email, id, tenant_id, quantity, total_cents, status FROM shop_order"
        ):
            orders.setdefault(email, []).append(tuple(row))
        by_topic: dict[str, Counter[int]] = {"order.created": Counter(), "order.paid": Counter()}
        messages = 0
        for topic, order, count in conn.execute(
            "SELECT topic, (payload->>'order')::bigint, count(*) FROM outbox_messages GROUP BY 1, 2"
        ):
            messages += count
            by_topic.setdefault(topic, Counter())[order] += count
        projection = {
            tenant: (int(o), int(u), int(r)) for tenant, o, u, r in conn.execute(
                "SELECT tenant_id, sum(orders), sum(units), sum(revenue_cents)"
                " FROM shop_salesdaily GROUP BY 1")
        }
        payments: dict[int, list[str]] = {}
        for order, charge in conn.execute("SELECT order_id, charge_id FROM shop_payment"):
            payments.setdefault(order, []).append(charge)
        receipts = Counter(dict(conn.execute(
            "SELECT order_id, count(*) FROM shop_receipt GROUP BY 1").fetchall()))
        pending, keys = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FROM idempotency_keys"
        ).fetchone()
        parked = conn.execute("SELECT count(*) FROM outbox_dead_letters").fetchone()[0]
    return Snapshot(orders, by_topic["order.created"], by_topic["order.paid"], messages,
                    projection, payments, receipts, pending, keys, parked,
                    gateway_charges(gateway_url), broker_backlog(broker_url))


def missing_receipts(snap: Snapshot) -> list[int]:
    """Paid orders without a receipt."""
    return sorted(row[0] for rows in snap.orders.values() for row in rows
                  if row[4] == "paid" and not snap.receipts[row[0]])


def stalled(snap: Snapshot) -> bool:
    """Receipts missing while the broker holds nothing: the broker lost their messages.

    A message queued, delivered or waiting for a retry is in Redis (its queue,
    or its hash of unacknowledged tasks); one that is in neither and was never
    received is gone (docs/operations.md, "What a killed Celery worker costs").
    """
    return snap.backlog == 0 and snap.pending_keys == 0 and bool(missing_receipts(snap))


def paid_messages(database: str, orders: list[int]) -> list[tuple[str, str]]:
    """(message id, created_at ISO 8601) of the order.paid messages of these orders."""
    with connect(database) as conn:
        return [(str(m), c.isoformat()) for m, c in conn.execute(
            "SELECT message_id, created_at FROM outbox_messages WHERE topic = 'order.paid'"
            " AND (payload->>'order')::bigint = ANY(%s) ORDER BY created_at", [orders])]


def drained(intents: list[Intent], snap: Snapshot) -> bool:
    """Whether everything the intents started has reached its last effect."""
    orders = sum(len(rows) for rows in snap.orders.values())
    paid = sum(1 for rows in snap.orders.values() for row in rows if row[4] == "paid")
    projected = sum(p[0] for p in snap.projection.values())
    return (snap.backlog == 0 and snap.pending_keys == 0 and projected >= orders
            and sum(snap.receipts.values()) >= paid)


def invariants(intents: list[Intent], snap: Snapshot, parked_expected: int = 0
               ) -> list[tuple[str, bool, str]]:
    """(invariant, holds, detail) for each."""
    results: list[tuple[str, bool, str]] = []

    def holds(name: str, bad: list, total: int) -> None:
        detail = f"{total - len(bad)}/{total}" + (f"; first: {bad[:3]}" if bad else "")
        results.append((name, not bad, detail))

    emails = {intent.email: intent for intent in intents}
    holds("every intent got its final answers (order 201, capture 201)",
          [i.number for i in intents if not i.done or i.refused], len(intents))
    holds("each intent: exactly one order, the one its client was given",
          [i.number for i in intents
           if len(snap.orders.get(i.email, [])) != 1
           or (i.order_id is not None and snap.orders[i.email][0][0] != i.order_id)],
          len(intents))
    strays = [email for email in snap.orders if email not in emails]
    results.append(("no order without an intent", not strays, f"{len(strays)} stray"))
    order_ids = {rows[0][0]: email for email, rows in snap.orders.items()}
    holds("each order: exactly one order.created message",
          [o for o in order_ids if snap.created[o] != 1], len(order_ids))
    per_tenant: dict[int, list[int]] = {}
    for rows in snap.orders.values():
        for _id, tenant, quantity, total, _status in rows:
            t = per_tenant.setdefault(tenant, [0, 0, 0])
            t[0] += 1
            t[1] += quantity
            t[2] += total
    holds("each order counted once in the sales projection (orders, units, revenue per tenant)",
          [t for t, v in per_tenant.items() if tuple(v) != snap.projection.get(t)],
          len(per_tenant))
    captured = [i for i in intents if i.charge is not None]
    charge_keys = Counter(c["id"] for c in snap.charges)
    holds("each captured intent: its order paid, one payment with the charge its client got",
          [i.number for i in captured
           if snap.orders.get(i.email, [(0, 0, 0, 0, "")])[0][4] != "paid"
           or snap.payments.get(i.order_id or 0) != [i.charge]], len(captured))
    paid = [rows[0][0] for rows in snap.orders.values() if rows[0][4] == "paid"]
    holds("each paid order: exactly one gateway charge",
          [o for o in paid
           if [charge_keys[c] for c in snap.payments.get(o, [])] != [1]], len(paid))
    charged = {c for charges in snap.payments.values() for c in charges}
    extra = [c["id"] for c in snap.charges if c["id"] not in charged]
    results.append(("no gateway charge without its payment", not extra,
                    f"{len(snap.charges) - len(extra)}/{len(snap.charges)}"))
    holds("each paid order: exactly one order.paid message",
          [o for o in paid if snap.paid[o] != 1], len(paid))
    holds("each paid order: exactly one receipt",
          [o for o in paid if snap.receipts[o] != 1], len(paid))
    results.append(("no idempotency key pending", snap.pending_keys == 0,
                    f"{snap.pending_keys} pending"))
    results.append((f"parked messages: {parked_expected} (none injected)",
                    snap.parked == parked_expected, f"{snap.parked} parked"))
    results.append(("nothing left in the broker", snap.backlog == 0,
                    f"{snap.backlog} queued or unacknowledged"))
    return results


def counts(intents: list[Intent], snap: Snapshot) -> list[tuple[str, int]]:
    return [
        ("intents", len(intents)),
        ("orders", sum(len(rows) for rows in snap.orders.values())),
        ("outbox messages", snap.messages),
        ("  order.created", sum(snap.created.values())),
        ("  order.paid", sum(snap.paid.values())),
        ("projection rows (orders counted)", sum(p[0] for p in snap.projection.values())),
        ("captures (answered 201)", sum(1 for i in intents if i.charge is not None)),
        ("gateway charges", len(snap.charges)),
        ("payments", sum(len(c) for c in snap.payments.values())),
        ("receipts", sum(snap.receipts.values())),
        ("idempotency keys", snap.keys),
        ("pending keys", snap.pending_keys),
        ("parked messages", snap.parked),
    ]
