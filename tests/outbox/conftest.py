import pytest

from tests.outbox import consumers


@pytest.fixture(autouse=True)
def _fresh_failures():
    consumers.FAILURES.clear()
    yield
    consumers.FAILURES.clear()
