"""Settings of the processes the fault tests start (celery workers, relays).

The outbox's process settings (persistent connections), and the receivers'
retries made short, so that an outage of a few seconds is waited out in a
test of a few seconds.
"""

import os

from tests.outbox.support.process_settings import *  # noqa: F403
from tests.outbox.support.process_settings import OUTBOX

OUTBOX = {
    **OUTBOX,
    "RECEIVER_RETRY_BACKOFF_MAX": 0.5,
    "RECEIVER_MAX_ATTEMPTS": int(os.environ.get("DIO_RECEIVER_MAX_ATTEMPTS", "60")),
}
