"""``outbox_parked`` from the command line: a message shown whole, discards, jobs asked for
with --background and done by --work (the Celery task does the same), a worker told to stop
between two batches. (Ten thousand of them, asked for in the admin: tests/browser.)"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from outbox.deadletters import enqueue, work
from outbox.tasks import work_parked_jobs
from tenancy import tenant_context
from tenancy.aliases import system_alias
from tests.helpers import count_rows
from tests.outbox.factories import DeadLetterFactory


def park(tenant: int, sku: str, **fields):
    with tenant_context(tenant):
        return DeadLetterFactory(payload={"sku": sku}, **fields)


def test_a_row_named_is_shown_whole(capsys):
    row = park(1, "whole", error="Traceback (most recent call last):\n" + "x" * 300 + "\nBoom")
    call_command("outbox_parked")
    listed = capsys.readouterr().out
    assert "Boom" in listed and "x" * 300 not in listed
    call_command("outbox_parked", f"1/{row.id}")
    out = capsys.readouterr().out
    assert "x" * 300 in out and '"sku": "whole"' in out and str(row.message_id) in out
    with pytest.raises(CommandError, match=f"no parked message 2/{row.id}"):
        call_command("outbox_parked", f"2/{row.id}")


def test_discard_deletes_the_rows_named_unhandled(capsys):
    a, b = park(1, "a"), park(2, "b")
    call_command("outbox_parked", f"1/{a.id}", "--discard")
    assert "discarded: 1" in capsys.readouterr().out
    assert count_rows("outbox_dead_letters") == 1 and count_rows("testapp_order") == 0
    with pytest.raises(CommandError, match="--discard needs TENANT/ID"):
        call_command("outbox_parked", "--discard")
    assert b


def test_background_asks_for_a_job_and_work_does_it(capsys):
    for n in range(3):
        park(1, f"t1-{n}")
    park(2, "t2")
    park(1, "slow", consumer="orders-slow", topic="order.slow")
    call_command("outbox_parked", "--redrive", "--background", "--tenant", "1",
                 "--topic", "order.placed")
    assert "re-drive 3 parked message(s)" in capsys.readouterr().out
    assert count_rows("testapp_order") == 0  # asked, not done
    call_command("outbox_parked", "--jobs")
    assert "queued  0/3" in capsys.readouterr().out
    call_command("outbox_parked", "--work")
    assert "done: 3 handled, 0 failed again, 0 no longer parked" in capsys.readouterr().out
    assert count_rows("testapp_order", "tenant_id = 1") == 3
    assert count_rows("outbox_dead_letters") == 2
    with pytest.raises(CommandError, match="add --background"):
        call_command("outbox_parked", "--redrive", "--search", "t2")
    with pytest.raises(CommandError, match="give --redrive or --discard"):
        call_command("outbox_parked", "--background")


def test_the_celery_task_works_the_jobs():
    park(1, "by-task")
    job = enqueue("discard", search="by-task", requested_by="beat")
    assert work_parked_jobs.run() == [job.pk]
    assert count_rows("outbox_dead_letters") == 0


def test_a_worker_told_to_stop_lets_go_of_its_job_between_two_batches():
    for n in range(5):
        park(1, f"s-{n}")
    job = enqueue("redrive", requested_by="ops")
    asked = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > 2  # before the first job, before batch 1, then stop

    assert work(batch_size=2, stop=stop) == []
    job.refresh_from_db(using=system_alias())
    assert (job.state, job.handled, job.lease_until) == ("running", 2, None)
    assert [j.pk for j in work(batch_size=2)] == [job.pk]  # at once: no lease to wait out
    job.refresh_from_db(using=system_alias())
    assert (job.state, job.handled) == ("done", 5)
