"""The relay signs what it sends; a receiver refuses what it did not sign.

docs/outbox.md, "Who may write to the broker": with ``OUTBOX["SIGNING_KEYS"]``
set, a writer to the broker who does not hold a key can no longer forge or
alter a message, a replayed genuine message is still a no-op for each
receiver, and keys rotate without refusing a genuine message. Each claim of
that section is a test here, against the real roles and, for what crosses the
broker, a real Redis and a real Celery worker.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import uuid
from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import Reject, Retry
from django.conf import settings as django_settings
from django.core import checks
from kombu.serialization import loads as kombu_loads

from django_idempotency_outbox.errors import ConfigurationError
from outbox import ReceiverTask, receive, receiver
from outbox.celery import deliver
from outbox.conf import SigningKey, outbox_settings
from outbox.deadletters import redrive
from outbox.exceptions import BadSignature
from outbox.relay import Relay, rewind
from outbox.retention import reap
from outbox.signing import signature, verify
from outbox.stream import Message
from outbox.testing import relay_pending
from outbox.transports import CeleryTransport
from tenancy import current_tenant_id
from tests.helpers import count_rows, observer
from tests.outbox.support.helpers import (
    FAULT_PROCESS_SETTINGS,
    FAULT_WORKER_APP,
    SUBPROCESS_SETTINGS,
    effects,
    publish_as,
    publish_many,
    queue_length,
    wait_for,
)
from tests.outbox.support.rig import Worker
from tests.testapp.models import Order

A, B = 1, 2
NEW = "the-new-key-of-the-relay-and-its-workers-0001"
OLD = "the-old-key-still-accepted-while-it-rotates-02"
GONE = b"a-key-that-was-dropped-from-the-list-long-ago!"
RECEIVER = "signing.record"


# -- factories -------------------------------------------------------------------


def use_keys(settings, *secrets: str | bytes) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "SIGNING_KEYS": list(secrets)}


def key(secret: str | bytes) -> SigningKey:
    return SigningKey.of(secret.encode() if isinstance(secret, str) else secret)


def relayed(*payloads: dict[str, Any], tenant: int = A) -> list[dict[str, Any]]:
    """Publish ``payloads`` and relay them: the envelopes as the relay sends them."""
    publish_many(tenant, "order.placed", payloads)
    messages = relay_pending()
    assert len(messages) == len(payloads)
    return [m.envelope() for m in messages]


def record(message: Message) -> str:
    """The receivers' effect: an order of the message's tenant, noted with its id."""
    Order.objects.create(tenant_id=current_tenant_id(), sku=str(message.payload["sku"])[:50],
                         note=str(message.message_id))
    return "ran"


def nothing_written() -> bool:
    return (effects() == {} and count_rows("outbox_received") == 0
            and count_rows("outbox_dead_letters") == 0)


def recording_task(app_name: str = "dio-signing", *, fail_first: int = 0) -> Any:
    """A Celery receiver task (``ReceiverTask``, ``@receiver``) that records an order.

    ``fail_first``: it raises on that many calls first.
    """
    app = Celery(app_name, broker="memory://", set_as_current=False)
    calls = {"n": 0}

    @app.task(base=ReceiverTask, name=RECEIVER, shared=False)
    @receiver(RECEIVER)
    def record_task(message: Message) -> str:
        calls["n"] += 1
        if calls["n"] <= fail_first:
            raise RuntimeError("the handler failed")
        return record(message)

    return app.tasks[RECEIVER]


def run_as_worker(task: Any, envelope: Any, retries: int = 0, body: Any = None) -> Any:
    """What the worker's run of the task does: ``deliver`` around the receiver.

    ``body``: the receiver (``receive`` of :func:`record` when omitted).
    """
    task.push_request(id=str(uuid.uuid4()), args=[envelope], kwargs={}, retries=retries,
                      called_directly=False, is_eager=False,
                      delivery_info={"exchange": "", "routing_key": "celery"})
    try:
        return deliver(task, envelope,
                       body or (lambda m: receive(m, record, receiver=RECEIVER)))
    finally:
        task.pop_request()


# -- signed, forged, unsigned ------------------------------------------------------


def test_a_signed_envelope_is_handled_as_its_tenant(settings):
    use_keys(settings, NEW)
    [envelope] = relayed({"sku": "tea"})
    assert envelope["signature"].startswith(f"v1.{key(NEW).key_id}.")
    assert receive(envelope, record, receiver=RECEIVER) == (True, "ran")
    with observer() as conn:
        rows = conn.execute("SELECT tenant_id, sku, note FROM testapp_order").fetchall()
    assert rows == [(A, "tea", envelope["message_id"])]


@pytest.mark.parametrize(("field", "forged"), [
    ("tenant_id", B),
    ("payload", {"sku": "forged"}),
    ("message_id", str(uuid.uuid4())),
    ("id", 10**12),
    ("topic", "order.refunded"),
    ("key", "order:other"),
    ("aggregate_type", "invoice"),
    ("aggregate_id", "99"),
    ("headers", {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}),
    ("created_at", "2020-01-01T00:00:00+00:00"),
    ("extra", "a key the relay never sends"),
])
def test_an_envelope_altered_with_its_signature_kept_is_refused_before_anything_runs(
    settings, caplog, field, forged
):
    use_keys(settings, NEW)
    [genuine] = relayed({"sku": "secret-sku"})
    envelope = {**genuine, field: forged}
    with caplog.at_level(logging.ERROR, logger="outbox"), pytest.raises(BadSignature):
        receive(envelope, record, receiver=RECEIVER)
    assert nothing_written()
    [line] = [r.getMessage() for r in caplog.records]
    assert f"receiver {RECEIVER} refused message {envelope['message_id']}" in line
    assert "does not match its content" in line
    assert "secret-sku" not in caplog.text and "forged" not in caplog.text  # never the payload


def test_an_envelope_re_signed_with_another_key_is_refused(settings):
    use_keys(settings, NEW)
    [genuine] = relayed({"sku": "tea"})
    forged = {**genuine, "tenant_id": B}
    forged["signature"] = signature(forged, key(GONE))
    with pytest.raises(BadSignature, match=f"signed with key {key(GONE).key_id}, which is not"):
        receive(forged, record, receiver=RECEIVER)
    assert nothing_written()


@pytest.mark.parametrize("mark", [None, "", "v1", 42, "v2." + "0" * 8 + "." + "0" * 64,
                                  "v1.zzzzzzzz." + "0" * 64, "v1.0000000." + "é" * 64])
def test_an_unsigned_or_malformed_envelope_is_refused_when_keys_are_set(settings, mark):
    [unsigned] = relayed({"sku": "tea"})  # no keys yet: the relay does not sign
    assert "signature" not in unsigned
    use_keys(settings, NEW)
    envelope = unsigned if mark is None else {**unsigned, "signature": mark}
    with pytest.raises(BadSignature):
        receive(envelope, record, receiver=RECEIVER)
    assert nothing_written()


def test_without_keys_nothing_is_signed_or_verified(settings):
    [unsigned] = relayed({"sku": "tea"})
    assert "signature" not in unsigned
    assert receive(unsigned, record, receiver=RECEIVER)[0]
    use_keys(settings, NEW)
    [signed] = relayed({"sku": "coffee"})
    use_keys(settings)  # a worker without keys: a signature, right or wrong, is not looked at
    assert receive({**signed, "signature": "v1.junk"}, record, receiver=RECEIVER)[0]
    assert len(effects()) == 2


def test_a_replayed_genuine_message_is_a_no_op_while_the_receiver_remembers_its_id(settings):
    use_keys(settings, NEW)
    [envelope] = relayed({"sku": "tea"})
    assert receive(envelope, record, receiver=RECEIVER) == (True, "ran")
    assert receive(dict(envelope), record, receiver=RECEIVER) == (False, None)
    assert effects() == {envelope["message_id"]: 1}
    settings.OUTBOX = {**settings.OUTBOX, "RETENTION": 0}
    assert reap().received == 1  # forgotten: a replay now runs the handler again
    assert receive(dict(envelope), record, receiver=RECEIVER) == (True, "ran")
    assert effects() == {envelope["message_id"]: 2}


def test_the_mac_is_hmac_sha256_over_the_documented_encoding_compared_in_constant_time(
    settings, monkeypatch
):
    use_keys(settings, NEW)
    [envelope] = relayed({"sku": "tea", "n": 1.5, "nested": {"b": 1, "a": "é"}})
    content = {k: v for k, v in envelope.items() if k != "signature"}
    encoded = json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
    mac = hmac.new(NEW.encode(), b"outbox envelope v1\n" + encoded, hashlib.sha256).hexdigest()
    assert envelope["signature"] == f"v1.{key(NEW).key_id}.{mac}"
    assert re.fullmatch(r"[0-9a-f]{8}", key(NEW).key_id)
    compared = []
    original = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: compared.append(1) or original(a, b))
    verify(envelope)
    with pytest.raises(BadSignature):
        verify({**envelope, "tenant_id": B})
    assert compared == [1, 1]


def test_a_message_your_code_builds_is_not_verified(settings):
    [unsigned] = relayed({"sku": "tea"})
    use_keys(settings, NEW)
    assert receive(Message.from_envelope(unsigned), record, receiver=RECEIVER)[0]


def test_whoever_holds_a_key_can_sign_anything(settings):
    use_keys(settings, NEW)
    [genuine] = relayed({"sku": "tea"})
    forged = {**genuine, "tenant_id": B, "payload": {"sku": "forged"}}
    forged["signature"] = signature(forged, key(NEW))
    assert receive(forged, record, receiver=RECEIVER)[0]  # a key in the wrong hands forges
    with observer() as conn:
        assert conn.execute("SELECT tenant_id, sku FROM testapp_order").fetchall() == [
            (B, "forged")]


# -- key rotation ----------------------------------------------------------------------


def test_a_rotation_in_the_documented_steps_refuses_no_genuine_message(settings):
    use_keys(settings, OLD)
    [before] = relayed({"sku": "before"})
    use_keys(settings, OLD, NEW)  # step 1: the new key after the old one; workers accept both
    [step_1] = relayed({"sku": "step 1"})
    assert before["signature"].split(".")[1] == step_1["signature"].split(".")[1] == key(
        OLD).key_id  # the relay still signs with the old key, the first
    use_keys(settings, NEW, OLD)  # step 2: the new key first; the relay signs with it
    [step_2] = relayed({"sku": "step 2"})
    assert step_2["signature"].split(".")[1] == key(NEW).key_id
    for envelope in (before, step_1, step_2):  # in flight across the switch: all accepted
        assert receive(envelope, record, receiver=RECEIVER)[0]
    use_keys(settings, OLD, NEW)  # a worker still at step 1 accepts the new signatures
    assert receive({**step_2}, record, receiver="signing.step-1-worker")[0]
    assert len(effects()) == 3


def test_a_message_signed_with_a_key_dropped_from_the_list_is_refused(settings):
    use_keys(settings, OLD)
    [by_old] = relayed({"sku": "old"})
    use_keys(settings, NEW)  # step 3: the old key is gone
    with pytest.raises(BadSignature, match=f"key {key(OLD).key_id}, which is not in"):
        receive(by_old, record, receiver=RECEIVER)
    assert nothing_written()


def test_a_message_refused_for_its_key_is_sent_again_by_a_rewind_once_the_keys_agree(settings):
    use_keys(settings, GONE)  # a relay deployed with a key its workers do not hold
    [refused] = relayed({"sku": "tea"})
    use_keys(settings, NEW)
    with pytest.raises(BadSignature):
        receive(refused, record, receiver=RECEIVER)
    rewind(uuid.UUID(refused["message_id"]), name="test")  # relay_outbox --rewind-to
    [again] = [m.envelope() for m in relay_pending()]
    assert again["message_id"] == refused["message_id"]
    assert receive(again, record, receiver=RECEIVER)[0]
    assert effects() == {refused["message_id"]: 1}


# -- in a worker: refused once, not retried, not parked --------------------------------


def test_a_worker_refuses_a_forged_message_for_good_even_at_its_last_attempt(settings, caplog):
    use_keys(settings, NEW)
    [genuine] = relayed({"sku": "tea"})
    forged = {**genuine, "tenant_id": B}
    task = recording_task()
    last = outbox_settings.RECEIVER_MAX_ATTEMPTS - 1
    for retries in (0, last):
        with caplog.at_level(logging.ERROR, logger="outbox"), pytest.raises(Reject) as refused:
            run_as_worker(task, forged, retries=retries)
        assert refused.value.requeue is False  # the broker drops it: no retry, no redelivery
    assert nothing_written()  # nor a dead letter under the tenant it names
    assert caplog.text.count(f"task {RECEIVER} refused message {genuine['message_id']}") == 2
    assert run_as_worker(task, genuine) == (True, "ran")


def test_the_receiver_decorator_called_directly_refuses_too(settings):
    use_keys(settings, NEW)
    [genuine] = relayed({"sku": "tea"})
    task = recording_task()
    with pytest.raises(BadSignature):
        task({**genuine, "payload": {"sku": "forged"}})
    assert nothing_written()
    assert task(genuine) == "ran"


def test_a_signed_message_that_fails_is_retried_parked_and_re_driven_as_before(settings):
    use_keys(settings, NEW)
    settings.OUTBOX = {**settings.OUTBOX, "RECEIVER_MAX_ATTEMPTS": 2}
    [envelope] = relayed({"sku": "tea"})
    task = recording_task("dio-signing-redrive", fail_first=2)
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_APP": task.app}
    with pytest.raises(Retry) as retried:
        run_as_worker(task, envelope, retries=0, body=task.run)
    assert retried.value.sig.args == (envelope,)  # the retry: the same envelope, signature too
    with pytest.raises(RuntimeError):
        run_as_worker(task, envelope, retries=1, body=task.run)  # the last attempt: parked
    assert count_rows("outbox_dead_letters") == 1
    # The dead letter carries no signature; a re-drive hands the receiver the
    # Message read from the table, which is not verified.
    assert redrive(f"celery:{RECEIVER}").handled == 1
    assert effects() == {envelope["message_id"]: 1}


# -- the relay's real output, through the Celery transport into Redis -------------------


class MessagesOnly(CeleryTransport):
    """The Celery transport fed ``Message`` objects: the envelopes built in Python."""

    reads_envelopes = False


def queued(name: str) -> list[dict[str, Any]]:
    """The Redis list's messages as kombu decodes them for a worker (oldest first)."""
    with redis.Redis.from_url(django_settings.CELERY_BROKER_URL) as client:
        items = list(reversed(client.lrange(name, 0, -1)))
    return [json.loads(item) for item in items]


def task_argument(message: dict[str, Any]) -> Any:
    """The envelope a worker hands the task: the first argument of the decoded body."""
    args, _, _ = kombu_loads(base64.b64decode(message["body"]), message["content-type"],
                             message["content-encoding"], accept=["application/json"])
    return args[0]


#: Numbers whose digits PostgreSQL keeps and Python does not ("1.10" is 1.1),
#: and text JSON escapes, so that the receiver's decoding is what is signed.
RAW_PAYLOAD = ('{"sku": "déjà vu ✓ \\u2028 \\"q\\"", "price": 1.10, "huge": 1e400, '
               '"tiny": 0.1e-6, "neg": -0.0, "list": [1, 2.50, null, true], '
               '"nested": {"b": 1, "a": 2}}')


@pytest.mark.parametrize("path", ["postgresql-envelopes", "python-envelopes"])
def test_the_relays_output_on_the_broker_carries_a_valid_signature(settings, queue, path):
    use_keys(settings, NEW, OLD)
    ids = [publish_as(A, "order.placed", {"sku": "tea"}, key="k:1", aggregate_type="order",
                      aggregate_id=7, headers={"trace": "t"}),
           publish_as(B, "order.placed", ["a", "list"])]
    with observer() as conn:
        conn.execute("INSERT INTO outbox_messages (tenant_id, message_id, topic, payload)"
                     " VALUES (%s, gen_random_uuid(), 'order.placed', %s::jsonb)",
                     [A, RAW_PAYLOAD])
    # What the relay hands a transport that takes Message objects, for comparison.
    expected = {m.message_id: m.envelope() for m in relay_pending(name="in-memory")}
    assert len(expected) == 3
    transport = MessagesOnly() if path == "python-envelopes" else CeleryTransport()
    assert transport.reads_envelopes is (path != "python-envelopes")
    relay = Relay(transport, name=f"signing-{path}")
    wait_for(lambda: relay.drain() >= 0 and relay.sent == 3, "relayed")
    relay.release()
    envelopes = [task_argument(m) for m in queued(queue)]
    assert [e["message_id"] for e in envelopes[:2]] == [str(i) for i in ids]
    for envelope in envelopes:
        verify(envelope)  # as the worker's receiver will
        assert envelope["signature"].split(".")[1] == key(NEW).key_id
        assert envelope == expected[uuid.UUID(envelope["message_id"])]
    assert envelopes[2]["payload"]["price"] == 1.1  # the digits the worker sees, signed
    # Nothing is encrypted: the payload reads in the clear on the broker. On the
    # envelopes read from PostgreSQL the text is its own, digits and all, the signature appended.
    bodies = [base64.b64decode(m["body"]).decode() for m in queued(queue)]
    assert '"sku": "tea"' in bodies[0] or '"sku":"tea"' in bodies[0]
    assert ('"price": 1.10' in bodies[2]) is (path == "postgresql-envelopes")


def test_a_payload_object_kombu_decodes_into_a_python_value_cannot_be_verified(settings, queue):
    # docs/outbox.md: kombu's JSON turns an object whose only keys are
    # "__type__" and "__value__" into a Python value (a Decimal here), which
    # the worker's check cannot encode as it was signed: such a message is
    # refused. Publish the value as something else (a string) to sign it.
    use_keys(settings, NEW)
    publish_as(A, "order.placed", {"sku": "tea", "price": {"__type__": "decimal",
                                                           "__value__": "1.10"}})
    relay = Relay(CeleryTransport(), name="signing-kombu-types")
    wait_for(lambda: relay.drain() >= 0 and relay.sent == 1, "relayed")
    relay.release()
    [envelope] = [task_argument(m) for m in queued(queue)]
    assert type(envelope["payload"]["price"]).__name__ == "Decimal"  # what the worker gets
    with pytest.raises(BadSignature):
        receive(envelope, record, receiver=RECEIVER)
    assert nothing_written()


def forge(item: dict[str, Any], **changes: Any) -> bytes:
    """A Redis item whose envelope is changed as a writer to the broker would change it."""
    args, kwargs, embed = json.loads(base64.b64decode(item["body"]))
    envelope = {k: v for k, v in {**args[0], **changes}.items() if v is not _DROP}
    body = json.dumps([[envelope], kwargs, embed]).encode()
    return json.dumps({**item, "body": base64.b64encode(body).decode()}).encode()


_DROP = object()


def test_a_real_worker_handles_what_the_relay_signed_and_refuses_what_a_broker_writer_forged(
    settings, queue, tmp_path
):
    from tests.outbox.support.fault_worker_app import TASK

    use_keys(settings, NEW)
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_TASK": TASK}
    genuine, other = publish_many(A, "order.placed", [{"sku": "genuine"}, {"sku": "other"}])
    wait_for(lambda: Relay().drain() >= 0 and queue_length(queue) == 2, "2 queued")
    with redis.Redis.from_url(django_settings.CELERY_BROKER_URL) as client:
        first, second = reversed(client.lrange(queue, 0, -1))  # oldest first
        assert client.lrem(queue, 1, second) == 1  # "other" is replaced by two forgeries:
        item = json.loads(second)
        client.lpush(queue, forge(item, tenant_id=B, payload={"sku": "forged"}),
                     forge(item, message_id=str(uuid.uuid4()), signature=_DROP))
    env = {**SUBPROCESS_SETTINGS, "DJANGO_SETTINGS_MODULE": FAULT_PROCESS_SETTINGS,
           "DIO_CELERY_QUEUE": queue, "DIO_SIGNING_KEYS": json.dumps([NEW])}
    worker = Worker(FAULT_WORKER_APP, queue, tmp_path / "worker.log", concurrency=1,
                    env=env)
    try:
        worker.wait_ready()
        wait_for(lambda: worker.output.count("refused message") == 2 and len(effects()) == 1,
                 "the genuine message handled, both forgeries refused")
        wait_for(lambda: queue_length(queue) == 0, "nothing left queued or put back")
        assert worker.stop() == 0
    finally:
        worker.kill()
    with observer() as conn:
        assert conn.execute("SELECT tenant_id, sku, note FROM testapp_order").fetchall() == [
            (A, "genuine", str(genuine))]
    assert count_rows("outbox_received") == 1 and count_rows("outbox_dead_letters") == 0
    log = worker.output
    assert f"task {TASK} refused message {other}: its signature does not match" in log
    assert "refused message" in log and "it carries no signature" in log
    assert "forged" not in log  # the payload is never logged


# -- the setting -----------------------------------------------------------------------


@pytest.mark.parametrize(("value", "says"), [
    ("one-long-secret-string-of-more-than-32-bytes", "must be a list of secrets"),
    (b"one-long-secret-bytes-of-more-than-32-bytes!", "must be a list of secrets"),
    ({"KEY": NEW}, "must be a list of secrets"),
    ([NEW, 42], '["SIGNING_KEYS"][1] must be a string or bytes'),
    ([None], '["SIGNING_KEYS"][0] must be a string or bytes'),
    ([""], '["SIGNING_KEYS"][0] must be at least 32 bytes long, not 0'),
    (["short-secret"], '["SIGNING_KEYS"][0] must be at least 32 bytes long, not 12'),
    ([NEW, OLD, NEW], '["SIGNING_KEYS"][2] repeats an earlier key'),
])
def test_a_bad_setting_is_a_check_error_that_names_it_and_shows_no_secret(settings, value, says):
    settings.OUTBOX = {**settings.OUTBOX, "SIGNING_KEYS": value}
    errors = [m for m in checks.run_checks() if m.id == "outbox.E090"]
    assert [m.msg for m in errors if 'OUTBOX["SIGNING_KEYS"]' in m.msg and says in m.msg], errors
    assert not any(NEW in m.msg or "short-secret" in m.msg for m in errors)
    with pytest.raises(ConfigurationError, match="SIGNING_KEYS"):
        outbox_settings.SIGNING_KEYS  # noqa: B018


def test_strings_and_bytes_of_32_bytes_or_more_are_keys_and_empty_is_the_default(settings):
    assert outbox_settings.SIGNING_KEYS == ()
    use_keys(settings, NEW, GONE, "é" * 16)  # 32 bytes in UTF-8
    keys = outbox_settings.SIGNING_KEYS
    assert [k.secret for k in keys] == [NEW.encode(), GONE, ("é" * 16).encode()]
    assert len({k.key_id for k in keys}) == 3
    assert NEW not in repr(keys)
    assert [m for m in checks.run_checks() if m.id == "outbox.E090"] == []
