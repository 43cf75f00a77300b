"""Pins the upstream behaviour that the outbox relies on without a promise from upstream.

Django does not document this as public API; a release may change it. Each
test here fails loudly, naming what moved, before the library could go wrong
quietly:

- Django: ``publish()`` looks for its wake-up among the connection's pending
  on-commit hooks (``connection.run_on_commit``: entries are tuples whose
  second item is the callable, and a rolled-back savepoint drops its hooks).

Pinned elsewhere, by behaviour:

- tests/outbox/test_redis_wire.py::test_the_transport_writes_the_message_send_task_writes:
  what the Celery transport writes equals what Celery's own ``send_task``
  writes for the same message (but for the random delivery tag and what
  the test names);
- test_redis_wire.py::test_postgresql_builds_the_envelope_the_relay_sent_before:
  the envelope JSON that PostgreSQL builds equals ``Message.envelope()``
  (unicode, big integers, nested JSON, null headers, ``created_at`` with and
  without a fraction).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from outbox import publish
from outbox.publishing import _kick, wake_up
from tenancy import tenant_context
from tenancy.aliases import app_alias
from tests.helpers import app_atomic, app_connection

A = 1


def pending_hooks() -> list[Any]:
    """The callables Django will run when the current transaction commits."""
    entries = app_connection().run_on_commit
    assert isinstance(entries, list), type(entries)
    for entry in entries:
        assert isinstance(entry, tuple) and callable(entry[1]), entry
    return [entry[1] for entry in entries]


def first() -> None:
    pass


def second() -> None:
    pass


def test_django_keeps_pending_on_commit_hooks_as_tuples_with_the_callable_second():
    with app_atomic():
        transaction.on_commit(first, using=app_alias())
        assert pending_hooks() == [first]
        with app_atomic():  # a savepoint that is released keeps its hooks
            transaction.on_commit(second, using=app_alias())
        assert pending_hooks() == [first, second]
    assert app_connection().run_on_commit == []


def test_django_drops_the_hooks_of_a_rolled_back_savepoint():
    with app_atomic():
        transaction.on_commit(first, using=app_alias())
        with pytest.raises(RuntimeError), app_atomic():
            transaction.on_commit(second, using=app_alias())
            raise RuntimeError
        assert pending_hooks() == [first]


def test_a_publish_after_a_rolled_back_savepoint_still_wakes_the_relay():
    """The failure the scan would cause if Django kept a dropped hook around."""
    wake_up.clear()
    with tenant_context(A):
        with pytest.raises(RuntimeError), app_atomic():
            publish("order.placed", {"sku": "dropped"})
            assert pending_hooks().count(_kick) == 1
            raise RuntimeError
        assert _kick not in pending_hooks()
        publish("order.placed", {"sku": "kept"})
        publish("order.placed", {"sku": "also kept"})
        assert pending_hooks().count(_kick) == 1
    assert wake_up.is_set()


def test_a_transaction_whose_only_publish_was_rolled_back_wakes_nobody():
    wake_up.clear()
    with tenant_context(A):
        with pytest.raises(RuntimeError), app_atomic():
            publish("order.placed", {"sku": "dropped"})
            raise RuntimeError
    assert not wake_up.is_set()


#: Where the library's Python lives (the four packages).
PACKAGES = ("idempotency", "outbox", "tenancy", "django_idempotency_outbox")
#: Modules whose classes the transports and receivers use.
UPSTREAM = ("kombu", "kombu.connection", "kombu.messaging", "kombu.entity", "kombu.common",
            "kombu.transport.redis", "kombu.transport.virtual.base", "kombu.transport.pyamqp",
            "amqp.channel", "amqp.connection", "amqp.transport", "celery", "celery.app.base",
            "celery.app.amqp", "celery.app.task", "celery.app.routes", "celery.local",
            "celery.utils.nodenames")


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_the_library_names_nothing_private_of_kombu_amqp_or_celery():
    """Issue 27: kombu's, py-amqp's and Celery's public API only.

    No import of a private name or module of theirs, and no attribute whose
    name is a private member of their modules or classes, unless the library
    defines that name itself (its own ``self._x``) or Django does (a model's
    ``_state``, which is Django's business here).
    """
    import ast
    import importlib
    import inspect
    from pathlib import Path

    from django.db import models

    root = Path(__file__).resolve().parents[2]
    theirs: set[str] = set()
    for name in UPSTREAM:
        module = importlib.import_module(name)
        for member, value in vars(module).items():
            if private(member):
                theirs.add(member)
            if inspect.isclass(value) and value.__module__.split(".")[0] in {
                    "kombu", "amqp", "celery"}:
                theirs.update(m for m in dir(value) if private(m))
    theirs.add("_expires")  # kombu's Redis channel's, set in its __init__ (dir() misses it)
    # A model instance's _state (set in Model.__init__) and the rest of Model's are Django's.
    ours: set[str] = {m for m in dir(models.Model) if private(m)} | {"_state"}
    trees = {path: ast.parse(path.read_text()) for package in PACKAGES
             for path in sorted((root / package).rglob("*.py"))}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                ours.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and (
                    node.value.id in {"self", "cls"}):
                ours.add(node.attr)
    found = []
    for path, tree in trees.items():
        where = path.relative_to(root)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in {
                    "kombu", "amqp", "celery"}:
                parts = (node.module or "").split(".") + [a.name for a in node.names]
                found += [f"{where}:{node.lineno} imports {p}" for p in parts if private(p)]
            elif isinstance(node, ast.Attribute) and node.attr in theirs - ours:
                found.append(f"{where}:{node.lineno} .{node.attr}")
    assert not found, "\n".join(found)
    # The scan sees what it should: the names issue 27 listed are theirs.
    assert {"_put", "_inplace_augment_message", "_q_for_pri", "_basic_publish",
            "_get_current_object"} <= theirs - ours
