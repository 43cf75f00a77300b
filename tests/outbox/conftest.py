import uuid

import pytest
from django.conf import settings as django_settings

from tests.helpers import unavailable
from tests.outbox.support import recorders
from tests.outbox.support.helpers import Broker, amqp_url

#: The brokers a test that takes the ``broker`` fixture runs on.
BROKERS = ["redis", "rabbitmq"]

NO_RABBITMQ = ("RabbitMQ is not running: DIO_AMQP_URL is unset (make test starts it: "
               "scripts/services run pg redis rabbitmq -- ...)")


@pytest.fixture(scope="session")
def prepared_transactions():
    """Two-phase commit on the private cluster: max_prepared_transactions > 0.

    scripts/services starts PostgreSQL with 8; a cluster started by an older
    checkout has 0 until it is restarted.
    """
    from tests.helpers import observer

    with observer() as conn:
        allowed = int(conn.execute("SHOW max_prepared_transactions").fetchone()[0])
    assert allowed > 0, ("max_prepared_transactions is 0: restart the private cluster "
                         "(scripts/services stop, then run the tests again)")


@pytest.fixture(autouse=True)
def _fresh_failures():
    recorders.FAILING.clear()
    yield
    recorders.FAILING.clear()


@pytest.fixture(params=BROKERS)
def broker(request, settings):
    """Each broker in turn: the relay in this process sends to it, ``broker.env`` points
    subprocesses (workers, relays) at it."""
    if request.param == "rabbitmq":
        url = amqp_url()
        if url is None:
            unavailable(NO_RABBITMQ)
    else:
        url = django_settings.CELERY_BROKER_URL
    found = Broker(request.param, url)
    if found.app is not None:
        settings.OUTBOX = {**settings.OUTBOX, "CELERY_APP": found.app}
    yield found
    if found.app is not None:
        found.app.close()


@pytest.fixture
def rabbitmq():
    """The suite's RabbitMQ (a Broker), for tests of RabbitMQ alone."""
    url = amqp_url()
    if url is None:
        unavailable(NO_RABBITMQ)
    return Broker("rabbitmq", url)


@pytest.fixture
def queue(settings, request):
    """A queue of this test's own on the suite's broker (Redis, or the test's ``broker``),
    for the relay and the worker; deleted after the test."""
    name = f"dio-{request.module.__name__.rpartition('.')[2]}-{uuid.uuid4().hex[:8]}"
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_QUEUE": name}
    on = (request.getfixturevalue("broker") if "broker" in request.fixturenames
          else Broker("redis", django_settings.CELERY_BROKER_URL))
    yield name
    on.delete(name)
