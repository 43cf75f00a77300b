import pytest
from rest_framework.test import APIClient


class Client(APIClient):
    """An API client that speaks as a user and sends an idempotency key."""

    def order(self, key=None, user="alice", path="/orders/", data=None, method="post", **extra):
        headers = {"X-User": user} if user else {}
        if key is not None:
            headers["Idempotency-Key"] = key
        body = {"sku": "tea", "quantity": 1} if data is None else data
        fmt = extra.pop("format", "json")
        return getattr(self, method)(path, body, format=fmt, headers=headers, **extra)


@pytest.fixture
def client():
    return Client()


@pytest.fixture(scope="session")
def wsgi_server():
    from tests.live import LiveServer

    server = LiveServer().start()
    yield server
    server.stop()


class Gateway:
    """Talks to the fake gateway process (example_project/gateway.py)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def stats(self) -> dict:
        import requests

        return requests.get(self.url + "/stats", timeout=5).json()

    def control(self, **settings) -> None:
        import requests

        requests.post(self.url + "/control", json=settings, timeout=5).raise_for_status()

    def reset(self) -> None:
        import requests

        requests.post(self.url + "/reset", json={}, timeout=5).raise_for_status()


@pytest.fixture(scope="session")
def gateway_process():
    import os
    import subprocess
    import sys
    import time

    import requests

    from tests.live import ROOT, free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "example_project/gateway.py", str(port)], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            requests.get(url + "/stats", timeout=1)
            break
        except requests.ConnectionError:
            time.sleep(0.05)
    os.environ["DIO_GATEWAY_URL"] = url
    yield Gateway(url)
    proc.kill()
    proc.wait()


@pytest.fixture
def gateway(gateway_process):
    gateway_process.reset()
    return gateway_process


@pytest.fixture(scope="session")
def crash_file(tmp_path_factory):
    import os

    path = tmp_path_factory.mktemp("crash") / "plan"
    os.environ["DIO_CRASH_FILE"] = str(path)
    return path


@pytest.fixture
def crash(crash_file):
    """``crash("raise", "after_gateway")``: the next run of that point fails once."""

    def plan(mode: str, point: str) -> None:
        crash_file.write_text(f"{mode}:{point}")

    yield plan
    crash_file.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def payments_server(gateway_process, crash_file):
    from tests.live import LiveServer

    server = LiveServer(workers=2, threads=4).start()
    yield server
    server.stop()
