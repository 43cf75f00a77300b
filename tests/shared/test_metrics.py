"""Prometheus metrics move as docs/operations.md says, in one process and in several."""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import threading
import time
import uuid

import pytest
import requests
from django.db import transaction
from prometheus_client import REGISTRY

from outbox import publish
from outbox.relay import Relay
from outbox.testing import InMemoryTransport
from tenancy import tenant_context
from tenancy.aliases import system_alias
from tests.helpers import connect, observer
from tests.idempotency.conftest import Client
from tests.live import LiveServer, free_port
from tests.outbox.support.helpers import ROOT, Process, drain, publish_as, raw_publish, wait_for
from tests.outbox.support.recorders import OrderRecorder

SCOPE = "order.create"


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def outcomes() -> dict[str, float]:
    return {o: sample("dio_idempotency_requests_total", scope=SCOPE, outcome=o)
            for o in ("executed", "replayed", "mismatch", "in_progress", "refused")}


def moved(before: dict[str, float]) -> dict[str, float]:
    return {k: v - before[k] for k, v in outcomes().items() if v != before[k]}


@pytest.fixture
def client():
    return Client()


def scrape(client, path: str = "/metrics") -> str:
    response = client.get(path)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    return response.content.decode()


def value(text: str, series: str) -> float:
    """The value of one series line in Prometheus's text format."""
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    assert match, f"{series} not in the scrape"
    return float(match.group(1))


# -- requests, through the real mixin ----------------------------------------------


def test_each_outcome_moves_its_own_counter(client):
    before = outcomes()
    assert client.order(key="k1").status_code == 201
    assert moved(before) == {"executed": 1}

    before = outcomes()
    assert client.order(key="k1").status_code == 201
    assert moved(before) == {"replayed": 1}

    before = outcomes()
    assert client.order(key="k1", data={"sku": "coffee", "quantity": 1}).status_code == 422
    assert moved(before) == {"mismatch": 1}

    before = outcomes()
    assert client.order(key=None).status_code == 400  # no key
    assert client.order(key="caf\u00e9").status_code == 400  # not printable ASCII
    assert moved(before) == {"refused": 2}


def test_a_duplicate_in_flight_counts_as_in_progress(client):
    first: list[int] = []
    slow = threading.Thread(target=lambda: first.append(
        Client().order(key="slow", data={"sku": "tea", "quantity": 1, "sleep": 1.5}).status_code))
    before = outcomes()
    slow.start()
    try:
        wait_for(lambda: _key_locked("slow"), "the first request to hold its key")
        assert client.order(key="slow", data={"sku": "tea", "quantity": 1, "sleep": 1.5}
                            ).status_code == 409
    finally:
        slow.join()
    assert first == [201]
    assert moved(before) == {"executed": 1, "in_progress": 1}


def _key_locked(key: str) -> bool:
    # The first request holds its key's lock inside its transaction: a
    # second connection sees the lock in pg_locks (an advisory lock).
    with connect() as conn:
        return bool(conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        ).fetchone()[0])


def test_handler_time_is_observed_only_when_the_handler_runs(client):
    def counts():
        return (sample("dio_idempotency_handler_seconds_count", scope=SCOPE),
                sample("dio_idempotency_store_seconds_count", scope=SCOPE),
                sample("dio_idempotency_handler_seconds_sum", scope=SCOPE))

    handler, store, spent = counts()
    client.order(key="timed", data={"sku": "tea", "quantity": 1, "sleep": 0.2})
    client.order(key="timed", data={"sku": "tea", "quantity": 1, "sleep": 0.2})  # a replay
    handler2, store2, spent2 = counts()
    assert handler2 - handler == 1  # the replay ran no handler
    assert store2 - store == 2  # both went through the store
    assert spent2 - spent >= 0.2  # the handler's sleep is the handler's time


def test_metrics_off_counts_nothing_and_the_view_is_404(client, settings):
    settings.OBSERVABILITY = {"METRICS": False}
    before = outcomes()
    client.order(key="quiet")
    assert moved(before) == {}
    assert client.get("/metrics").status_code == 404


# -- the outbox ----------------------------------------------------------------------


def test_published_counts_only_what_commits():
    before = sample("dio_outbox_published_total", topic="order.placed")
    paid = sample("dio_outbox_published_total", topic="order.paid")
    publish_as(1, "order.placed", {"sku": "a"})
    with tenant_context(1):
        publish("order.placed", {"sku": "kept"})
        publish("order.paid", {"sku": "kept"})  # each topic its own count
        try:
            with transaction.atomic():
                publish("order.placed", {"sku": "rolled back"})
                raise RuntimeError
        except RuntimeError:
            pass
    try:
        with tenant_context(1):
            publish("order.placed", {"sku": "rolled back too"})
            raise RuntimeError
    except RuntimeError:
        pass
    assert sample("dio_outbox_published_total", topic="order.placed") - before == 2
    assert sample("dio_outbox_published_total", topic="order.paid") - paid == 1


def test_consumed_parked_and_relayed_count_what_committed():
    consumed = sample("dio_outbox_consumed_total", consumer="orders")
    parked = sample("dio_outbox_parked_total", consumer="orders")
    relayed = sample("dio_outbox_relayed_total", relay="default")
    for sku in ("a", "b", "c"):
        publish_as(1, "order.placed", {"sku": sku})
    publish_as(2, "order.placed", {"sku": "bad", "poison": True})
    drain(OrderRecorder())
    assert sample("dio_outbox_consumed_total", consumer="orders") - consumed == 3
    assert sample("dio_outbox_parked_total", consumer="orders") - parked == 1
    relay = Relay(InMemoryTransport())
    try:
        assert relay.drain() == 4
    finally:
        relay.release()
    assert sample("dio_outbox_relayed_total", relay="default") - relayed == 4


def test_upkeep_runs_are_counted():
    from idempotency.reaper import reap_expired_keys
    from outbox.retention import reap

    runs = sample("dio_upkeep_runs_total", job="reap_keys")
    outbox_runs = sample("dio_upkeep_runs_total", job="reap_outbox")
    reap_expired_keys()
    reap()
    assert sample("dio_upkeep_runs_total", job="reap_keys") - runs == 1
    assert sample("dio_upkeep_runs_total", job="reap_outbox") - outbox_runs == 1


# -- the scrape-time gauges --------------------------------------------------------------


def test_lag_parked_and_the_blocker_are_read_at_scrape_time(client):
    from outbox.consumers import ensure_offsets

    ensure_offsets(OrderRecorder())
    publish_as(1, "order.placed", {"sku": "waiting"})
    publish_as(1, "order.placed", {"sku": "waiting too"})
    text = scrape(client)
    assert value(text, "dio_outbox_scrape_ok") == 1
    assert value(text, 'dio_outbox_lag_messages{partition="0",reader="orders"}') == 2
    assert value(text, 'dio_outbox_lag_seconds{partition="0",reader="orders"}') > 0
    assert value(text, "dio_outbox_held_back_messages") == 0

    drain(OrderRecorder())
    text = scrape(client)
    assert value(text, 'dio_outbox_lag_messages{partition="0",reader="orders"}') == 0
    assert value(text, 'dio_outbox_lag_seconds{partition="0",reader="orders"}') == 0

    with connect() as publisher:  # a publishing transaction left open
        raw_publish(publisher, 1, "order.placed", {"sku": "in flight"})
        publish_as(1, "order.placed", {"sku": "held back"})
        text = scrape(client)
        publisher.rollback()
    assert value(text, "dio_outbox_held_back_messages") == 1
    # Without pg_read_all_stats the system role sees the blocker but not its age.
    assert value(text, "dio_outbox_blockers") == 1
    assert math.isnan(value(text, "dio_outbox_blocker_age_seconds"))
    assert value(scrape(client), "dio_outbox_blockers") == 0
    assert value(scrape(client), "dio_outbox_blocker_age_seconds") == 0


def test_the_blockers_age_needs_pg_read_all_stats_and_says_so(client, settings, caplog):
    from outbox import metrics

    role = settings.DATABASES[system_alias()]["USER"]
    metrics._hinted.clear()
    with connect() as publisher:
        raw_publish(publisher, 1, "order.placed", {"sku": "in flight"})
        with caplog.at_level(logging.WARNING, logger="outbox"):
            assert math.isnan(value(scrape(client), "dio_outbox_blocker_age_seconds"))
            scrape(client)
        assert caplog.text.count(f"GRANT pg_read_all_stats TO {role}") == 1  # once
        with observer() as conn:
            conn.execute(f"GRANT pg_read_all_stats TO {role}")
        try:
            time.sleep(0.2)
            assert value(scrape(client), "dio_outbox_blocker_age_seconds") >= 0.2
        finally:
            with observer() as conn:
                conn.execute(f"REVOKE pg_read_all_stats FROM {role}")
        publisher.rollback()


def test_a_scrape_answers_when_the_database_cannot_be_read(client, settings):
    settings.TENANCY = {**settings.TENANCY, "ADMIN_DATABASE": "owner-does-not-exist"}
    text = scrape(client)
    assert value(text, "dio_outbox_scrape_ok") == 0
    assert "dio_outbox_lag_messages{" not in text
    assert "dio_idempotency_requests_total" in text or "dio_idempotency_requests" in text


# -- several processes ------------------------------------------------------------------


@pytest.mark.live_server
def test_two_gunicorn_workers_add_up_in_multiprocess_mode(tmp_path, monkeypatch):
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    server = LiveServer(workers=2, threads=4)
    server.args += ["--config", "python:tests.shared.gunicorn_metrics"]
    server.start()
    try:
        served_by: set[int] = set()
        session_less = {"Connection": "close", "X-User": "alice"}
        sent = 0
        while len(list(metrics_dir.glob("counter_*.db"))) < 2 or sent < 20:
            key = str(uuid.uuid4())
            response = requests.post(
                server.url + "/orders/", json={"sku": "tea", "quantity": 1},
                headers={**session_less, "Idempotency-Key": key}, timeout=10,
            )
            assert response.status_code == 201
            sent += 1
            assert sent < 400, "one worker served every request"
        served_by = {int(p.stem.split("_")[1]) for p in metrics_dir.glob("counter_*.db")}
        assert served_by <= set(server.worker_pids()) and len(served_by) == 2
        text = requests.get(server.url + "/metrics", timeout=10).text
        series = 'dio_idempotency_requests_total{outcome="executed",scope="order.create"}'
        assert value(text, series) == sent  # both workers' counts, added up
        assert value(text, "dio_outbox_scrape_ok") == 1

        os.kill(sorted(served_by)[0], signal.SIGKILL)  # gunicorn starts another
        wait_for(lambda: len(server.worker_pids()) == 2
                 and not served_by <= set(server.worker_pids()), "a new worker")
        after = _scrape_when_up(server.url + "/metrics")
        assert value(after, series) == sent  # the dead worker's counts are kept
    finally:
        server.stop()


def _scrape_when_up(url: str) -> str:
    answers: list[str] = []

    def answered() -> bool:
        try:
            answers.append(requests.get(url, timeout=10).text)
        except requests.ConnectionError:
            return False
        return True

    wait_for(answered, "/metrics")
    return answers[-1]


# -- the long-running commands' --metrics-port -----------------------------------------


def test_run_consumers_serves_metrics_on_its_port(tmp_path):
    port = free_port()
    for sku in ("a", "b"):
        publish_as(1, "order.placed", {"sku": sku})
    process = Process.manage("run_consumers", "orders", "--metrics-port", str(port),
                             "--metrics-addr", "127.0.0.1", log=tmp_path / "consumers.log")
    try:
        process.wait_output("running")

        def consumed() -> float:
            try:
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except requests.ConnectionError:
                return 0
            found = re.search(r'^dio_outbox_consumed_total\{consumer="orders"\} (\S+)$', text,
                              re.M)
            return float(found.group(1)) if found else 0

        wait_for(lambda: consumed() == 2, "the consumer's counter on its metrics port")
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert value(text, 'dio_outbox_lag_messages{partition="0",reader="orders"}') == 0
    finally:
        assert process.stop() == 0


@pytest.mark.parametrize("port, error", [("http", "is not a port number"),
                                          ("70000", "is not a port number (1 to 65535)")])
def test_a_bad_metrics_port_is_one_line_and_a_non_zero_exit(tmp_path, port, error):
    process = Process.manage("relay_outbox", "--once", "--metrics-port", port,
                             log=tmp_path / "relay.log")
    assert process.popen.wait(60) != 0
    process.kill()
    assert error in process.output
    assert "Traceback" not in process.output


def test_a_metrics_port_in_use_is_one_line_and_a_non_zero_exit(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = Process.manage("relay_outbox", "--once", "--metrics-port", str(port),
                                 "--metrics-addr", "127.0.0.1", log=tmp_path / "relay.log")
        assert process.popen.wait(60) == 1
        process.kill()
    assert f"--metrics-port: cannot listen on 127.0.0.1:{port}" in process.output
    assert "Traceback" not in process.output
    assert ROOT  # the command ran from the project root
