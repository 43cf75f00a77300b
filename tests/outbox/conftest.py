import uuid

import pytest
import redis
from django.conf import settings as django_settings

from tests.outbox import consumers


@pytest.fixture(autouse=True)
def _fresh_failures():
    consumers.FAILING.clear()
    yield
    consumers.FAILING.clear()


@pytest.fixture
def queue(settings, request):
    """A queue of this test's own on the suite's Redis, for the relay and the worker."""
    name = f"dio-{request.module.__name__.rpartition('.')[2]}-{uuid.uuid4().hex[:8]}"
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_QUEUE": name}
    yield name
    with redis.Redis.from_url(django_settings.CELERY_BROKER_URL) as client:
        client.delete(name)
