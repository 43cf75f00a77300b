"""Consumers in threads of one process keep their routing and tenant to themselves.

A consumer's batch sends its thread's tenant work to the worker alias
(``tenancy.aliases.working_as_worker``, a context variable) and sets the
tenant per connection wrapper (Django's are per thread). Two batches of two
tenants run at once in two threads, and a third thread does web work at the
same moment: each must see only its own alias, tenant and rows.
"""

from __future__ import annotations

import threading
from typing import Any

from django.db import connections, router

from outbox import Consumer, Message
from outbox.consumers import ensure_offsets, run_batch
from tenancy import current_tenant_id, tenant_context
from tenancy.aliases import app_alias, tenant_alias, worker_alias
from tests.helpers import observer
from tests.outbox.support.helpers import publish_as
from tests.testapp.models import Order

A, B, WEB = 1, 2, 3
PATIENCE = 60.0

#: All three threads are inside their contexts (first wait), have looked
#: (second wait): nobody leaves while another one looks.
meet = threading.Barrier(3, timeout=PATIENCE)
seen: dict[str, dict[str, Any]] = {}


def look() -> dict[str, Any]:
    """Where this thread's tenant work goes now, as which tenant, seeing which rows."""
    alias = tenant_alias()
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT current_user, current_setting('app.tenant_id', true)")
        user, setting = cursor.fetchone()
    return {
        "alias": alias,
        "routed": (router.db_for_read(Order), router.db_for_write(Order)),
        "tenant": current_tenant_id(),
        "user": user,
        "setting": setting,
        "in_transaction": connections[alias].in_atomic_block,
        "notes": sorted(Order.objects.values_list("note", flat=True)),
    }


class Probe(Consumer):
    topics: list[str] = []
    batch_size = 1

    def handle(self, message: Message) -> None:
        meet.wait()
        seen[self.name] = {**look(), "message_tenant": message.tenant_id}
        Order.objects.create(tenant_id=message.tenant_id, sku="probe",
                             note=f"handled {self.name}")
        meet.wait()


class ProbeA(Probe):
    name = "thread-probe-a"
    topics = ["probe.a"]


class ProbeB(Probe):
    name = "thread-probe-b"
    topics = ["probe.b"]


def web() -> None:
    meet.wait()
    seen["web, no tenant"] = {"alias": tenant_alias(), "routed": (
        router.db_for_read(Order), router.db_for_write(Order)), "tenant": current_tenant_id()}
    with tenant_context(WEB):
        seen["web"] = look()
    meet.wait()


def test_two_consumer_threads_of_two_tenants_and_a_web_thread_do_not_share_context():
    meet.reset()
    seen.clear()
    with observer() as conn:  # each tenant already has an order the others must not see
        for tenant in (A, B, WEB):
            conn.execute("INSERT INTO testapp_order (tenant_id, sku, quantity, note)"
                         " VALUES (%s, 'seed', 1, %s)", [tenant, f"seed {tenant}"])
    publish_as(A, "probe.a", {"n": 1})
    publish_as(B, "probe.b", {"n": 2})
    consumers = {A: ProbeA(), B: ProbeB()}
    for consumer in consumers.values():
        ensure_offsets(consumer)
    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def run(target: Any, *args: Any) -> None:
        try:
            results[threading.current_thread().name] = target(*args)
        except BaseException as exc:  # reported below
            errors.append(exc)
            meet.abort()
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=run, args=(run_batch, consumers[A]), name="a"),
        threading.Thread(target=run, args=(run_batch, consumers[B]), name="b"),
        threading.Thread(target=run, args=(web,), name="web"),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PATIENCE * 2)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert errors == []
    assert results["a"].handled == results["b"].handled == 1, results
    assert not results["a"].failed and not results["b"].failed, results

    worker = worker_alias()
    worker_role = connections[worker].settings_dict["USER"]
    app_role = connections[app_alias()].settings_dict["USER"]
    for tenant, consumer in consumers.items():
        got = seen[consumer.name]
        assert got == {
            "alias": worker,
            "routed": (worker, worker),
            "tenant": tenant,
            "user": worker_role,
            "setting": str(tenant),
            "in_transaction": True,
            "notes": [f"seed {tenant}"],
            "message_tenant": tenant,
        }, consumer.name
    assert seen["web, no tenant"] == {
        "alias": app_alias(), "routed": (app_alias(), app_alias()), "tenant": None,
    }
    assert seen["web"] == {
        "alias": app_alias(),
        "routed": (app_alias(), app_alias()),
        "tenant": WEB,
        "user": app_role,
        "setting": str(WEB),
        "in_transaction": True,
        "notes": [f"seed {WEB}"],
    }
    # Each handler's write landed as its own tenant, committed with its batch.
    with observer() as conn:
        assert conn.execute(
            "SELECT tenant_id, note FROM testapp_order WHERE sku = 'probe' ORDER BY tenant_id"
        ).fetchall() == [(A, "handled thread-probe-a"), (B, "handled thread-probe-b")]
