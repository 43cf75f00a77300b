"""A key's stored answer in a real browser: the operator filters the keys by tenant and
state and opens one."""

from __future__ import annotations

from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tenancy import tenant_context
from tests.browser.conftest import click_and_wait, log_in, screenshot
from tests.idempotency.factories import KeyFactory, PendingKeyFactory

KEYS = "/admin/idempotency/idempotencykeyrecord/"


def test_an_operator_reads_a_keys_stored_answer(browser, server, operator):
    with tenant_context(42):
        KeyFactory(key="checkout-7f3a", response=b'{"id": 1017, "sku": "tea", "quantity": 2}',
                   response_headers=[["Content-Type", "application/json"],
                                     ["Location", "/orders/1017/"]])
        PendingKeyFactory(key="capture-2b9e")
    with tenant_context(7):
        KeyFactory(key="checkout-other-tenant")
    log_in(browser, server, KEYS)
    box = browser.find_element(By.CSS_SELECTOR, "#changelist-filter input[name=tenant_id]")
    box.send_keys("42")
    old = browser.find_element(By.TAG_NAME, "html")
    box.send_keys(Keys.ENTER)
    from tests.browser.conftest import wait_for
    wait_for(browser, lambda b: "tenant_id=42" in b.current_url, "the tenant filter")
    assert old
    listed = browser.find_element(By.ID, "result_list").text
    assert "checkout-7f3a" in listed and "capture-2b9e" in listed
    assert "checkout-other-tenant" not in listed
    click_and_wait(browser, browser.find_element(By.LINK_TEXT, "Completed"))
    assert "capture-2b9e" not in browser.find_element(By.ID, "result_list").text
    click_and_wait(browser, browser.find_element(By.LINK_TEXT, "checkout-7f3a"))
    assert browser.find_element(By.ID, "status").text == "201"
    assert "/orders/1017/" in browser.find_element(By.ID, "answer").text
    assert '"quantity": 2' in browser.find_element(By.ID, "body").text
    screenshot(browser, "admin-idempotency-key.png")
