"""What a PostgreSQL session carries beyond its transaction, read from the session itself.

A server session that a pooler lends to the next client, or that Django
keeps for the next request (``CONN_MAX_AGE``), must come back from the
library's flows holding nothing it did not hold before: no advisory lock of
its own process, no prepared statement, no open cursor, no listening
channel, no temporary object, no setting changed for the session.
:func:`no_session_state_left` reads all of that before and after a block and
fails on any difference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields

from django.db import connections

#: Everything the session keeps past a transaction, in one statement whose
#: names no search_path can redirect (the session's own may be anything).
_STATE = """
SELECT pg_catalog.pg_backend_pid(),
       ARRAY(SELECT l.locktype || ' ' || l.classid || '/' || l.objid || '/' || l.objsubid
                    || ' ' || l.mode
               FROM pg_catalog.pg_locks l
              WHERE l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
                AND l.locktype OPERATOR(pg_catalog.=) 'advisory'
              ORDER BY 1),
       ARRAY(SELECT p.name FROM pg_catalog.pg_prepared_statements p ORDER BY 1),
       ARRAY(SELECT c.name FROM pg_catalog.pg_cursors c ORDER BY 1),
       ARRAY(SELECT c FROM pg_catalog.pg_listening_channels() AS c ORDER BY 1),
       ARRAY(SELECT c.relname::text FROM pg_catalog.pg_class c
              WHERE c.relnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()
              ORDER BY 1),
       ARRAY(SELECT s.name || '=' || s.setting FROM pg_catalog.pg_settings s
              WHERE s.source OPERATOR(pg_catalog.=) 'session' ORDER BY 1)
"""

#: Parameters pgbouncer itself sets on the server session it lends, from the
#: client's startup packet (its "tracked" parameters).
POOLER_PARAMETERS = frozenset(
    {"application_name", "client_encoding", "DateStyle", "IntervalStyle", "TimeZone",
     "standard_conforming_strings"}
)


@dataclass(frozen=True)
class SessionState:
    """What one server session holds beyond its transaction (lists of names)."""

    pid: int
    advisory_locks: tuple[str, ...]
    prepared_statements: tuple[str, ...]
    cursors: tuple[str, ...]
    listening: tuple[str, ...]
    temporary_objects: tuple[str, ...]
    session_settings: tuple[str, ...]  # name=value, source 'session'

    def leftovers(self, before: SessionState, *, pooled: bool = False) -> dict[str, list[str]]:
        """What this state holds that ``before`` did not, by kind (empty: nothing)."""
        found: dict[str, list[str]] = {}
        for field in fields(self):
            if field.name == "pid":
                continue
            extra = sorted(set(getattr(self, field.name)) - set(getattr(before, field.name)))
            if field.name == "session_settings" and pooled:
                extra = [s for s in extra if s.split("=", 1)[0] not in POOLER_PARAMETERS]
            if extra:
                found[field.name] = extra
        return found


def read_state(execute: Callable[[str], tuple]) -> SessionState:
    """The state of the session ``execute`` sends its statement to (autocommit)."""
    pid, *rest = execute(_STATE)
    return SessionState(pid, *(tuple(values) for values in rest))


def django_state(alias: str) -> SessionState:
    """The state of the server session Django's connection ``alias`` is on."""

    def execute(sql: str) -> tuple:
        with connections[alias].cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchone()

    return read_state(execute)


@contextlib.contextmanager
def no_session_state_left(readers: dict[str, Callable[[], SessionState]], *,
                          pooled: bool = False) -> Iterator[dict[str, SessionState]]:
    """Fail if a session read by ``readers`` holds more after the block than before it.

    ``readers`` maps a name (an alias) to a function that reads the state of
    that alias's server session. Direct connections must be the same session
    before and after (or nothing would have been checked): the pid is
    compared. Behind a pooler with one server session per pool, whichever
    client reads it reads the same session; the parameters pgbouncer sets on
    it for its clients are left out.
    """
    before = {name: read() for name, read in readers.items()}
    yield before
    problems = {}
    for name, read in readers.items():
        after = read()
        assert after.pid == before[name].pid, (
            f"{name}: the session changed ({before[name].pid} -> {after.pid}): nothing checked"
        )
        left = after.leftovers(before[name], pooled=pooled)
        if left:
            problems[name] = left
    assert not problems, f"the library's flows left session state behind: {problems}"
