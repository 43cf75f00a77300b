"""The demo must not rot: run the example shop and its scenario, check the counts."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.live import ROOT


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "DEMO_RUN": str(run_dir), "DEMO_DB": "shop_demo_test"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    up = subprocess.run(
        ["scripts/demo", "up", "--no-scenario"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        yield run_dir, env
    finally:
        subprocess.run(
            ["scripts/demo", "down", "--keep-services"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=120,
        )


def test_the_demo_scenario_ends_with_every_effect_exactly_once(demo):
    run_dir, env = demo
    scenario_env = dict(env)
    for line in (run_dir / "env").read_text().splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        scenario_env[name] = value
    result = subprocess.run(
        [str(ROOT / ".venv/bin/python"), "-m", "example_project.scenario"],
        cwd=ROOT,
        env=scenario_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    assert "Every effect happened exactly once." in result.stdout
    counts = json.loads((run_dir / "counts.json").read_text())
    assert counts["orders"] == counts["expected_orders"] == counts["projected_orders"] == 4
    assert counts["paid_orders"] == counts["payments_charged"] == 2
    assert counts["gateway_charges"] == counts["receipts"] == counts["expected_paid"] == 2
    assert counts["bob_orders"] == 0


def test_the_openapi_schema_documents_the_idempotency_key_and_errors(demo):
    import requests

    run_dir, _ = demo
    base = next(
        line.split("=", 1)[1]
        for line in (run_dir / "env").read_text().splitlines()
        if line.startswith("export DEMO_BASE_URL=")
    )
    schema = requests.get(base + "/schema/?format=json", timeout=10).json()
    for path in ("/orders/", "/orders/{id}/capture/"):
        operation = schema["paths"][path]["post"]
        headers = [p for p in operation["parameters"] if p["in"] == "header"]
        assert [h["name"] for h in headers] == ["Idempotency-Key"]
        assert headers[0]["required"] is True
        assert {"400", "409", "422"} <= set(operation["responses"])


def test_the_admins_view_site_is_a_page_and_no_page_may_be_framed(demo):
    import re

    import requests

    run_dir, _ = demo
    base = next(
        line.split("=", 1)[1]
        for line in (run_dir / "env").read_text().splitlines()
        if line.startswith("export DEMO_BASE_URL=")
    )
    session = requests.Session()
    login = session.get(base + "/admin/login/", timeout=10)
    assert login.headers["X-Frame-Options"] == "DENY"
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text).group(1)
    admin = session.post(base + "/admin/login/?next=/admin/", timeout=10, data={
        "csrfmiddlewaretoken": token, "username": "ops", "password": "ops",
        "next": "/admin/"}, headers={"Referer": base + "/admin/login/"})
    assert admin.url.endswith("/admin/"), admin.text[:300]
    site = re.search(r'<a href="([^"]+)">View site</a>', admin.text).group(1)
    page = session.get(base + site, timeout=10)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert page.headers["X-Frame-Options"] == "DENY"
    assert session.get(base + "/orders/", timeout=10).headers["X-Frame-Options"] == "DENY"


def test_every_process_of_the_demo_is_started_again_when_it_dies(demo):
    import signal
    import time

    run_dir, _ = demo
    names = ["gateway", "web", "worker", "beat", "relay", "consumers"]
    assert set(names) <= {line.split(":")[0] for line in (run_dir / "Procfile").read_text()
                          .splitlines()}
    before = {name: int((run_dir / f"{name}.pid").read_text()) for name in names}
    for name in ("relay", "consumers", "beat"):
        os.kill(before[name], signal.SIGKILL)
    deadline = time.monotonic() + 60
    after = before
    while time.monotonic() < deadline:
        after = {name: int((run_dir / f"{name}.pid").read_text()) for name in names}
        if all(after[n] != before[n] for n in ("relay", "consumers", "beat")):
            break
        time.sleep(0.2)
    assert {n: after[n] != before[n] for n in names} == {
        "gateway": False, "web": False, "worker": False, "beat": True, "relay": True,
        "consumers": True}
    log = (run_dir / "supervise.log").read_text()
    for name in ("relay", "consumers", "beat"):
        assert f"{name} (pid {before[name]}) exited (SIGKILL)" in log
        assert f"{name} started again as pid {after[name]}" in log


def _environment(run_dir) -> dict[str, str]:
    return {
        name.removeprefix("export "): value
        for name, _, value in (line.partition("=") for line in
                               (run_dir / "env").read_text().splitlines())
    }


def test_slow_request_bodies_wait_in_nginx_not_in_the_web_server(demo):
    import select
    import socket
    from urllib.parse import urlsplit

    import requests

    run_dir, _ = demo
    base = _environment(run_dir)["DEMO_BASE_URL"]
    address = urlsplit(base)
    access_log = ROOT / ".run" / "nginx" / "access.log"
    logged_before = access_log.read_bytes().count(b'"POST /orders/ HTTP/1.1" 408 ')
    # Sixteen clients (twice the web server's threads: 2 workers x 4) send their
    # headers and the first byte of a body, then nothing.
    stalled = []
    for _ in range(16):
        client = socket.create_connection((address.hostname, address.port), timeout=30)
        client.sendall(b"POST /orders/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
        stalled.append(client)
    try:
        # Another client is answered meanwhile...
        assert requests.get(base + "/schema/", timeout=20).status_code == 200
        # ...while no stalled one has an answer yet; then nginx hangs up on each, once
        # client_body_timeout has passed, and logs it as 408 (the web server never saw them).
        assert select.select(stalled, [], [], 0)[0] == []
        for client in stalled:
            assert client.recv(200) == b""
    finally:
        for client in stalled:
            client.close()
    logged = access_log.read_bytes().count(b'"POST /orders/ HTTP/1.1" 408 ') - logged_before
    assert logged == 16


def test_the_demos_roles_have_statement_and_idle_in_transaction_timeouts(demo):
    import psycopg

    run_dir, _ = demo
    environment = _environment(run_dir)
    expected = {"DATABASE_URL": ("5s", "15s"), "WORKER_DATABASE_URL": ("30s", "1min"),
                "SYSTEM_DATABASE_URL": ("1min", "1min")}
    for variable, timeouts in expected.items():
        with psycopg.connect(environment[variable], autocommit=True,
                             prepare_threshold=None) as conn:
            shown = tuple(conn.execute(f"SHOW {name}").fetchone()[0] for name in
                          ("statement_timeout", "idle_in_transaction_session_timeout"))
            assert shown == timeouts, variable
    with psycopg.connect(environment["DATABASE_URL"], autocommit=True,
                         prepare_threshold=None) as web:  # through the demo's pgbouncer
        with pytest.raises(psycopg.errors.QueryCanceled):
            web.execute("SELECT pg_sleep(6)")
