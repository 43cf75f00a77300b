"""An on-call operator's flows in a real browser: log in, filter the parked messages, read
one whole, re-drive all ten thousand that a filter matches in the background, and find who
did it in the admin's history; the error column within 1,500 pixels."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.browser.conftest import (
    WIDTH,
    click_and_wait,
    log_in,
    screenshot,
    text_of,
    wait_for,
)
from tests.helpers import count_rows, observer
from tests.live import ROOT

PARKED = "/admin/outbox/parkedmessagerecord/"

GRANT_ERROR = (
    "Traceback (most recent call last):\n"
    '  File "/srv/shop/shop/consumers.py", line 41, in handle\n'
    "    Invoice.objects.create(order=message.payload[\"order\"], total=total)\n"
    "psycopg.errors.InsufficientPrivilege: permission denied for table shop_invoice"
)


def seed(count: int, consumer: str = "orders", topic: str = "order.placed",
         error: str = GRANT_ERROR) -> None:
    """``count`` parked messages over three tenants, in one statement."""
    with observer() as conn:
        conn.execute(
            """
            INSERT INTO outbox_dead_letters (tenant_id, consumer, message_pk, message_id, topic,
                   key, payload, headers, message_created_at, attempts, error, parked_at)
            SELECT 1 + n %% 3, %s, n, gen_random_uuid(), %s, 'order-' || n,
                   jsonb_build_object('sku', %s || n, 'order', 'A-' || n),
                   '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}',
                   now() - interval '20 minutes', 5, %s, now() - interval '15 minutes'
              FROM generate_series(1, %s) AS n
            """,
            [consumer, topic, f"{consumer}-", error, count],
        )


def worker(log: Path) -> subprocess.Popen[bytes]:
    """``outbox_parked --work --every 0.5``, as an operator runs it beside the consumers."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "django", "outbox_parked", "--work", "--every", "0.5"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )


def test_an_operator_redrives_ten_thousand_parked_messages_from_the_admin(
        browser, server, operator, tmp_path):
    seed(10_000)
    seed(3, consumer="orders-slow", topic="order.slow",
         error="Traceback (most recent call last):\nTimeoutError: the gateway did not answer")
    log_in(browser, server, PARKED)

    # Filter: the consumer whose grant was broken.
    filters = browser.find_element(By.ID, "changelist-filter")
    click_and_wait(browser, filters.find_element(By.LINK_TEXT, "orders"))
    assert "consumer=orders" in browser.current_url
    filtered = browser.current_url
    assert "10000 parked messages" in browser.find_element(By.CSS_SELECTOR, ".paginator").text
    assert "InsufficientPrivilege" in browser.find_element(By.ID, "result_list").text
    screenshot(browser, "admin-parked-messages.png")

    # Read one whole: the traceback, the payload, the headers.
    first = browser.find_element(By.CSS_SELECTOR, "#result_list td.field-message a")
    click_and_wait(browser, first)
    assert browser.find_element(By.ID, "error").text == GRANT_ERROR
    assert '"order": "A-' in browser.find_element(By.ID, "payload").text
    assert "traceparent" in browser.find_element(By.ID, "headers").text
    screenshot(browser, "admin-parked-message.png")
    browser.get(filtered)

    # (The grant is fixed.) Re-drive everything the filter matches.
    wait_for(browser, lambda b: b.find_element(By.ID, "action-toggle").is_displayed(),
             "the admin's actions script")
    browser.find_element(By.ID, "action-toggle").click()
    wait_for(browser, lambda b: "100 of 100 selected" in b.find_element(
        By.CSS_SELECTOR, ".actions").text, "the page's rows selected")
    browser.find_element(By.CSS_SELECTOR, ".actions .question a").click()  # all 10000
    wait_for(browser, lambda b: b.find_element(By.CSS_SELECTOR, ".actions .all").is_displayed(),
             "all 10000 selected")
    Select(browser.find_element(By.NAME, "action")).select_by_value("redrive_selected")
    started = time.monotonic()
    click_and_wait(browser, browser.find_element(By.CSS_SELECTOR, ".actions button[name=index]"))
    assert "Re-drive 10000 parked message(s)?" in browser.title, browser.find_element(
        By.ID, "content").text[:600]
    yes = browser.find_element(By.CSS_SELECTOR, "input[value='Yes, re-drive them']")
    click_and_wait(browser, yes)
    asked = time.monotonic() - started
    assert "/admin/outbox/parkedjob/" in browser.current_url
    assert "will re-drive 10000 parked message(s) in the background" in browser.find_element(
        By.CSS_SELECTOR, ".messagelist").text
    assert count_rows("outbox_dead_letters") == 10_003  # nothing done inside the requests

    work = worker(tmp_path / "worker.log")
    try:
        # The job's page reloads itself every two seconds until the job ends.
        wait_for(browser, lambda b: int(text_of(b, "handled") or 0) > 0,
                 "the first batch", timeout=120)
        screenshot(browser, "admin-parked-job-running.png")
        wait_for(browser, lambda b: text_of(b, "state") == "done",
                 "the job's end", timeout=600)
    finally:
        work.send_signal(signal.SIGTERM)
        work.wait(timeout=60)
    output = (tmp_path / "worker.log").read_text()
    assert work.returncode == 0, output
    assert "job 1 done: 10000 handled, 0 failed again, 0 no longer parked" in output
    browser.refresh()  # a page of its own, no longer reloading
    assert browser.find_element(By.ID, "progress").text == "10000 of 10000 (100%)"
    assert browser.find_element(By.ID, "handled").text == "10000"
    assert browser.find_element(By.ID, "failed").text == "0"
    assert count_rows("outbox_dead_letters", "consumer = 'orders'") == 0
    assert count_rows("outbox_dead_letters", "consumer = 'orders-slow'") == 3  # not matched
    with observer() as conn:
        assert conn.execute("SELECT count(*), count(DISTINCT note) FROM testapp_order"
                            ).fetchone() == (10_000, 10_000)  # each effect once

    # Who did it: the job's history in the admin, and the admin's "Recent actions".
    click_and_wait(browser, browser.find_element(By.CSS_SELECTOR, "a.historylink"))
    history = browser.find_element(By.ID, "change-history").text
    assert "ops" in history and "asked to re-drive 10000 parked message(s)" in history
    assert "re-drove the parked messages of consumer orders" in history
    assert "10000 handled, 0 failed again" in history
    screenshot(browser, "admin-parked-job-history.png")
    browser.get(f"{server.url}/admin/")
    assert "job 1: re-drive (done)" in browser.find_element(By.ID, "recent-actions-module").text
    assert asked < 30, f"asking took {asked:.1f} s: gunicorn's timeout is 30 s"


def test_a_message_is_redriven_from_its_page_and_the_error_column_fits_1500_pixels(
        browser, server, operator):
    seed(2, error="Traceback (most recent call last):\nBoom: poison message")
    with observer() as conn:
        conn.execute("UPDATE outbox_dead_letters SET payload = payload || '{\"poison\": true}' "
                     "WHERE message_pk = 2")
    log_in(browser, server, PARKED)
    assert browser.get_window_size()["width"] <= WIDTH
    error_cell = browser.find_element(By.CSS_SELECTOR, "#result_list td.field-last_error")
    right = browser.execute_script(
        "const r = arguments[0].getBoundingClientRect(); return r.left + r.width;", error_cell)
    assert error_cell.text == "Boom: poison message"
    assert right <= browser.execute_script("return window.innerWidth"), right

    links = browser.find_elements(By.CSS_SELECTOR, "#result_list td.field-message a")
    poison = next(a for a in links if a.text.endswith("/2"))
    click_and_wait(browser, poison)
    click_and_wait(browser, browser.find_element(By.ID, "redrive"))
    assert "failed again" in browser.find_element(By.CSS_SELECTOR, ".messagelist").text
    assert browser.find_element(By.ID, "attempts").text == "6"
    assert "re-drove" in browser.find_element(By.ID, "history").text
    click_and_wait(browser, browser.find_element(By.ID, "discard"))
    yes = browser.find_element(By.CSS_SELECTOR, "input[value='Yes, discard it']")
    click_and_wait(browser, yes)
    assert browser.current_url.endswith(PARKED)
    assert count_rows("outbox_dead_letters") == 1
