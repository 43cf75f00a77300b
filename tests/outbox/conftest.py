import pytest

from tests.outbox import consumers


@pytest.fixture(autouse=True)
def _fresh_failures():
    consumers.FAILING.clear()
    yield
    consumers.FAILING.clear()
