"""Django's PostgreSQL backend for the roles that are not the tables' owner.

The app, worker and system aliases of :func:`tenancy.databases` use it. It
is Django's backend with two additions.

**Held statements.** Django sends ``BEGIN`` (through psycopg), ``SAVEPOINT``
and ``RELEASE SAVEPOINT`` each as a round trip of its own, and the tenant's
``SET LOCAL`` is another; none of them returns anything anyone reads. While
a block runs under :meth:`DatabaseWrapper.holding`, such statements are
held and sent at the head of the next statement's message (a message of
several statements, which a cursor that binds on the client sends as one):
an idempotent request's claim carries the transaction's ``BEGIN`` and its
tenant, the handler's first statement its savepoint, the stored answer the
savepoint's release. Nothing else changes: the execute wrappers, query
logging and ``CaptureQueriesContext`` see ``SAVEPOINT`` and ``SET LOCAL``
when Django and the library send them, and ``BEGIN`` and ``COMMIT`` are
logged as Django logs them. A savepoint released or rolled back before
anything was sent inside it is never sent at all; ``COMMIT`` drops what is
still held (it ends the transaction anyway). A statement of several
parts fails as a whole when PostgreSQL cannot parse it: if the ``BEGIN``
it carried did not run, it is sent again on its own, so that the
transaction is open as Django believes it is. The hooks are the methods
Django's backends implement (``_start_transaction_under_autocommit``,
``_savepoint``, ``_savepoint_commit``, ``_savepoint_rollback``,
``_commit``, ``_rollback``) and psycopg's documented ``cursor_factory``;
tests/tenancy/test_backend.py holds them on the oldest and newest Django.

**Test databases.** Under ``manage.py test`` (and pytest-django) it hands to
the owner's alias, named by ``TEST["OWNER"]``, what only the owner may do,
as in a deployment:

- creating the test database, migrating it (which applies the privileges)
  and dropping it at the end: Django creates a database through the first
  alias that uses it, and puts ``default`` (the app alias) first, whose role
  has no CREATEDB and must not own the tables. The four aliases name one
  database, so they have one test database: each says it is the owner's
  (:meth:`DatabaseCreation.test_db_signature`), and Django creates it once and
  makes the others its mirrors, whichever of them a test uses;
- flushing it between ``TransactionTestCase`` tests: ``TRUNCATE``, which no
  role but the owner holds, once, through the app alias (the worker and
  system aliases share the database and flush nothing: their roles could not
  run what Django runs after a flush, and need not).

Everything else (``TestCase``'s transactions, the queries of the tests) runs
as the alias's own role, so the tests see what production sees.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.backends.postgresql import base, creation, operations
from django.db.backends.utils import debug_transaction


def _owner(connection: Any) -> str | None:
    """The alias that creates and flushes this alias's test database, if one is named."""
    owner = connection.settings_dict.get("TEST", {}).get("OWNER")
    if owner is None:
        return None
    if owner not in connections or owner == connection.alias:
        raise ImproperlyConfigured(
            f'DATABASES[{connection.alias!r}]["TEST"]["OWNER"] = {owner!r} must name another '
            "alias: the one that logs in as the tables' owner"
        )
    return str(owner)


class DatabaseCreation(creation.DatabaseCreation):
    def test_db_signature(self) -> tuple[Any, ...]:
        """The owner's: the four aliases name one database, and get one test database.

        Django creates a test database per signature and tears each one down
        through the alias that created it. With a signature of its own (this
        engine is not the owner's), the owner's alias would create a second
        test database and, at the end, drop the database its settings then
        named: the real one.
        """
        owner = _owner(self.connection)
        if owner is None:
            return tuple(super().test_db_signature())
        return tuple(connections[owner].creation.test_db_signature())

    def set_as_test_mirror(self, primary_settings_dict: dict[str, Any]) -> None:
        """Connect where the test database's creator connects: its name, host and port.

        A pooler in front of this alias (``tenancy.databases(pooled=...)``)
        knows the real database, not the test's.
        """
        if _owner(self.connection) is None:
            super().set_as_test_mirror(primary_settings_dict)
            return
        from django.conf import settings

        direct = {k: primary_settings_dict.get(k) for k in ("NAME", "HOST", "PORT")}
        settings.DATABASES[self.connection.alias].update(direct)
        self.connection.settings_dict.update(direct)
        self.connection.close()

    def create_test_db(
        self, verbosity: int = 1, autoclobber: bool = False, serialize: bool | None = True,
        keepdb: bool = False,
    ) -> str:
        owner = _owner(self.connection)
        if owner is None:
            serialize = serialize is not False
            return str(super().create_test_db(verbosity, autoclobber, serialize, keepdb))
        # The owner creates and migrates it (Django names it after the owner's NAME,
        # the same database); this alias then connects to it as its own role.
        self._owner_name = connections[owner].settings_dict["NAME"]
        name = str(connections[owner].creation.create_test_db(
            verbosity=verbosity, autoclobber=autoclobber, serialize=False, keepdb=keepdb,
        ))
        self.connection.close()
        from django.conf import settings

        # Directly, where the owner connects: a pooler in front of this alias
        # (tenancy.databases(pooled=...)) knows the real database, not the test's.
        self._direct = {k: self.connection.settings_dict.get(k) for k in ("NAME", "HOST", "PORT")}
        direct = {"NAME": name, "HOST": connections[owner].settings_dict.get("HOST"),
                  "PORT": connections[owner].settings_dict.get("PORT")}
        settings.DATABASES[self.connection.alias].update(direct)
        self.connection.settings_dict.update(direct)
        return name

    def destroy_test_db(
        self, old_database_name: str | None = None, verbosity: int = 1, keepdb: bool = False,
        suffix: str | None = None,
    ) -> None:
        owner = _owner(self.connection)
        if owner is None or not hasattr(self, "_owner_name"):
            super().destroy_test_db(old_database_name, verbosity, keepdb, suffix)
            return
        connections.close_all()  # DROP DATABASE waits for no session, so close ours
        connections[owner].creation.destroy_test_db(self._owner_name, verbosity, keepdb, suffix)
        from django.conf import settings

        settings.DATABASES[self.connection.alias].update(self._direct)
        self.connection.settings_dict.update(self._direct)

    def clone_test_db(
        self, suffix: str, verbosity: int = 1, autoclobber: bool = False, keepdb: bool = False
    ) -> None:
        owner = _owner(self.connection)
        if owner is None:
            super().clone_test_db(suffix, verbosity, autoclobber, keepdb)
        else:
            connections[owner].creation.clone_test_db(suffix, verbosity, autoclobber, keepdb)


class DatabaseOperations(operations.DatabaseOperations):
    def last_executed_query(self, cursor: Any, sql: Any, params: Any) -> str:
        """The statement as query logging shows it: held ones as given, the others without
        what was held and sent before them in their message."""
        if getattr(cursor, "held_only", False):
            return str(sql)
        query: str = super().last_executed_query(cursor, sql, params)
        before = getattr(cursor, "sent_before", "")
        if query is not None and before and query.startswith(before):
            return query[len(before):]
        return query


    def sql_flush(
        self, style: Any, tables: Any, *, reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:
        """Nothing for the worker and system aliases: the app alias flushes the database.

        They name the same database; a flush through them would empty it again
        and then run Django's ``post_migrate`` handlers as their roles, which
        may not write Django's own tables (``django_content_type``).
        """
        from tenancy.conf import tenancy_settings

        if (_owner(self.connection) is not None
                and self.connection.alias != tenancy_settings.APP_DATABASE):
            return []
        return list(super().sql_flush(style, tables, reset_sequences=reset_sequences,
                                      allow_cascade=allow_cascade))

    def execute_sql_flush(self, sql_list: Iterable[str]) -> None:
        """Flush through a connection of the owner's (only it may TRUNCATE).

        A test's own guard may forbid the owner's alias (Django's "Database
        queries to 'owner' are not allowed in this test"), so this is a new
        session of the owner's settings, on the test database, closed after.
        """
        owner = _owner(self.connection)
        if owner is None:
            super().execute_sql_flush(sql_list)
            return
        wrapper = connections[owner]
        params = wrapper.get_connection_params()
        params["dbname"] = self.connection.settings_dict["NAME"]
        raw = wrapper.get_new_connection(params)
        try:
            with raw.transaction(), raw.cursor() as cursor:
                for sql in sql_list:
                    cursor.execute(sql)
        finally:
            raw.close()


@dataclass
class Held:
    """What a connection holds back for the next statement's message."""

    #: Each held text, with the number of statements (results) in it.
    statements: list[tuple[str, int]] = field(default_factory=list)
    #: Hold BEGIN, SAVEPOINT, RELEASE and DatabaseWrapper.hold()'s statements.
    on: bool = False
    #: The next text the cursor is given is held, not sent: its number of statements.
    take_next: int = 0
    #: The savepoints whose SAVEPOINT is still held: name -> that statement.
    unsent: dict[str, str] = field(default_factory=dict)
    #: Savepoints dropped unsent by a rollback, whose release is then nothing.
    dropped: set[str] = field(default_factory=set)
    #: The held statements start the transaction (BEGIN is among them).
    begins: bool = False

    def add(self, sql: str, results: int = 1) -> None:
        self.statements.append((sql, results))

    def take(self) -> tuple[str, int, bool]:
        """The held text, its number of results, and whether it begins the transaction.

        Nothing is held afterwards.
        """
        text = "; ".join(sql for sql, _ in self.statements)
        results = sum(count for _, count in self.statements)
        begins = self.begins
        self.statements, self.begins = [], False
        self.unsent.clear()
        return text, results, begins

    def drop_savepoint(self, sid: str) -> None:
        """Forget the savepoint ``sid`` and everything held after it: none of it was sent."""
        texts = [sql for sql, _ in self.statements]
        del self.statements[texts.index(self.unsent[sid]):]
        kept = {sql for sql, _ in self.statements}
        self.unsent = {name: sql for name, sql in self.unsent.items() if sql in kept}

    def clear(self) -> None:
        self.take()
        self.dropped.clear()


# django-stubs declare neither Django's psycopg cursor class nor the methods a
# backend implements (_savepoint, _commit...): both are typed as Any here.
_DjangoCursor: Any = base.Cursor
_DjangoWrapper: Any = base.DatabaseWrapper

#: Per psycopg connection: what its Django connection holds (cursors find it here).
_held: weakref.WeakKeyDictionary[Any, Held] = weakref.WeakKeyDictionary()


class Cursor(_DjangoCursor):  # type: ignore[misc]
    """Django's cursor (binds on the client), sending what its connection holds first."""

    #: The last statement was held, not sent (query logging shows it as it was given).
    held_only = False
    #: What went before the last statement in its message (query logging leaves it out).
    sent_before = ""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        held = _held.get(self.connection)
        self.held_only, self.sent_before = False, ""
        if held is None or not (held.statements or held.take_next):
            return super().execute(query, params, **kwargs)
        if held.take_next:
            held.add(query, held.take_next)
            held.take_next = 0
            self.held_only = True
            return self
        if kwargs or not isinstance(query, str):
            self._send_held(held)
            return super().execute(query, params, **kwargs)
        text, results, begins = held.take()
        self.sent_before = f"{text}; "
        # Bound first, then joined: the joined text changes with every savepoint
        # name, and psycopg would look for placeholders in it anew each time.
        bound = query if params is None else self.mogrify(query, params)
        try:
            super().execute(f"{text}; {bound}")
        except psycopg.Error:
            # Nothing of a message PostgreSQL could not parse ran: the BEGIN it
            # carried is sent again, so the transaction Django believes in is open.
            idle = self.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            if begins and idle:
                super().execute(text)
            raise
        for _ in range(results):  # past their results, to the statement's own
            self.nextset()
        return self

    def executemany(self, *args: Any, **kwargs: Any) -> None:
        self._send_held(_held.get(self.connection))
        super().executemany(*args, **kwargs)

    def copy(self, *args: Any, **kwargs: Any) -> Any:
        self._send_held(_held.get(self.connection))
        return super().copy(*args, **kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        self._send_held(_held.get(self.connection))
        return super().stream(*args, **kwargs)

    def _send_held(self, held: Held | None) -> None:
        if held is not None and held.statements:
            super().execute(held.take()[0])


class DatabaseWrapper(_DjangoWrapper):  # type: ignore[misc]
    creation_class = DatabaseCreation
    ops_class = DatabaseOperations

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held = Held()

    @contextmanager
    def holding(self, on: bool = True) -> Iterator[None]:
        """Hold (``on``) or send at once (not ``on``) the statements that return nothing.

        See the module's docstring. Blocks nest; leaving one restores what
        the enclosing block chose. What is held when a block ends stays held
        for the next statement, whichever block sends it.
        """
        previous, self.held.on = self.held.on, on
        try:
            yield
        finally:
            self.held.on = previous

    def hold(self, *statements: str) -> None:
        """Send ``statements`` (that return nothing) now, or with the next one when holding.

        Either way execute wrappers and query logging see them now, as they
        are given.
        """
        self._hold(statements, self.held.on)

    def prefix(self, *statements: str) -> None:
        """Send ``statements`` (that return nothing) with the next statement, holding or not.

        For statements that must run in the same transaction as the next one:
        in autocommit, the message's implicit transaction.
        """
        self._hold(statements, True)

    def _hold(self, statements: tuple[str, ...], held: bool) -> None:
        sql = "; ".join(statements)
        if held and not self.execute_wrappers:
            # Nobody wraps execute(): no cursor needed. Query logging records
            # it as it records BEGIN and COMMIT. The health check a cursor
            # would run first runs now, or its SELECT 1 would carry this.
            self.close_if_health_check_failed()
            self.ensure_connection()
            self.held.add(sql, len(statements))
            if self.queries_logged:
                with debug_transaction(self, sql):
                    pass
            return
        with self.cursor() as cursor:  # execute wrappers see it as it is given
            self.held.take_next = len(statements) if held else 0
            try:
                cursor.execute(sql)
            finally:
                self.held.take_next = 0

    def get_connection_params(self) -> dict[str, Any]:
        params: dict[str, Any] = super().get_connection_params()
        if params.get("cursor_factory") is base.Cursor:  # Django's, binding on the client
            params["cursor_factory"] = Cursor
        return params

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        connection = super().get_new_connection(conn_params)
        self.held.clear()
        _held[connection] = self.held
        return connection

    def create_cursor(self, name: str | None = None) -> Any:
        if name and self.held.statements:  # a server-side cursor: sent on its own
            self.connection.execute(self.held.take()[0])
        return super().create_cursor(name)

    def _start_transaction_under_autocommit(self) -> None:
        # Django calls this, when a backend has it, to begin a transaction.
        with debug_transaction(self, "BEGIN"):
            if not self.held.on:
                self._set_autocommit(False)  # psycopg sends BEGIN with the next statement
                return
            # psycopg stays in autocommit, so it sends no BEGIN of its own;
            # this one goes with the next statement.
            self.held.add(begin_sql(self.connection))
            self.held.begins = True

    def _savepoint(self, sid: str) -> None:
        if not self.held.on:
            super()._savepoint(sid)
            return
        sql = self.ops.savepoint_create_sql(sid)
        self.hold(sql)
        self.held.unsent[sid] = sql

    def _savepoint_rollback(self, sid: str) -> None:
        if sid in self.held.unsent:  # nothing was sent inside it
            self.held.drop_savepoint(sid)
            self.held.dropped.add(sid)
            return
        super()._savepoint_rollback(sid)

    def _savepoint_commit(self, sid: str) -> None:
        if sid in self.held.dropped:
            self.held.dropped.discard(sid)
            return
        if sid in self.held.unsent:  # nothing was sent inside it
            self.held.drop_savepoint(sid)
            return
        if self.held.on:
            self.hold(self.ops.savepoint_commit_sql(sid))
        else:
            super()._savepoint_commit(sid)

    def _commit(self) -> None:
        self.held.clear()  # savepoints and settings end with the transaction
        super()._commit()

    def _rollback(self) -> None:
        self.held.clear()
        super()._rollback()


def begin_sql(connection: psycopg.Connection[Any]) -> str:
    """``BEGIN`` with the transaction characteristics psycopg's connection is set to."""
    words = ["BEGIN"]
    if connection.isolation_level is not None:
        level = psycopg.IsolationLevel(connection.isolation_level).name.replace("_", " ")
        words.append(f"ISOLATION LEVEL {level}")
    if connection.read_only is not None:
        words.append("READ ONLY" if connection.read_only else "READ WRITE")
    if connection.deferrable is not None:
        words.append("DEFERRABLE" if connection.deferrable else "NOT DEFERRABLE")
    return " ".join(words)
