"""What goes over the wire to PostgreSQL, as libpq traces it: a test's round trips.

Every simple-protocol Query message a client sends is one round trip.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from django.db.backends.signals import connection_created
from psycopg import pq

from tests.helpers import app_connection


class Wire:
    """The messages Django's connections send to PostgreSQL, as libpq traces them."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile("w+")

    def attach(self, pgconn: Any) -> None:
        pgconn.trace(self.file.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

    def sent(self) -> list[tuple[str, str]]:
        """``(message type, text)`` of every frontend message, in order."""
        self.file.flush()
        self.file.seek(0)
        messages: list[str] = []
        for line in self.file.read().splitlines():
            if line.startswith(("F\t", "B\t")):
                messages.append(line)
            elif messages:  # a query's text spans lines
                messages[-1] += "\n" + line
        sent = []
        for message in messages:
            fields = message.split("\t", 3)
            if fields[0] == "F":
                sent.append((fields[2], fields[3] if len(fields) > 3 else ""))
        return sent

    def round_trips(self) -> list[str]:
        """The text of each query sent, one per round trip.

        Fails if anything but simple Query messages went out (the extended
        protocol would mean psycopg now binds on the server, and cannot run
        several statements in one message).
        """
        sent = [(kind, text) for kind, text in self.sent() if kind != "Terminate"]
        assert {kind for kind, _ in sent} <= {"Query"}, sent
        return [re.fullmatch(r' ?"(.*)"', text, re.DOTALL).group(1).strip() for _, text in sent]


@contextlib.contextmanager
def wire() -> Iterator[Wire]:
    """Trace this thread's default connection, as it is now or as it is opened in the block."""
    traced = Wire()
    thread = threading.get_ident()

    def on_connect(sender: Any, connection: Any, **kwargs: Any) -> None:
        if connection.alias == app_connection().alias and threading.get_ident() == thread:
            traced.attach(connection.connection.pgconn)

    if app_connection().connection is not None:
        traced.attach(app_connection().connection.pgconn)
    connection_created.connect(on_connect)
    try:
        yield traced
    finally:
        connection_created.disconnect(on_connect)
        if app_connection().connection is not None and not app_connection().connection.closed:
            app_connection().connection.pgconn.untrace()
