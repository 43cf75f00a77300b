"""Django's PostgreSQL backend for a role that does not own the tables.

The app, worker and system aliases of :func:`tenancy.databases` use
it. In a deployment it is Django's backend, unchanged. Under ``manage.py
test`` (and pytest-django) it hands to the owner's alias, named by
``TEST["OWNER"]``, what only the owner may do, as in a deployment:

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

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.backends.postgresql import base, creation, operations


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


class DatabaseWrapper(base.DatabaseWrapper):
    creation_class = DatabaseCreation
    ops_class = DatabaseOperations
