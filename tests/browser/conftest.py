"""The admin in a real browser: Debian's Chromium, driven by Selenium, against gunicorn.

``scripts/services run ... chromium`` (what ``make test`` runs) installs the
browser and its driver as root and exports DIO_CHROMIUM and DIO_CHROMEDRIVER;
Selenium is given both paths, so it never looks for a driver of its own.
With DIO_SCREENSHOTS set to a directory (``make screenshots``: docs/img), the
tests save the pages the docs show there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.live import LiveServer

WIDTH = 1500

CHROMIUM = os.environ.get("DIO_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("DIO_CHROMEDRIVER", "/usr/bin/chromedriver")


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = LiveServer(workers=2, threads=4).start()  # gunicorn's 30 s timeout, as deployed
    yield live
    live.stop()


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run the tests under `scripts/services run "
                    "... chromium --` (make test does), which installs Debian's chromium and "
                    "chromium-driver as root")
    profile = tempfile.mkdtemp(prefix="dio-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={WIDTH},1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def operator() -> Iterator[User]:
    user = User.objects.create_superuser("ops", "ops@example.com", "a long passphrase")
    yield user
    User.objects.all().delete()


def log_in(browser: WebDriver, server: LiveServer, path: str) -> None:
    """Sign in through the admin's login form, as a person would, and land on ``path``."""
    browser.get(f"{server.url}/admin/login/?next={path}")
    browser.find_element(By.ID, "id_username").send_keys("ops")
    browser.find_element(By.ID, "id_password").send_keys("a long passphrase")
    browser.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
    wait_for(browser, lambda b: b.current_url.endswith(path), f"landing on {path}")


def wait_for(browser: WebDriver, condition, what: str, timeout: float = 60) -> None:
    # A page that reloads itself (a job's) may be replaced between finding and reading.
    WebDriverWait(browser, timeout, poll_frequency=0.2, ignored_exceptions=(
        NoSuchElementException, StaleElementReferenceException,
    )).until(condition, f"waited for {what}")


def text_of(browser: WebDriver, element_id: str) -> str:
    """An element's text, read in one step (a page that reloads itself may be replaced
    between finding an element and reading it)."""
    return str(browser.execute_script(
        "const e = document.getElementById(arguments[0]); return e ? e.textContent.trim() : '';",
        element_id))


def click_and_wait(browser: WebDriver, element) -> None:
    """Click something that loads a new page, and wait until it has."""
    old = browser.find_element(By.TAG_NAME, "html")
    element.click()
    wait_for(browser, lambda b: _stale(old) and b.execute_script(
        "return document.readyState") == "complete", "the next page")


def _stale(element) -> bool:
    try:
        element.is_enabled()
        return False
    except Exception:  # StaleElementReferenceException: the page was replaced
        return True


def screenshot(browser: WebDriver, name: str) -> None:
    """Save the whole page as ``$DIO_SCREENSHOTS/name`` (docs/img with make screenshots)."""
    where = os.environ.get("DIO_SCREENSHOTS")
    if not where:
        return
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(WIDTH, min(max(int(height) + 20, 400), 2400))
    Path(where).mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(Path(where) / name))
    browser.set_window_size(WIDTH, 1000)
