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


def _raw(address, request: bytes, timeout: float = 30) -> bytes:
    """What the demo's proxy answers to ``request``, sent as bytes on a connection of its own."""
    import socket

    with socket.create_connection((address.hostname, address.port), timeout=timeout) as client:
        client.sendall(request)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    return answer


def test_slow_request_bodies_wait_in_the_proxy_and_a_stalled_one_is_answered_408(demo):
    """Issue 29, item 9: a body that stalls was cut after 10 s with no answer at all (nginx
    only logged a 408); the demo's proxy answers it 408, and the web server never sees it."""
    import select
    import socket
    from urllib.parse import urlsplit

    import requests

    run_dir, _ = demo
    base = _environment(run_dir)["DEMO_BASE_URL"]
    address = urlsplit(base)
    # Sixteen clients (twice the web server's threads: 2 workers x 4) send their
    # headers and the first byte of a body, then nothing.
    stalled = []
    for _ in range(16):
        client = socket.create_connection((address.hostname, address.port), timeout=40)
        client.sendall(b"POST /orders/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
        stalled.append(client)
    try:
        # Another client is answered meanwhile...
        assert requests.get(base + "/schema/", timeout=20).status_code == 200
        # ...while no stalled one has an answer yet; then the proxy answers each 408, once
        # timeout http-request (10 s) has passed: the web server never saw them.
        assert select.select(stalled, [], [], 0)[0] == []
        for client in stalled:
            answer = b""
            while chunk := client.recv(4096):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    finally:
        for client in stalled:
            client.close()


@pytest.mark.parametrize("value", [b"key-A\nX-Other: 1", b"key-A\nrest", b"key\x01A",
                                   b"key\x00A", b"key\rA", b"key\x7fA"],
                         ids=["bare LF and a header", "bare LF", "SOH", "NUL", "bare CR", "DEL"])
def test_a_header_value_with_a_control_character_never_reaches_the_library(demo, value):
    """Issue 29, item 9: a bare LF inside Idempotency-Key ended the line at the proxy, so the
    library saw "key-A" for both "key-A\\nX-Other: 1" and "key-A\\nX-Other: 2" and gave the
    second client the first one's answer. The proxy refuses a header section with a control
    character (TAB aside) or a line that does not end with CRLF: 400, from the proxy."""
    from urllib.parse import urlsplit

    run_dir, _ = demo
    environment = _environment(run_dir)
    address = urlsplit(environment["DEMO_BASE_URL"])
    seed = json.loads((run_dir / "seed.json").read_text())
    token = next(iter(seed.values()))["token"] if isinstance(seed, dict) else seed[0]["token"]
    body = b'{"sku": "tea", "quantity": 1}'
    answer = _raw(address, b"POST /orders/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Authorization: Token " + token.encode() + b"\r\n"
                  b"Idempotency-Key: " + value + b"\r\n"
                  b"Content-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert b"problem+json" not in answer  # the proxy's answer, not the library's


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
