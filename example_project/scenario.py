"""The narrated demo: what goes wrong in real life, and how the shop copes.

Run by ``make demo`` against the running shop (``python -m example_project.scenario``
with the environment of ``.run/demo/env``). Prints every request and answer,
and ends with the counts that show each effect happened exactly once; exits
non-zero if any count is off. ``run()`` returns those counts (the test suite
checks them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import requests

BOLD, DIM, GREEN, RED, RESET = "\033[1m", "\033[2m", "\033[32m", "\033[31m", "\033[0m"
if not sys.stdout.isatty():
    BOLD = DIM = GREEN = RED = RESET = ""


class Shop:
    def __init__(self) -> None:
        self.base = os.environ["DEMO_BASE_URL"]
        self.gateway = os.environ["GATEWAY_URL"]
        self.run_dir = Path(os.environ["DEMO_RUN"])
        seed = json.loads((self.run_dir / "seed.json").read_text())
        self.users = seed

    def headers(self, user: str, key: str | None = None) -> dict[str, str]:
        h = {"Authorization": f"Token {self.users[user]['token']}"}
        if key:
            h["Idempotency-Key"] = key
        return h

    def post(
        self,
        user: str,
        path: str,
        body: Any = None,
        key: str | None = None,
        quiet: bool = False,
        timeout: float = 15,
    ) -> requests.Response:
        if not quiet:
            shown = f" {json.dumps(body)}" if body is not None else ""
            print(f"  {DIM}→ {user}: POST {path} Idempotency-Key: {key}{shown}{RESET}")
        response = requests.post(
            self.base + path, json=body, headers=self.headers(user, key), timeout=timeout
        )
        if not quiet:
            show(response)
        return response

    def get(self, user: str, path: str) -> requests.Response:
        return requests.get(self.base + path, headers=self.headers(user), timeout=15)

    def gateway_control(self, **settings: Any) -> None:
        requests.post(self.gateway + "/control", json=settings, timeout=5).raise_for_status()

    def gateway_stats(self) -> dict[str, int]:
        return requests.get(self.gateway + "/stats", timeout=5).json()


def show(response: requests.Response) -> None:
    replayed = ", Idempotent-Replayed: true" if response.headers.get("Idempotent-Replayed") else ""
    retry = (
        f", Retry-After: {response.headers['Retry-After']}"
        if "Retry-After" in response.headers
        else ""
    )
    body = response.text if len(response.text) < 160 else response.text[:157] + "..."
    print(f"  {DIM}← {response.status_code} {response.reason}{replayed}{retry} {body}{RESET}")


def title(n: int, text: str) -> None:
    print(f"\n{BOLD}{n}. {text}{RESET}")


def note(text: str) -> None:
    print(f"  {text}")


def key() -> str:
    return str(uuid.uuid4())


def expect(condition: bool, what: str) -> None:
    mark = f"{GREEN}✓{RESET}" if condition else f"{RED}✗{RESET}"
    print(f"  {mark} {what}")
    if not condition:
        raise AssertionError(what)


def stock(shop: Shop, user: str, sku: str) -> int:
    for product in shop.get(user, "/products/").json():
        if product["sku"] == sku:
            return product["stock"]
    raise KeyError(sku)


def wait_until(check: Any, seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()


def run() -> dict[str, Any]:
    shop = Shop()
    shop.gateway_control(delay=0, decline=False, fail=0)
    start_green = stock(shop, "alice", "TEA-GREEN")
    created: list[int] = []  # orders that exist
    captured: list[int] = []  # orders that were paid

    title(1, "A retry after a lost response")
    k1 = key()
    first = shop.post(
        "alice",
        "/orders/",
        {"product": "TEA-GREEN", "quantity": 2, "email": "ann@example.com"},
        key=k1,
    )
    created.append(first.json()["id"])
    note("The answer was lost on the way (a dropped mobile connection): the app retries.")
    again = shop.post(
        "alice",
        "/orders/",
        {"product": "TEA-GREEN", "quantity": 2, "email": "ann@example.com"},
        key=k1,
    )
    expect(
        again.status_code == 201
        and again.json() == first.json()
        and again.headers.get("Idempotent-Replayed") == "true",
        "the retry gets the first answer again, marked Idempotent-Replayed",
    )
    expect(stock(shop, "alice", "TEA-GREEN") == start_green - 2, "stock was reserved once")

    title(2, "A double click: two identical requests at the same moment")
    k2 = key()
    body2 = {"product": "TEA-BLACK", "quantity": 1, "email": "ann@example.com"}
    answers: list[requests.Response] = []
    barrier = threading.Barrier(2)

    def click() -> None:
        barrier.wait()
        answers.append(shop.post("alice", "/orders/", body2, key=k2, quiet=True))

    threads = [threading.Thread(target=click) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for response in answers:
        show(response)
    statuses = sorted(r.status_code for r in answers)
    new = [r for r in answers if r.status_code == 201 and not r.headers.get("Idempotent-Replayed")]
    expect(
        len(new) == 1 and statuses in ([201, 201], [201, 409]),
        "one order; the other click got 409 (still in progress) or the replay",
    )
    created.append(new[0].json()["id"])

    title(3, "The same key for a different request")
    mismatch = shop.post(
        "alice",
        "/orders/",
        {"product": "TEA-GREEN", "quantity": 5, "email": "ann@example.com"},
        key=k1,
    )
    expect(mismatch.status_code == 422, "422: the key belongs to another request")
    expect(stock(shop, "alice", "TEA-GREEN") == start_green - 2, "nothing was reserved")

    title(4, "Another merchant tries to reach Acme's order")
    target = created[0]
    peek = shop.get("bob", f"/orders/{target}/")
    print(f"  {DIM}→ bob: GET /orders/{target}/{RESET}")
    show(peek)
    expect(peek.status_code == 404, "404: row-level security hides it from Bolt Coffee")
    steal = shop.post("bob", f"/orders/{target}/capture/", key=key())
    expect(steal.status_code == 404, "404: and it cannot be captured either")

    title(5, "The payment gateway times out, the client retries")
    order5 = created[0]
    shop.gateway_control(delay=2.0)
    k5 = key()
    note("The gateway answers after 2 s; the shop waits 1 s for it.")
    timeout = shop.post("alice", f"/orders/{order5}/capture/", key=k5)
    expect(timeout.status_code == 503, "503 with Retry-After: transient, nothing final stored")
    time.sleep(2.2)
    shop.gateway_control(delay=0)
    note("The gateway recovers; the client retries with the same key.")
    paid = shop.post("alice", f"/orders/{order5}/capture/", key=k5)
    expect(paid.status_code == 201, "201: the capture resumed where it stopped")
    captured.append(order5)
    expect(
        shop.gateway_stats()["charges"] == 1,
        "one charge: the gateway had charged during the timeout, the retry used the same key",
    )

    title(6, "A web worker is killed in the middle of a capture")
    order6 = created[1]
    k6 = key()
    shop.gateway_control(delay=0.8)
    result: dict[str, Any] = {}

    def capture() -> None:
        try:
            result["response"] = shop.post(
                "alice", f"/orders/{order6}/capture/", key=k6, quiet=True
            )
        except requests.RequestException as exc:
            result["error"] = exc

    thread = threading.Thread(target=capture)
    print(f"  {DIM}→ alice: POST /orders/{order6}/capture/ Idempotency-Key: {k6}{RESET}")
    thread.start()
    time.sleep(0.4)
    master = int((shop.run_dir / "web.pid").read_text())
    workers = subprocess.run(
        ["pgrep", "-P", str(master)], capture_output=True, text=True
    ).stdout.split()
    for pid in workers:
        os.kill(int(pid), signal.SIGKILL)
    note(f"SIGKILL to the web workers {', '.join(workers)} while the gateway is charging.")
    thread.join(15)
    # The proxy in front of gunicorn (HAProxy) answers 502 for the dead worker; a
    # client talking to gunicorn directly sees its connection die instead.
    lost = result.get("error") or getattr(result.get("response"), "status_code", None)
    expect(
        "error" in result or lost == 502,
        f"the client lost its answer ({lost if isinstance(lost, int) else type(lost).__name__})",
    )
    shop.gateway_control(delay=0)
    note("The client retries; the dead worker's lease must run out first (409 meanwhile).")
    while True:
        try:
            retry = shop.post("alice", f"/orders/{order6}/capture/", key=k6)
        except (requests.ConnectionError, requests.Timeout):
            # the new web workers are still starting (slow on a busy machine):
            # a client retries a timed-out request with the same key too.
            time.sleep(0.5)
            continue
        if retry.status_code != 409:
            break
        time.sleep(1.0)
    expect(retry.status_code == 201, "201: a new worker took the key over and resumed")
    captured.append(order6)
    expect(shop.gateway_stats()["charges"] == 2, "still one charge per captured order")

    title(7, "An out-of-order commit")
    note("Transaction A takes the next order id and stays open; transaction B commits after it.")
    order_a, order_b = out_of_order_commit(shop)
    created.extend([order_a, order_b])

    title(8, "Requests that cannot go anywhere leave nothing behind")
    bad = shop.post("alice", "/orders/abc/capture/", key=key())
    expect(bad.status_code == 404, "404: 'abc' is no order (not a 500)")
    twice = shop.post("alice", f"/orders/{order5}/capture/", key=key())
    expect(
        twice.status_code == 409 and twice.json().get("code") == "already_paid",
        "409: that order is already paid (a new key cannot charge it again)",
    )
    expect(pending_keys() == 0, "no idempotency key is left pending by either")

    title(9, "Counting: every effect exactly once")
    counts = final_counts(shop, created, captured, start_green)
    (shop.run_dir / "counts.json").write_text(json.dumps(counts, indent=2))

    title(10, "What operators see: a message nobody can handle, metrics, health")
    operators(shop)
    return counts


def operators(shop: Shop) -> None:
    """A malformed event is parked by the sales projection; /metrics and the health
    check say so, and the admin lists it (docs/operations.md)."""
    import django

    django.setup()
    from outbox import publish
    from outbox.deadletters import list_parked
    from tenancy import tenant_context

    merchant = shop.users["alice"]["merchant"]
    note("An older app version publishes order.created without its 'day' field.")
    with tenant_context(merchant):
        publish("order.created", {"order": 0, "quantity": 1, "total": 0}, key="order:legacy")
    expect(
        wait_until(lambda: any(p.consumer == "sales" for p in list_parked("sales"))),
        "the sales projection parked it after 3 attempts; the stream kept flowing",
    )
    text = requests.get(shop.base + "/metrics", timeout=10).text
    shown = [line for line in text.splitlines()
             if line.startswith(("dio_idempotency_requests_total", "dio_outbox_parked",
                                 "dio_outbox_lag_seconds", "dio_outbox_consumed_total"))]
    for line in shown:
        note(f"{DIM}{line}{RESET}")
    expect(any(line.startswith('dio_outbox_parked_messages{consumer="sales"} 1')
               for line in shown), "/metrics counts the parked message")
    health = requests.get(shop.base + "/healthz/outbox", timeout=10)
    expect(health.status_code == 200, f"/healthz/outbox: {health.json()['status']}")
    note(f"Re-drive or discard it in the admin: {shop.base}/admin/outbox/parkedmessagerecord/"
         f"; the trace of each order: {shop.base}/traces/")


def out_of_order_commit(shop: Shop) -> tuple[int, int]:
    """A (open) publishes before B; B commits first; then A commits. Both are projected."""
    import django

    django.setup()
    from django.db import transaction

    from example_project.shop.models import Order, Product
    from outbox import publish
    from tenancy import tenant_context
    from tenancy.aliases import app_alias

    merchant = shop.users["alice"]["merchant"]
    before = sales_orders(merchant)
    with tenant_context(merchant):
        product = Product.objects.get(sku="TEA-GREEN")
        Product.objects.filter(pk=product.pk).update(stock=product.stock - 1)
        order_a = Order.objects.create(
            tenant_id=merchant,
            product=product,
            quantity=1,
            total_cents=product.price_cents,
            email="a@example.com",
        )
        publish(
            "order.created",
            {
                "order": order_a.pk,
                "sku": product.sku,
                "quantity": 1,
                "total": product.price_cents,
                "day": order_a.created_at.date().isoformat(),
            },
            key=f"order:{order_a.pk}",
        )
        note(f"A: order {order_a.pk} and its event written, not committed.")
        b = shop.post(
            "alice",
            "/orders/",
            {"product": "TEA-BLACK", "quantity": 1, "email": "b@example.com"},
            key=key(),
        )
        note(f"B: order {b.json()['id']} committed (its event has a higher id than A's).")
        time.sleep(1.5)
        seen = sales_orders(merchant) - before
        expect(
            seen == 0,
            "the consumer waits: A is still open below it (an `id >` reader "
            "would have taken B and skipped A forever)",
        )
        transaction.on_commit(lambda: note("A commits."), using=app_alias())
    expect(
        wait_until(lambda: sales_orders(merchant) - before == 2),
        "after A commits, the projection counts A and B, once each",
    )
    return order_a.pk, b.json()["id"]


def sales_orders(merchant: int) -> int:
    from django.db.models import Sum

    from example_project.shop.models import SalesDaily
    from tenancy import tenant_context

    with tenant_context(merchant):
        return SalesDaily.objects.aggregate(n=Sum("orders"))["n"] or 0


def final_counts(
    shop: Shop, created: list[int], captured: list[int], start_green: int
) -> dict[str, Any]:
    import django

    django.setup()
    from django.db.models import Sum

    from example_project.shop.models import Order, Payment, Receipt, SalesDaily
    from tenancy import tenant_context

    merchant = shop.users["alice"]["merchant"]
    expect(
        wait_until(lambda: receipts(merchant) >= len(captured)),
        "the receipt e-mails went out (Celery, from relayed events)",
    )
    time.sleep(1.0)  # a duplicate delivery would show up here
    with tenant_context(merchant):
        counts = {
            "orders": Order.objects.count(),
            "paid_orders": Order.objects.filter(status="paid").count(),
            "payments_charged": Payment.objects.exclude(charge_id="").count(),
            "projected_orders": SalesDaily.objects.aggregate(n=Sum("orders"))["n"] or 0,
            "receipts": Receipt.objects.count(),
        }
    with tenant_context(shop.users["bob"]["merchant"]):
        counts["bob_orders"] = Order.objects.count()
    counts["gateway_charges"] = shop.gateway_stats()["charges"]
    counts["expected_orders"] = len(created)
    counts["expected_paid"] = len(captured)
    width = max(len(k) for k in counts)
    for name, value in counts.items():
        print(f"  {name:<{width}}  {value}")
    expect(
        counts["orders"] == len(created) == counts["projected_orders"],
        "orders created = orders projected by the consumer",
    )
    expect(
        counts["paid_orders"]
        == counts["payments_charged"]
        == counts["gateway_charges"]
        == counts["receipts"]
        == len(captured),
        "paid orders = charged payments = gateway charges = receipts",
    )
    expect(counts["bob_orders"] == 0, "Bolt Coffee has no orders: nothing crossed tenants")
    return counts


def pending_keys() -> int:
    """Pending idempotency keys of every merchant (read as the system role)."""
    import django

    django.setup()
    from idempotency.models import IdempotencyKey

    return IdempotencyKey.objects.using("system").filter(state="pending").count()


def receipts(merchant: int) -> int:
    from example_project.shop.models import Receipt
    from tenancy import tenant_context

    with tenant_context(merchant):
        return Receipt.objects.count()


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    try:
        run()
    except AssertionError as exc:
        print(f"\n{RED}The demo found a problem: {exc}{RESET}")
        return 1
    print(f"\n{GREEN}Every effect happened exactly once.{RESET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
