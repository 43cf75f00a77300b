"""Long-running loops (the relay, the consumers, the commands' ``--every``) that outlive
database restarts and stop on SIGTERM, as django-celery-beat's do: connections broken or
past ``CONN_MAX_AGE`` are dropped before each step, a lost database is logged and retried
after a growing pause, and SIGTERM or SIGINT stops the loop between two steps.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from django.db import InterfaceError, OperationalError, close_old_connections, connections

from django_idempotency_outbox.durations import backoff
from outbox.conf import outbox_settings

logger = logging.getLogger("outbox")

#: Errors after which a loop reconnects and carries on: the server restarted,
#: the connection was cut, a backend was terminated.
DATABASE_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError)

#: The first pause after losing the database, in seconds, doubled for each
#: further failure up to the second.
DATABASE_BACKOFF = 1.0
MAX_DATABASE_BACKOFF = 30.0


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[threading.Event]:
    """Set ``stop`` on SIGTERM or SIGINT while the block runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        logger.info("outbox: %s received, stopping after the current batch",
                    signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def close_connections(*aliases: str) -> None:
    """Close this thread's connections to ``aliases`` (every one it has when none given)."""
    for conn in [connections[a] for a in aliases] or connections.all(initialized_only=True):
        try:
            conn.close()
        except Exception:  # already broken: nothing left to close
            pass


def run_loop(
    step: Callable[[], bool],
    *,
    name: str,
    stop: threading.Event,
    wake_up: threading.Event | None = None,
    once: bool = False,
    idle: float | None = None,
) -> None:
    """Call ``step`` until ``stop`` is set.

    Args:
        step: does one batch; returns True when there may be more to do at
            once, False when idle (the loop then sleeps ``POLL_INTERVAL`` or
            until ``wake_up`` is set).
        name: for the log.
        stop: set it (or send SIGTERM) to end the loop between steps.
        wake_up: an event that ends an idle sleep early (publish() sets
            :data:`outbox.publishing.wake_up` after each commit).
        once: return after the first idle step (used by ``--once`` and tasks);
            a database error then propagates instead of being retried.
        idle: seconds to sleep when idle, unless woken (``POLL_INTERVAL`` when None).
    """
    failures = 0
    while not stop.is_set():
        close_old_connections()
        try:
            busy = step()
        except DATABASE_ERRORS as exc:
            if once:
                raise
            failures += 1
            pause = backoff(failures, DATABASE_BACKOFF, MAX_DATABASE_BACKOFF)
            logger.warning(
                "outbox: %s lost the database (%s); retrying in %.1f s",
                name, str(exc).strip().splitlines()[0] if str(exc).strip() else exc, pause,
            )
            close_connections()
            stop.wait(pause)
            continue
        if failures:
            logger.info("outbox: %s is back on the database", name)
            failures = 0
        if busy:
            continue
        if once:
            return
        pause = outbox_settings.POLL_INTERVAL if idle is None else idle
        if wake_up is not None:
            wake_up.wait(pause)
            wake_up.clear()
        else:
            stop.wait(pause)
