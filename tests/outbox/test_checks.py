"""What `manage.py check` says about the outbox: the fence's two facts in the database
(outbox.E001/E002), and receiver tasks that could lose a message or run it twice
(outbox.W100-W105, also said by a starting worker)."""

from __future__ import annotations

import pytest
from celery import Celery
from django.core import checks

from outbox import ReceiverTask, receiver
from outbox.celery import check_app, receiver_tasks, visibility_timeout
from outbox.checks import check_fence
from tenancy.aliases import app_alias, system_alias
from tests.helpers import observer

# -- the fence (database checks) ----------------------------------------------


def fence_ids(databases=None) -> list[str]:
    databases = [app_alias(), system_alias()] if databases is None else databases
    return [m.id for m in checks.run_checks(databases=list(databases),
                                            tags=[checks.Tags.database])
            if m.id and m.id.startswith("outbox.E")]  # outbox.I130: its own test, below


def test_a_migrated_database_passes():
    assert fence_ids() == []
    assert check_fence(databases=[app_alias(), system_alias()]) == []


def test_a_sequence_that_hands_out_values_out_of_order_is_an_error():
    with observer() as conn:
        for change in ("CACHE 20", "CYCLE", "INCREMENT BY -1"):
            conn.execute(f"ALTER SEQUENCE outbox_message_ids {change}")
            try:
                assert fence_ids([app_alias()]) == ["outbox.E001"], change
            finally:
                conn.execute("ALTER SEQUENCE outbox_message_ids CACHE 1 NO CYCLE INCREMENT BY 1")
    assert fence_ids() == []


def test_a_server_that_lets_the_web_role_prepare_a_transaction_is_a_deployment_warning(
    prepared_transactions,
):
    """Issue 29, item 4: PostgreSQL has no privilege for PREPARE TRANSACTION; the suite's
    cluster allows 8 (to test the fence with them), so `check --deploy --database` warns and
    says how to keep the web role from preparing one. Not without --deploy (nor a plain
    check): a deployment's hardening, like Django's own --deploy checks."""
    [warning] = [m for m in checks.run_checks(databases=[app_alias()],
                                              include_deployment_checks=True)
                 if m.id == "outbox.W003"]
    assert "max_prepared_transactions is 8" in warning.msg and "web role" in warning.msg
    assert "max_prepared_transactions = 0" in warning.hint
    assert "outbox.W003" not in [m.id for m in checks.run_checks(databases=[app_alias()])]


RECREATE = ("CREATE TRIGGER outbox_messages_mark_publisher BEFORE INSERT ON outbox_messages"
            " FOR EACH ROW EXECUTE FUNCTION outbox_mark_publisher_v2()")


@pytest.mark.parametrize("change, undo, found", [
    ("ALTER TABLE outbox_messages DISABLE TRIGGER outbox_messages_mark_publisher",
     "ALTER TABLE outbox_messages ENABLE TRIGGER outbox_messages_mark_publisher",
     "the marking trigger is disabled (tgenabled 'D')"),
    ("ALTER TABLE outbox_messages ENABLE REPLICA TRIGGER outbox_messages_mark_publisher",
     "ALTER TABLE outbox_messages ENABLE TRIGGER outbox_messages_mark_publisher",
     "the marking trigger is disabled (tgenabled 'R')"),
    ("DROP TRIGGER outbox_messages_mark_publisher ON outbox_messages", RECREATE,
     "no trigger marks publishers"),
    ("ALTER TABLE outbox_messages ALTER COLUMN id SET DEFAULT nextval('outbox_message_ids')",
     "ALTER TABLE outbox_messages ALTER COLUMN id DROP DEFAULT",
     "outbox_messages.id has the default \"nextval('outbox_message_ids'::regclass)\""),
], ids=["disabled", "replica only", "dropped", "a default"])
def test_messages_that_would_not_mark_their_publisher_are_an_error(change, undo, found):
    with observer() as conn:
        conn.execute(change)
        try:
            [error] = check_fence(databases=[system_alias()])
            assert error.id == "outbox.E002"
            assert found in error.msg
        finally:
            conn.execute(undo)
    assert fence_ids() == []


# -- receiver tasks -----------------------------------------------------------


def app_with(broker="redis://127.0.0.1:1/0", base=None, **options):
    app = Celery("dio-checks", broker=broker, set_as_current=False)
    task_options = {"base": base} if base else {}

    @app.task(name="checks.receive", shared=False, **task_options, **options)
    @receiver("checks.receive")
    def receive(message):
        pass

    @app.task(name="checks.plain", shared=False)
    def plain(envelope):  # not a receiver: nothing to say about it
        pass

    return app


def ids(app):
    return sorted(p.id for p in check_app(app))


def test_a_receiver_task_with_celerys_defaults_can_lose_messages():
    app = app_with()
    assert [t.name for t in receiver_tasks(app)] == ["checks.receive"]
    assert ids(app) == ["outbox.W101", "outbox.W102"]
    problems = {p.id: p.message for p in check_app(app)}
    assert "acknowledges them early" in problems["outbox.W101"]
    assert "reject_on_worker_lost" in problems["outbox.W102"]


def test_the_test_workers_tasks_join_no_other_app():
    """The suite's own Celery apps keep their tasks: importing them adds nothing to an app
    built later (the receiver checks above count an app's tasks, whatever ran before)."""
    import tests.outbox.support.fault_worker_app
    import tests.outbox.support.order_worker_app  # noqa: F401

    assert [t.name for t in receiver_tasks(app_with())] == ["checks.receive"]


def test_a_receiver_task_on_receivertask_keeps_the_promise():
    assert ids(app_with(base=ReceiverTask)) == []


def test_the_apps_own_defaults_count_too():
    app = app_with()
    app.conf.task_acks_late = True
    app.conf.task_reject_on_worker_lost = True
    assert ids(app) == []


def test_a_hard_time_limit_that_acknowledges_is_reported():
    app = app_with()
    app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True, task_time_limit=60)
    assert ids(app) == ["outbox.W103"]
    assert ids(app_with(base=ReceiverTask, time_limit=60)) == []


def test_a_visibility_timeout_shorter_than_a_task_or_a_retry_pause_is_reported(settings):
    app = app_with(base=ReceiverTask, time_limit=120)
    app.conf.broker_transport_options = {"visibility_timeout": 100}
    [problem] = check_app(app)
    assert problem.id == "outbox.W104" and "its time limit" in problem.message
    app.conf.broker_transport_options = {"visibility_timeout": 400}  # > 120 s and > 300 s
    assert check_app(app) == []
    settings.OUTBOX = {**settings.OUTBOX, "RECEIVER_RETRY_BACKOFF_MAX": 500}
    [problem] = check_app(app)
    assert "the longest retry pause" in problem.message


def test_brokers_without_a_visibility_timeout_are_not_asked_about_it():
    assert visibility_timeout(app_with(broker="amqp://localhost//")) is None
    assert visibility_timeout(app_with(broker="redis://localhost/0")) == 3600.0
    assert visibility_timeout(app_with(broker="sqs://")) == 30.0


def test_manage_py_check_reports_the_configured_apps_receivers(settings):
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_APP": app_with()}
    found = {m.id: m for m in checks.run_checks() if m.id.startswith("outbox.")}
    assert sorted(found) == ["outbox.W101", "outbox.W102"]
    assert all(m.level == checks.WARNING for m in found.values())
    assert "ReceiverTask" in found["outbox.W101"].hint


def test_an_app_that_cannot_load_is_a_warning_not_a_crash(settings):
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_APP": "tests.no_such_module.app"}
    found = [m for m in checks.run_checks() if m.id.startswith("outbox.")]
    assert [m.id for m in found] == ["outbox.W100"]
    assert "No module named" in found[0].msg


def test_called_outside_a_worker_a_receiver_raises_and_parks_nothing(tmp_path):
    from outbox.testing import relay_pending
    from tests.helpers import count_rows
    from tests.outbox.support.fault_worker_app import receive
    from tests.outbox.support.helpers import effects, publish_many

    failing = tmp_path / "failing"
    failing.touch()
    publish_many(1, "order.placed", [{"sku": "x", "fail_while": str(failing)}])
    [message] = relay_pending()
    with pytest.raises(RuntimeError, match="failing while"):
        receive(message.envelope())  # a task called as a function: no retry, no dead letter
    assert count_rows("outbox_dead_letters") == 0 and effects() == {}
    failing.unlink()
    receive(message.envelope())
    receive(message.envelope())  # a duplicate is skipped
    assert effects() == {str(message.message_id): 1}


def test_the_check_imports_the_tasks_once_though_celerys_django_fixup_runs_the_checks_again(
    settings, monkeypatch
):
    # Importing task modules makes Celery's Django fix-up run Django's system
    # checks, this one included: without a guard they call each other until
    # Python's recursion limit (every manage.py command then logs RecursionErrors).
    from celery.loaders.base import BaseLoader

    imports = []
    original = BaseLoader.import_default_modules

    def counted(self):
        imports.append(self)
        return original(self)

    monkeypatch.setattr(BaseLoader, "import_default_modules", counted)
    app = app_with(base=ReceiverTask)
    assert app._fixups  # the Django fix-up is installed, as in any Django project
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_APP": app}
    assert [m for m in checks.run_checks() if m.id.startswith("outbox.")] == []
    assert len(imports) == 1


def test_check_says_what_to_grant_for_the_holders_age(settings):
    from outbox.checks import check_stats_privilege

    role = settings.DATABASES[system_alias()]["USER"]
    [warning] = check_stats_privilege(databases=[app_alias(), system_alias()])
    assert warning.id == "outbox.I130" and f"the role {role} is not" in warning.msg
    assert warning.hint.startswith(f"As a superuser: GRANT pg_read_all_stats TO {role};")
    with observer() as conn:
        conn.execute(f"GRANT pg_read_all_stats TO {role}")
    try:
        assert check_stats_privilege(databases=[system_alias()]) == []
    finally:
        with observer() as conn:
            conn.execute(f"REVOKE pg_read_all_stats FROM {role}")
