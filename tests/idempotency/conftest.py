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
