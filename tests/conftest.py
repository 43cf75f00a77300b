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


def pytest_addoption(parser):
    parser.addoption(
        "--order", choices=("file", "reverse", "shuffle"), default="file",
        help="run the collected tests in file order (the default), reversed, or shuffled"
             " (seeded by --order-seed): a test that passes only after or before another shows",
    )
    parser.addoption("--order-seed", type=int, default=0,
                     help="the seed of --order=shuffle (printed in the header)")
    parser.addoption(
        "--check-variants", action="store_true",
        help="fail a test marked `variants` that sends no statement through the library's"
             " app, worker or system alias (make test-variants passes it: tests/variants_check.py)",
    )


def pytest_report_header(config):
    order = config.getoption("order")
    if order == "shuffle":
        return f"test order: shuffled, --order-seed={config.getoption('order_seed')}"
    return None if order == "file" else f"test order: {order}"


def pytest_configure(config):
    """Processes the tests start write their output as it comes; ``--check-variants``.

    Several tests wait for a line ("running", "ready.") in a subprocess's log
    file; Python buffers its output to a file in blocks, so without this the
    line arrives only at exit. (Set in root's environment on some machines,
    which hides the need.)

    With ``--check-variants`` (make test-variants), a test marked ``variants``
    that sends no statement through the library's aliases fails
    (tests/variants_check.py).
    """
    os.environ["PYTHONUNBUFFERED"] = "1"
    if config.getoption("check_variants"):
        from tests.variants_check import VariantsCheck

        config.pluginmanager.register(VariantsCheck(), "variants-check")


def pytest_collection_modifyitems(config, items):
    """Reorder as ``--order`` says; skip a ``direct_sessions`` test when DIO_POOLED puts an
    alias it names behind pgbouncer.

    ``@pytest.mark.direct_sessions("system", reason=...)`` needs direct sessions
    on the aliases named; without names, on every alias.
    """
    from django.conf import settings

    order = config.getoption("order")
    if order == "reverse":
        items.reverse()
    elif order == "shuffle":
        import random

        random.Random(config.getoption("order_seed")).shuffle(items)

    if settings.TENANCY.get("VERIFIED_CONTEXT"):
        for item in items:
            marker = item.get_closest_marker("plain_context")
            if marker is not None:
                item.add_marker(pytest.mark.skip(reason=(
                    f"plain mode only: {marker.kwargs.get('reason', 'see the test')}"
                    " (DIO_VERIFIED_CONTEXT sets a verified token instead)"
                )))
    pooled = set(getattr(settings, "POOLED_ALIASES", ()))
    if not pooled:
        return
    for item in items:
        marker = item.get_closest_marker("direct_sessions")
        if marker is None:
            continue
        hit = sorted(pooled.intersection(marker.args or settings.DATABASES))
        if hit:
            item.add_marker(pytest.mark.skip(reason=(
                f"needs direct PostgreSQL sessions: {marker.kwargs.get('reason', 'see the test')}"
                f" (DIO_POOLED puts {', '.join(hit)} behind pgbouncer in transaction mode)"
            )))


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


@pytest.fixture(params=[5, -5], ids=["app-clock-5h-ahead", "app-clock-5h-behind"])
def wrong_app_clock(request, monkeypatch):
    """The application's clock 5 hours off the database's, ahead or behind.

    ``django.utils.timezone.now`` and ``time.time`` are moved; the database's
    ``now()`` is not. Whatever the library computes from the app's clock then
    lands five hours off (``datetime.now()`` cannot be moved: the library uses
    neither it nor ``utcnow``, which tests/test_docs.py would not notice, so a
    grep in the test that uses this fixture says so).
    """
    import datetime as dt
    import time

    from django.utils import timezone

    offset = dt.timedelta(hours=request.param)
    real_now, real_time = timezone.now, time.time
    monkeypatch.setattr(timezone, "now", lambda: real_now() + offset)
    monkeypatch.setattr(time, "time", lambda: real_time() + offset.total_seconds())
    return offset


@pytest.fixture
def pooler():
    """A pgbouncer of the test's own (one server session per pool, tests/pooler.py): what
    one test leaves in its sessions ends with it."""
    from tests.pooler import pool_of_one

    with pool_of_one() as running:
        yield running


@pytest.fixture
def bare_pooler():
    """The same, without the reset docs/scaling.md asks of pgbouncer: a setting one borrower
    SET at session level meets the next, so the library's own defences are seen alone."""
    from tests.pooler import pool_of_one

    with pool_of_one(reset=False) as running:
        yield running


@pytest.fixture
def fresh():
    """The app alias on a new connection (a new server session), closed again after the test."""
    from tests.helpers import app_connection

    app_connection().close()
    yield
    app_connection().close()
