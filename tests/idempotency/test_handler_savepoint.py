"""The handler's savepoint: ``transaction.atomic()``, opened after the key's lock.

The database backend holds its ``SAVEPOINT`` for the handler's first
statement and its ``RELEASE SAVEPOINT`` for the store
(tenancy.backends.postgresql). These tests hold it to what ``atomic()``
gives: a handler exception rolls everything back (the key is not stored,
nothing of the handler is left, a retry runs it again), a handler's own
``atomic()`` blocks and ``on_commit`` callbacks behave as usual, and a final
4xx undoes the handler's writes but keeps the key's lock until its answer is
committed.

They hold in every mode the suites run in: the plain and the verified
tenant context (``make test-verified``), a direct and a pooled alias
(``make test-pooled``).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from idempotency import core
from tenancy import current_tenant_id
from tenancy.aliases import app_alias
from tests.helpers import app_connection, count_rows, observer
from tests.testapp.models import Order


def request(key: str = "k") -> core.IdempotentRequest:
    return core.IdempotentRequest(
        tenant_id=1, scope="savepoint", key=key, fingerprint="f" * 64, method="POST", path="/x"
    )


def stored(status: int = 201) -> core.StoredResponse:
    return core.StoredResponse(status, b"{}", (("Content-Type", "application/json"),))


def order(sku: str) -> None:
    Order.objects.create(tenant_id=current_tenant_id(), sku=sku)


def skus() -> list[str]:
    with observer() as conn:
        return [row[0] for row in conn.execute("SELECT sku FROM testapp_order ORDER BY sku")]


def clean() -> bool:
    """The connection is back where it was before the request: no transaction, nothing held."""
    connection = app_connection()
    return (
        not connection.in_atomic_block
        and connection.get_autocommit()
        and not connection.needs_rollback
        and getattr(connection, "held", None) in (None, type(connection.held)())
    )


def test_inside_the_handler_django_sees_one_savepoint_in_the_keys_transaction():
    seen: list[tuple[Any, ...]] = []

    def handler() -> core.StoredResponse:
        connection = app_connection()
        seen.append((connection.in_atomic_block, len(connection.savepoint_ids),
                     len(connection.atomic_blocks), transaction.get_rollback(using=app_alias())))
        order("tea")
        return stored()

    result = core.execute(request(), handler, lambda r: r)
    assert result.outcome is core.Outcome.EXECUTED
    # Two blocks (the tenant_context's, the handler's savepoint), one savepoint id.
    assert seen == [(True, 1, 2, False)]
    assert skus() == ["tea"] and count_rows("idempotency_keys") == 1
    assert clean()


def test_a_handler_exception_stores_nothing_leaves_nothing_and_the_retry_runs_again():
    runs: list[str] = []
    committed: list[str] = []

    def failing() -> core.StoredResponse:
        runs.append("failing")
        order("lost")
        transaction.on_commit(lambda: committed.append("lost"), using=app_alias())
        raise RuntimeError("the handler failed after writing")

    with pytest.raises(RuntimeError, match="after writing"):
        core.execute(request(), failing, lambda r: r)
    assert skus() == [] and count_rows("idempotency_keys") == 0 and committed == []
    assert clean()

    def succeeding() -> core.StoredResponse:
        runs.append("retry")
        order("kept")
        transaction.on_commit(lambda: committed.append("kept"), using=app_alias())
        return stored()

    result = core.execute(request(), succeeding, lambda r: r)
    assert result.outcome is core.Outcome.EXECUTED
    assert runs == ["failing", "retry"]
    assert skus() == ["kept"] and count_rows("idempotency_keys") == 1 and committed == ["kept"]
    assert core.execute(request(), succeeding, lambda r: r).outcome is core.Outcome.REPLAYED
    assert runs == ["failing", "retry"] and clean()


def test_a_handlers_own_atomic_blocks_and_on_commit_callbacks_behave_as_usual():
    committed: list[str] = []

    def handler() -> core.StoredResponse:
        alias = app_alias()
        order("outer")
        with transaction.atomic(using=alias):
            order("inner")
            transaction.on_commit(lambda: committed.append("inner"), using=alias)
        try:
            with transaction.atomic(using=alias):
                order("undone")
                transaction.on_commit(lambda: committed.append("undone"), using=alias)
                raise ValueError("rolled back to the handler's own savepoint")
        except ValueError:
            pass
        with transaction.atomic(using=alias, savepoint=False):
            order("no-savepoint")
        # Its own savepoints came and went; the library's is still the innermost.
        assert len(app_connection().savepoint_ids) == 1
        return stored()

    result = core.execute(request(), handler, lambda r: r)
    assert result.outcome is core.Outcome.EXECUTED and result.verdict is core.Verdict.COMPLETED
    assert skus() == ["inner", "no-savepoint", "outer"]
    assert committed == ["inner"]
    assert count_rows("idempotency_keys", "state = 'completed'") == 1
    assert clean()


def test_a_final_4xx_undoes_the_handlers_writes_and_callbacks_and_stores_the_answer():
    committed: list[str] = []

    def handler() -> core.StoredResponse:
        order("declined")
        with transaction.atomic(using=app_alias()):
            order("declined-inner")
            transaction.on_commit(lambda: committed.append("declined"), using=app_alias())
        return stored(402)

    result = core.execute(request(), handler, lambda r: r)
    assert result.outcome is core.Outcome.EXECUTED and result.verdict is core.Verdict.FAILED
    assert skus() == [] and committed == []
    assert count_rows("idempotency_keys", "state = 'failed' AND status_code = 402") == 1
    assert clean()


def test_a_handler_that_marks_the_transaction_for_rollback_leaves_nothing_of_its_own():
    # transaction.set_rollback(True) inside the handler: atomic() would roll back
    # to the handler's savepoint on leaving it; so does the library's.
    def handler() -> core.StoredResponse:
        order("marked")
        transaction.set_rollback(True, using=app_alias())
        return stored()

    result = core.execute(request(), handler, lambda r: r)
    assert result.outcome is core.Outcome.EXECUTED
    assert skus() == [] and count_rows("idempotency_keys") == 1
    assert clean()


def lock_is_free(lock_id: int) -> bool:
    """Whether another session could take the key's advisory lock now."""
    with observer() as conn, conn.transaction():
        free = conn.execute("SELECT pg_try_advisory_xact_lock(%s)", [lock_id]).fetchone()[0]
    return bool(free)


@pytest.mark.parametrize("status", [402, 503], ids=["failed-4xx", "unstored-5xx"])
def test_the_keys_lock_is_held_after_the_handlers_writes_are_undone(status):
    # The savepoint opens after the claim's lock: rolling back to it (a final
    # 4xx) keeps the lock until the failed answer is committed, so a duplicate
    # cannot take the key and run the handler in between. A lock taken inside
    # the savepoint would be released by ROLLBACK TO SAVEPOINT.
    keyed = request()
    seen: list[tuple[str, bool]] = []

    def watch(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith("ROLLBACK TO SAVEPOINT") or "idempotency_store(" in sql:
            seen.append((sql.split(" ", 1)[0], lock_is_free(keyed.lock_id)))
        return execute(sql, params, many, context)

    def handler() -> core.StoredResponse:
        order("undone")
        assert not lock_is_free(keyed.lock_id)
        return stored(status)

    app_connection().ensure_connection()
    with app_connection().execute_wrapper(watch):
        result = core.execute(keyed, handler, lambda r: r)
    assert result.outcome is core.Outcome.EXECUTED
    if status == 402:  # the store comes after the rollback to the savepoint, lock held
        assert [held for _, held in seen] == [False, False], seen
        assert count_rows("idempotency_keys", "state = 'failed'") == 1
    else:  # unstored: nothing to store, the transaction ends
        assert [held for _, held in seen] == [False], seen
        assert count_rows("idempotency_keys") == 0
    assert skus() == [] and lock_is_free(keyed.lock_id) and clean()


def _tag(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    """A query-tagging execute wrapper: a comment at the head of every statement."""
    return execute(f"/* app=shop */ {sql}", params, many, context)


@pytest.mark.parametrize("status", [402, 201])
def test_a_wrapper_that_changes_the_savepoints_text_still_leaves_the_lock_outside_it(status):
    """An execute wrapper (query tagging) puts a comment at the head of every statement, the
    SAVEPOINT among them: the key's lock must still be taken outside the savepoint, and a final
    4xx keep it."""
    keyed = request(f"tagged-{status}")
    seen: list[bool] = []

    def watch(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if "ROLLBACK TO SAVEPOINT" in sql:
            seen.append(lock_is_free(keyed.lock_id))  # just after the rollback to the savepoint
        return result

    def handler() -> core.StoredResponse:
        order("tagged")
        return stored(status)

    app_connection().ensure_connection()
    with app_connection().execute_wrapper(_tag), app_connection().execute_wrapper(watch):
        result = core.execute(keyed, handler, lambda r: r)
    assert clean()
    if status == 402:
        assert result.verdict is core.Verdict.FAILED
        assert count_rows("idempotency_keys", "state = 'failed'") == 1 and skus() == []
        assert seen == [False], "the key's lock was released by ROLLBACK TO SAVEPOINT"
    else:
        assert result.outcome is core.Outcome.EXECUTED and skus() == ["tagged"]
    again = core.execute(keyed, handler, lambda r: r)  # the next request on this connection
    assert again.outcome is core.Outcome.REPLAYED and clean()
