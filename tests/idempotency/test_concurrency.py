"""Simultaneous requests from separate connections against a live server."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import requests

from tests.helpers import count_rows, wait_for

N = 20


def fire(url: str, keys: list[str], body: dict, timeout: float = 30) -> list[requests.Response]:
    """Send one request per key, all released at the same instant, each on its own
    TCP connection (so each reaches the server, and the database, separately)."""
    barrier = threading.Barrier(len(keys))

    def one(key: str) -> requests.Response:
        with requests.Session() as session:
            barrier.wait()
            return session.post(
                url,
                json=body,
                timeout=timeout,
                headers={"X-User": "alice", "Idempotency-Key": key},
            )

    with ThreadPoolExecutor(len(keys)) as pool:
        return list(pool.map(one, keys))


def kinds(responses: list[requests.Response]) -> Counter:
    def kind(r: requests.Response) -> str:
        if r.status_code == 201:
            return "replayed" if r.headers.get("Idempotent-Replayed") == "true" else "executed"
        return str(r.status_code)

    return Counter(kind(r) for r in responses)


def test_twenty_simultaneous_requests_with_one_key_run_the_handler_once(wsgi_server):
    responses = fire(wsgi_server.url + "/orders/", ["same"] * N, {"sku": "tea", "sleep": 0.5})
    seen = kinds(responses)
    assert seen["executed"] == 1, seen
    assert set(seen) <= {"executed", "replayed", "409"}, seen
    for r in responses:
        if r.status_code == 409:
            assert r.headers["Retry-After"] == "1"
            assert r.headers["Content-Type"] == "application/problem+json"
    assert count_rows("testapp_order") == 1
    assert count_rows("idempotency_keys") == 1


def test_with_a_wait_duplicates_get_the_first_answer_replayed(wsgi_server):
    responses = fire(
        wsgi_server.url + "/orders-waiting/", ["same"] * N, {"sku": "tea", "sleep": 0.5}
    )
    seen = kinds(responses)
    assert seen == Counter({"executed": 1, "replayed": N - 1}), seen
    bodies = {r.content for r in responses}
    assert len(bodies) == 1
    assert count_rows("testapp_order") == 1


def test_twenty_simultaneous_requests_with_twenty_keys_all_succeed(wsgi_server):
    responses = fire(wsgi_server.url + "/orders/", [f"k{i}" for i in range(N)], {"sku": "tea"})
    assert kinds(responses) == Counter({"executed": N})
    assert count_rows("testapp_order") == N
    assert count_rows("idempotency_keys") == N


def test_a_worker_killed_mid_request_leaves_nothing_and_the_retry_runs_once(tmp_path):
    from tests.live import LiveServer

    server = LiveServer(workers=1, threads=4).start()
    gate = tmp_path / "hold"
    gate.touch()
    try:
        (worker,) = server.worker_pids()
        url = server.url + "/orders-holding/"
        headers = {"X-User": "alice", "Idempotency-Key": "killed"}

        def held_request():
            try:
                requests.post(url, json={"sku": "tea", "hold": str(gate)}, headers=headers,
                              timeout=60)
            except requests.RequestException:
                pass  # the worker dies under it

        thread = threading.Thread(target=held_request)
        thread.start()
        wait_for((tmp_path / "hold.held").exists, "the handler to have written its order")
        os.kill(worker, signal.SIGKILL)
        thread.join(60)
        assert count_rows("testapp_order") == 0
        assert count_rows("idempotency_keys") == 0
        # gunicorn replaces the worker; the retry runs the handler once.
        deadline = time.monotonic() + 20
        while True:
            try:
                retry = requests.post(url, json={"sku": "tea"}, headers=headers, timeout=10)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert retry.status_code == 201 and "Idempotent-Replayed" not in retry.headers
        again = requests.post(url, json={"sku": "tea"}, headers=headers, timeout=10)
        assert again.headers["Idempotent-Replayed"] == "true"
        assert count_rows("testapp_order") == 1
    finally:
        gate.unlink(missing_ok=True)
        server.stop()
