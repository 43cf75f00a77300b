"""Settings of the processes the fault tests start (celery workers, relays).

The outbox's process settings (persistent connections), and the receivers'
retries made short, so that an outage of a few seconds is waited out in a
test of a few seconds.
"""

from tests.outbox.settings import *  # noqa: F403
