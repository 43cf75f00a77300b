"""The ``variants`` marker's rule, checked: a marked test sends a statement through the library.

The variants pass (``make test-variants``, which passes ``--check-variants``)
runs the tests marked ``variants`` again with every alias behind pgbouncer,
the aliases renamed and the verified tenant context. Each of those changes
only how a statement reaches PostgreSQL through the library's app, worker or
system alias (the aliases ``TENANCY`` names): a test that sends none through
them (one that ends before the library touches the database: a key refused
for its syntax, DRF's refusals before the key, settings, parsing) has the
same outcome in every variant, and running it again repeats it.

For the call of each marked test this counts the statements Django sends
through those aliases (``connection.execute_wrapper`` on each, in the test's
thread and, through ``connection_created``, on the connections other threads
open during the test), and fails a marked test that passed having sent none,
telling its author to unmark it. Sessions a test opens itself
(``tests.helpers.connect``, ``observer()``, a pooler's ``connect``) are not
counted: what they send is not the library's (docs/contributing.md says why
that loses nothing).

With the wrapper installed, ``DatabaseWrapper.hold()`` of the library's
backend gives held statements to a cursor (so that wrappers see them) rather
than holding them without one; the message sent is the same
(tenancy/backends/postgresql/base.py). ``make test`` runs without it.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from typing import Any

import pytest


def library_aliases() -> set[str]:
    """The app, worker and system aliases, as the library finds them (``TENANCY``)."""
    from tenancy.aliases import app_alias, system_alias, worker_alias

    return {app_alias(), worker_alias(), system_alias()}


class VariantsCheck:
    """Registered by tests/conftest.py when pytest runs with ``--check-variants``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent: Counter[str] | None = None
        self._watched: set[int] = set()
        self._stack: contextlib.ExitStack | None = None

    def _count(self, execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        sent = self._sent
        if sent is not None:
            with self._lock:
                sent[context["connection"].alias] += 1
        return execute(sql, params, many, context)

    def _watch(self, connection: Any) -> None:
        with self._lock:
            if self._stack is None or id(connection) in self._watched:
                return
            self._watched.add(id(connection))
            self._stack.enter_context(connection.execute_wrapper(self._count))

    def _created(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        """``connection_created``: a connection another thread opened during the test."""
        if connection.alias in library_aliases():
            self._watch(connection)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        if item.get_closest_marker("variants") is None:
            return (yield)
        from django.db import connections
        from django.db.backends.signals import connection_created

        self._sent, self._watched = Counter(), set()
        with contextlib.ExitStack() as stack:
            self._stack = stack
            for alias in sorted(library_aliases()):
                self._watch(connections[alias])
            connection_created.connect(self._created, dispatch_uid="tests.variants_check")
            try:
                result = yield
            finally:
                connection_created.disconnect(dispatch_uid="tests.variants_check")
                with self._lock:
                    self._stack = None
        sent, self._sent = self._sent, None
        if not sent:
            pytest.fail(
                f"{item.nodeid} is marked `variants` but sent no statement through the"
                f" library's aliases ({', '.join(sorted(library_aliases()))}): no deployment"
                " variant can change its outcome, so make test-variants need not run it again."
                " Unmark it (docs/contributing.md, \"Which tests run again\").",
                pytrace=False,
            )
        return result
