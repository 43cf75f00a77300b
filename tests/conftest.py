"""The test harness: a real database, real roles, real commits.

The session starts by recreating the test database as the owner role and
migrating it as the owner, exactly as a deployment would; then it grants the
app and system roles what docs/roles.md grants them. Tests run as the app role
(the ``default`` alias) and nothing wraps them in a transaction: every write
commits, and each test starts from empty tables (truncated by the owner).
"""

from __future__ import annotations

import os

import pytest
from django.db import connections

from tests.dbsetup import recreate_database
from tests.helpers import truncate_all


@pytest.fixture(scope="session")
def django_db_setup(django_db_blocker):
    with django_db_blocker.unblock():
        recreate_database(drop_policies=bool(os.environ.get("DIO_TEST_DROP_POLICIES")))


@pytest.fixture(autouse=True)
def _database(django_db_setup, django_db_blocker):
    """Every test may use the database; none is wrapped in a transaction."""
    with django_db_blocker.unblock():
        yield
        for conn in connections.all():
            if conn.alias != "owner" and conn.connection is not None and conn.in_atomic_block:
                raise AssertionError(f"test left a transaction open on {conn.alias!r}")
        truncate_all()
