import pytest


@pytest.fixture(scope="session")
def shop():
    """The example shop under gunicorn, on a database of its own (tests/example/shop.py)."""
    from tests.example.shop import running_shop

    with running_shop() as running:
        yield running
