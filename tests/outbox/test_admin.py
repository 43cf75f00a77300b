"""The outbox admin: parked messages listed across tenants and filtered, each on a page of its
own with the whole error; re-drive and discard of one message on its page, of a selection or
of everything a filter matches as a background job; who did what in Django's admin log and
the log lines; staff confined to tenants; reader positions read-only."""

from __future__ import annotations

import html
import logging
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db.models.functions import Now
from django.test import Client

from outbox.consumers import ensure_offsets
from outbox.deadletters import enqueue, spans, work
from outbox.models import DeadLetter, ParkedJob
from tenancy import tenant_context
from tenancy.aliases import system_alias
from tests.helpers import count_rows, observer
from tests.outbox.factories import DeadLetterFactory
from tests.outbox.support.helpers import publish_as
from tests.outbox.support.recorders import OrderRecorder

PARKED = "/admin/outbox/parkedmessagerecord/"
JOBS = "/admin/outbox/parkedjob/"
POSITIONS = "/admin/outbox/readerpositionrecord/"


@pytest.fixture
def staff():
    user = User.objects.create_superuser("ops", "ops@example.com", "pw")
    client = Client()
    client.force_login(user)
    client.user = user
    yield client
    User.objects.all().delete()


def park(tenant: int, sku: str, **fields) -> DeadLetter:
    with tenant_context(tenant):
        return DeadLetterFactory(payload={"sku": sku, **fields.pop("payload", {})}, **fields)


@pytest.fixture
def parked():
    return {
        "fixable": park(1, "fixable"),
        "poison": park(2, "poison", payload={"poison": True},
                       error="Traceback (most recent call last):\nBoom: poison message"),
        "other": park(2, "other", consumer="orders-slow", topic="order.slow"),
    }


def listed(client, parked, query: str = "") -> set[str]:
    """The skus of ``parked`` whose rows the list shows (by their tenant/id links)."""
    response = client.get(PARKED + query)
    assert response.status_code == 200
    text = response.content.decode()
    return {sku for sku, row in parked.items() if f">{row.tenant_id}/{row.id}<" in text}


def remaining() -> set[str]:
    with observer() as conn:
        return {r[0] for r in conn.execute("SELECT payload->>'sku' FROM outbox_dead_letters")}


def act(client, action: str, rows: list[DeadLetter], confirmed: bool, query: str = "",
        everything: bool = False):
    data = {"action": action, "_selected_action": [str(r.id) for r in rows]}
    if everything:
        data["select_across"] = "1"
    if confirmed:
        data["confirmed"] = "yes"
    return client.post(PARKED + query, data)


def page(row: DeadLetter) -> str:
    return f"{PARKED}{row.tenant_id}/{row.id}/"


def log_entries(user: User) -> list[str]:
    return [e.change_message for e in LogEntry.objects.filter(user=user).order_by("id")]


def test_every_tenants_parked_messages_are_listed_and_filtered(staff, parked):
    assert listed(staff, parked) == {"fixable", "poison", "other"}
    assert listed(staff, parked, "?tenant_id=2") == {"poison", "other"}
    assert listed(staff, parked, "?consumer=orders") == {"fixable", "poison"}
    assert listed(staff, parked, "?topic=order.slow") == {"other"}
    assert listed(staff, parked, "?q=key-poison") == {"poison"}  # searched by key
    assert listed(staff, parked, f"?q={parked['fixable'].message_id}") == {"fixable"}
    assert listed(staff, parked, "?q=poison+message") == {"poison"}  # and by the error's text
    assert "Boom: it failed" in staff.get(PARKED).content.decode()  # the last error line
    assert staff.get(PARKED + "?tenant_id=x").status_code == 302  # Django's "?e=1"


def test_a_parked_message_has_a_page_with_the_whole_error_and_the_message(staff, parked):
    row = parked["poison"]
    frames = "".join(f'  File "shop/step{n}.py", line {n}, in step{n}\n' for n in range(30))
    error = f"Traceback (most recent call last):\n{frames}Boom: poison message"
    with tenant_context(2):
        DeadLetter.objects.filter(pk=row.pk).update(
            headers={"traceparent": "00-abc-def-01"}, aggregate_type="order",
            aggregate_id="A-7", parked_at=Now() - timedelta(seconds=3723), error=error)
    text = staff.get(page(row)).content.decode()
    assert html.escape(error, quote=True) in text  # all of it, every frame
    assert '&quot;poison&quot;: true' in text and "traceparent" in text  # payload, headers
    assert f"{row.message_id}" in text and "order A-7" in text and "key-poison" in text
    assert '<td id="attempts">5</td>' in text
    # Times to the second, not the admin's minutes.
    with observer() as conn:
        parked_at = conn.execute("SELECT parked_at FROM outbox_dead_letters WHERE id = %s",
                                 [row.id]).fetchone()[0]
    assert parked_at.strftime("%Y-%m-%d %H:%M:%S") in text
    assert "a consumer reads the outbox table" in text  # its signature state
    assert 'id="redrive"' in text and 'id="discard"' in text
    assert staff.get(f"{PARKED}1/{row.id}/").status_code == 404  # (tenant, id), never id alone


def test_redriving_on_the_page_handles_it_as_its_tenant_and_writes_who_did_it(
        staff, parked, caplog):
    row = parked["fixable"]
    with caplog.at_level(logging.WARNING, logger="outbox"):
        response = staff.post(page(row), {"act": "redrive"})
    assert response.status_code == 302 and response["Location"] == PARKED
    assert remaining() == {"poison", "other"}
    assert count_rows("testapp_order", "tenant_id = 1 AND sku = 'fixable'") == 1
    assert log_entries(staff.user) == [f"re-drove 1/{row.id}: handled"]
    assert f"ops (admin) re-drove 1 parked message(s): 1 handled (1/{row.id})" in caplog.text


def test_a_redrive_that_fails_again_keeps_parked_at_and_records_the_new_failure(staff, parked):
    row = parked["poison"]
    with observer() as conn:
        conn.execute("UPDATE outbox_dead_letters SET parked_at = now() - interval '1 day', "
                     "error = 'the old error' WHERE id = %s", [row.id])
        before = conn.execute("SELECT parked_at FROM outbox_dead_letters WHERE id = %s",
                              [row.id]).fetchone()[0]
    response = staff.post(page(row), {"act": "redrive"})
    assert response.status_code == 302 and response["Location"] == page(row)
    with observer() as conn:
        attempts, parked_at, failed_at, error = conn.execute(
            "SELECT attempts, parked_at, redrive_failed_at, error FROM outbox_dead_letters "
            "WHERE id = %s", [row.id]).fetchone()
    assert attempts == 6 and parked_at == before
    assert failed_at is not None and failed_at > parked_at
    assert "Boom: poison message poison" in error and "the old error" not in error
    assert log_entries(staff.user) == [f"re-drove 2/{row.id}: failed again"]
    assert count_rows("testapp_order") == 0  # its partial effect was rolled back


def test_discarding_on_the_page_asks_first(staff, parked):
    row = parked["other"]
    response = staff.post(page(row), {"act": "discard"})
    assert response.status_code == 200 and "cannot be undone" in response.content.decode()
    assert remaining() == {"fixable", "poison", "other"}
    response = staff.post(page(row), {"act": "discard", "confirmed": "yes"})
    assert response.status_code == 302
    assert remaining() == {"fixable", "poison"}
    assert log_entries(staff.user) == [f"discarded 2/{row.id} unhandled"]
    assert count_rows("testapp_order") == 0


def test_redriving_a_selection_asks_then_runs_in_the_background(staff, parked):
    rows = [parked["fixable"], parked["poison"]]
    response = act(staff, "redrive_selected", rows, False)
    assert response.status_code == 200
    text = response.content.decode()
    assert "Re-drive 2 parked message(s)?" in text and "Yes, re-drive them" in text
    assert ParkedJob.objects.using(system_alias()).count() == 0

    response = act(staff, "redrive_selected", rows, True)
    job = ParkedJob.objects.using(system_alias()).get()
    assert response.status_code == 302 and response["Location"] == f"{JOBS}{job.pk}/change/"
    # Nothing was re-driven inside the request: the job waits for a worker.
    assert remaining() == {"fixable", "poison", "other"} and count_rows("testapp_order") == 0
    assert job.state == "queued" and job.total == 2
    assert "No worker has taken it yet" in staff.get(response["Location"]).content.decode()

    assert [j.pk for j in work()] == [job.pk]
    job.refresh_from_db(using=system_alias())
    assert (job.state, job.handled, job.failed, job.missing) == ("done", 1, 1, 0)
    assert remaining() == {"poison", "other"}
    assert count_rows("testapp_order", "tenant_id = 1 AND sku = 'fixable'") == 1
    text = staff.get(f"{JOBS}{job.pk}/change/").content.decode()
    assert '<td id="state">done</td>' in text and "2 of 2 (100%)" in text
    assert log_entries(staff.user) == [
        f"asked to re-drive 2 parked message(s) as job {job.pk}",
        f"job {job.pk} re-drove the parked messages of the rows "
        f"{spans([(1, rows[0].id), (2, rows[1].id)])}, parked as id {job.upto_id} or before: "
        "1 handled, 1 failed again, 0 no longer parked",
    ]


def test_everything_a_filter_matches_is_one_job_and_later_messages_are_left_alone(
        staff, parked):
    more = [park(1, f"more-{n}") for n in range(5)]
    response = act(staff, "discard_selected", [parked["fixable"]], False,
                   query="?consumer=orders", everything=True)
    assert "Discard 7 parked message(s)?" in response.content.decode()  # 2 + 5, not "other"
    act(staff, "discard_selected", [parked["fixable"]], True, query="?consumer=orders",
        everything=True)
    late = park(1, "late")  # parked after the job was asked for
    job = ParkedJob.objects.using(system_alias()).get()
    assert (job.consumer, job.total) == ("orders", 7)
    work(batch_size=3)  # three batches
    job.refresh_from_db(using=system_alias())
    assert (job.state, job.handled, job.missing) == ("done", 7, 0)
    assert remaining() == {"other", "late"}
    assert (job.after_tenant_id, job.after_id) == (2, parked["poison"].id)
    assert late.id > job.upto_id and more[-1].id <= job.upto_id


def test_a_job_whose_worker_died_is_taken_over_where_it_stopped(staff, parked):
    bulk = [park(1, f"bulk-{n}", payload={"poison": n == 0}) for n in range(6)]
    job = enqueue("redrive", consumer="orders", requested_by="ops")

    class Died(Exception):
        pass

    def die_after_the_first_batch(progress: ParkedJob) -> None:
        raise Died

    with pytest.raises(Died):  # its first batch: fixable, bulk-0 (fails again), bulk-1, bulk-2
        work(batch_size=4, progress=die_after_the_first_batch)
    job.refresh_from_db(using=system_alias())
    assert (job.state, job.handled, job.failed) == ("running", 3, 1)
    assert work(owner="another") == []  # its lease still holds: nobody shares a job
    ParkedJob.objects.using(system_alias()).filter(pk=job.pk).update(lease_until=Now())
    assert [j.pk for j in work(owner="another")] == [job.pk]
    job.refresh_from_db(using=system_alias())
    assert (job.state, job.handled, job.failed) == ("done", 6, 2)  # + bulk-3..5, poison
    # The first batch was not done again: bulk-0 was re-driven once, each effect is once.
    with observer() as conn:
        assert conn.execute("SELECT attempts FROM outbox_dead_letters WHERE id = %s",
                            [bulk[0].id]).fetchone() == (6,)
        assert conn.execute("SELECT count(*), count(DISTINCT note) FROM testapp_order"
                            ).fetchone() == (6, 6)


def test_django_delete_selected_is_not_offered(staff, parked):
    page_text = staff.get(PARKED).content.decode()
    assert "delete_selected" not in page_text
    assert "redrive_selected" in page_text and "discard_selected" in page_text


def test_a_non_staff_user_is_refused(parked):
    user = User.objects.create_user("visitor", password="pw")
    client = Client()
    client.force_login(user)
    try:
        response = client.get(PARKED)
        assert response.status_code == 302 and "/login/" in response["Location"]
        assert client.post(page(parked["other"]), {"act": "discard", "confirmed": "yes"}
                           ).status_code == 302
        act(client, "discard_selected", [parked["other"]], True)
        assert remaining() == {"fixable", "poison", "other"}
    finally:
        User.objects.all().delete()


def test_staff_who_may_only_view_cannot_act(parked):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_parkedmessagerecord"))
    client = Client()
    client.force_login(user)
    try:
        text = client.get(PARKED).content.decode()
        assert ">1/" in text and "discard_selected" not in text
        text = client.get(page(parked["other"])).content.decode()
        assert "Boom: it failed" in text and 'id="discard"' not in text
        assert client.post(page(parked["other"]), {"act": "discard", "confirmed": "yes"}
                           ).status_code == 403
        assert client.post(page(parked["fixable"]), {"act": "redrive"}).status_code == 403
        act(client, "discard_selected", [parked["other"]], True, everything=True)
        assert remaining() == {"fixable", "poison", "other"}
        assert ParkedJob.objects.using(system_alias()).count() == 0
    finally:
        User.objects.all().delete()


def only_tenant_one(request):
    return None if request.user.username == "ops" else [1]


@pytest.fixture
def confined(settings):
    settings.TENANCY = {**settings.TENANCY,
                        "ADMIN_TENANTS": "tests.outbox.test_admin.only_tenant_one"}
    user = User.objects.create_superuser("merchant-1-ops", "m@example.com", "pw")
    client = Client()
    client.force_login(user)
    yield client
    User.objects.all().delete()


def test_staff_confined_to_a_tenant_see_and_touch_only_its_messages(confined, parked):
    assert listed(confined, parked) == {"fixable"}
    assert listed(confined, parked, "?tenant_id=2") == set()
    assert confined.get(page(parked["poison"])).status_code == 404
    assert confined.post(page(parked["other"]), {"act": "discard", "confirmed": "yes"}
                         ).status_code == 404
    # "Everything", even asked for tenant 2 by name, is tenant 1's only.
    act(confined, "discard_selected", [parked["fixable"]], True, everything=True)
    act(confined, "discard_selected", [parked["fixable"]], True, query="?tenant_id=2",
        everything=True)
    # A selection naming another tenant's row does not reach it either.
    act(confined, "discard_selected", [parked["poison"]], True)
    work()
    assert remaining() == {"poison", "other"}
    jobs = ParkedJob.objects.using(system_alias()).order_by("id")
    assert [j.tenants for j in jobs] == [[1], [], [1]]
    assert [j.total for j in jobs] == [1, 0, 0]


def test_reader_positions_show_lag_and_are_read_only(staff):
    ensure_offsets(OrderRecorder())
    publish_as(1, "order.placed", {"sku": "waiting"})
    response = staff.get(POSITIONS)
    assert response.status_code == 200
    text = response.content.decode()
    assert ">orders<" in text
    assert '<td class="field-behind">1</td>' in text
    assert staff.get(POSITIONS + "add/").status_code == 403
    assert "action-select" not in text  # no actions, nothing to select
