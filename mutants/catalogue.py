"""The catalogue: one entry per edit that breaks a documented claim.

Each mutant names the module whose guarantee it breaks, the claim (as the
docs state it), the exact snippet it replaces (it must occur once in the
file, or ``make mutants`` refuses to run) and the tests that should notice.
``equivalent`` marks a mutant judged not to change any documented behaviour,
with the reason; it is reported, never counted as a survivor.

Add a mutant whenever a claim is added to the docs; keep the tests named here
targeted (each run costs the test database's setup, about ten seconds).
"""

# ruff: noqa: E501
# (snippets are copied from the code exactly, long lines included)

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Edit:
    file: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    id: str
    module: str
    claim: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]
    equivalent: str = ""
    notes: dict[str, str] = field(default_factory=dict)


def mutant(id: str, module: str, claim: str, file: str, old: str, new: str,
           tests: tuple[str, ...], *, more: tuple[Edit, ...] = (), equivalent: str = "") -> Mutant:
    return Mutant(id, module, claim, (Edit(file, old, new), *more), tests, equivalent)


IDEM = "tests/idempotency/"
OUTBOX = "tests/outbox/"
TENANCY = "tests/tenancy/"
I_CLAIMS = IDEM + "test_claims.py"
O_CLAIMS = OUTBOX + "test_claims.py"
T_CLAIMS = TENANCY + "test_claims.py"
O_PROCESSES = OUTBOX + "test_claims_processes.py"
O_OUTAGE = (O_PROCESSES + "::test_a_relay_whose_redis_goes_down_keeps_its_offset_and_sends"
            "_everything_when_it_is_back")
O_RELAY_SIGTERM = O_PROCESSES + "::test_sigterm_while_the_relay_sends_a_batch_lets_it_finish_and_advance"
O_BEAT = O_PROCESSES + "::test_every_task_of_the_documented_beat_schedule_runs_in_a_real_worker"
O_RABBITMQ = OUTBOX + "test_rabbitmq.py"
O_TASKS = OUTBOX + "test_django_tasks.py"

CATALOGUE: list[Mutant] = [
    # --- idempotency: settings defaults --------------------------------------------------
    mutant(
        "conf.in-progress-wait-default", "idempotency.conf",
        "IN_PROGRESS_WAIT defaults to 0: a duplicate in flight is a 409 at once",
        "idempotency/conf.py",
        "IN_PROGRESS_WAIT = Setting(0.0, seconds())",
        "IN_PROGRESS_WAIT = Setting(5.0, seconds())",
        (I_CLAIMS, IDEM + "test_core.py", IDEM + "test_concurrency.py"),
    ),
    mutant(
        "conf.unstored-default-reduced", "idempotency.conf",
        "UNSTORED_STATUS_CODES defaults to 401/403/404/408/409/425/429",
        "idempotency/conf.py",
        "frozenset({401, 403, 404, 408, 409, 425, 429})",
        "frozenset({403, 404, 409, 429})",
        (I_CLAIMS, IDEM + "test_contract.py"),
    ),
    # --- idempotency: the state machine (core.py) -----------------------------------------
    mutant(
        "core.500-stored", "idempotency.core",
        "a 5xx answer is never stored; a retry runs again",
        "idempotency/core.py",
        "if status_code >= 500 or status_code in codes:",
        "if status_code > 500 or status_code in codes:",
        (I_CLAIMS, IDEM + "test_contract.py", IDEM + "test_core.py"),
    ),
    mutant(
        "core.final-4xx-completed", "idempotency.core",
        "a final 4xx is stored as failed, its writes rolled back",
        "idempotency/core.py",
        "    if status_code >= 400:\n        return Verdict.FAILED",
        "    if status_code >= 499:\n        return Verdict.FAILED",
        (I_CLAIMS, IDEM + "test_contract.py", IDEM + "test_core.py"),
    ),
    mutant(
        "core.failed-writes-kept", "idempotency.core",
        "a final 4xx's writes are rolled back; only its answer is kept",
        "idempotency/core.py",
        "                if verdict is not Verdict.COMPLETED:\n                    raise _Undo",
        "                if verdict is Verdict.UNSTORED:\n                    raise _Undo",
        (IDEM + "test_contract.py", IDEM + "test_core.py"),
    ),
    mutant(
        "core.mismatch-replayed", "idempotency.core",
        "same key, different fingerprint: 422, the stored result never overwritten",
        "idempotency/core.py",
        "    if row.fingerprint != request.fingerprint:\n        return Result(Outcome.MISMATCH)",
        "    if False:\n        return Result(Outcome.MISMATCH)",
        (IDEM + "test_contract.py",),
    ),
    mutant(
        "core.pending-replayed", "idempotency.core",
        "a pending key (phases mode) answers in progress, never a replay",
        "idempotency/core.py",
        '    if row.state == "pending":\n        return Result(Outcome.IN_PROGRESS)',
        '    if row.state == "pending" and False:\n        return Result(Outcome.IN_PROGRESS)',
        (IDEM + "test_core.py::test_a_pending_key_answers_in_progress_never_a_replay", IDEM + "test_phases.py"),
    ),
    mutant(
        "core.lost-race-ignored", "idempotency.core",
        "the primary key is the final arbiter: a lost race rolls back and answers from the row",
        "idempotency/core.py",
        "        if not stored:\n            # Another transaction",
        "        if False:\n            # Another transaction",
        (IDEM + "test_concurrency.py", IDEM + "test_core.py", IDEM + "test_store.py"),
    ),
    mutant(
        "core.in-progress-not-detected", "idempotency.core",
        "same key while the first is running: 409 with Retry-After at once",
        "idempotency/core.py",
        "                if not found.locked:\n                    return Result(Outcome.IN_PROGRESS)",
        "                if found.locked is None:\n                    return Result(Outcome.IN_PROGRESS)",
        (I_CLAIMS, IDEM + "test_concurrency.py", IDEM + "test_core.py"),
    ),
    mutant(
        "core.wait-zero-retries", "idempotency.core",
        "wait 0 looks the key up once and answers",
        "idempotency/core.py",
        "if not in_progress or time.monotonic() >= deadline:",
        "if not in_progress or time.monotonic() >= deadline + 0.5:",
        (I_CLAIMS, IDEM + "test_core.py"),
    ),
    mutant(
        "core.key-list-joined", "idempotency.core",
        "a repeated header or a list of keys is a 400, never a joined key",
        "idempotency/core.py",
        '        if "," in key:\n            raise InvalidKey(_MANY_VALUES)',
        '        if "," in key and False:\n            raise InvalidKey(_MANY_VALUES)',
        (IDEM + "test_core.py", IDEM + "test_contract.py", IDEM + "test_bad_input.py"),
    ),
    mutant(
        "core.key-length", "idempotency.core",
        "a key over MAX_KEY_LENGTH (255) characters is a 400",
        "idempotency/core.py",
        "    if len(key) > limit:",
        "    if len(key) > limit + 1:",
        (IDEM + "test_contract.py", IDEM + "test_core.py"),
    ),
    # --- idempotency: the store --------------------------------------------------------------
    mutant(
        "store.expires-by-app-clock", "idempotency.store",
        "every time comparison uses the database clock: expires_at is now() + TTL",
        "idempotency/store.py",
        '_FINISHED = {**_REQUEST, **_ANSWER, "created_at": "now()"}',
        '_FINISHED = {**_REQUEST, **_ANSWER, "expires_at": "%(app_now)s::timestamptz + %(ttl)s",'
        ' "created_at": "now()"}',
        (I_CLAIMS, IDEM + "test_contract.py", IDEM + "test_core.py"),
        more=(Edit("idempotency/store.py",
                   '        "ttl": ttl,\n    }',
                   '        "ttl": ttl,\n        "app_now": __import__("django.utils.timezone")'
                   '.utils.timezone.now(),\n    }'),),
    ),
    mutant(
        "store.expired-still-live", "idempotency.store",
        "a key past expires_at (not yet reaped) is treated as new",
        "idempotency/store.py",
        "_LIVE = f\"(k.expires_at > now() OR k.state = '{PENDING}')\"",
        "_LIVE = f\"(k.expires_at > now() - interval '1 hour' OR k.state = '{PENDING}')\"",
        (IDEM + "test_contract.py",),
    ),
    mutant(
        "store.finish-without-fence", "idempotency.store",
        "phases: a fencing token stops a stale owner from finishing over a newer one",
        "idempotency/store.py",
        "UPDATE idempotency_keys SET ({_names(_PHASES_FINISHED)}) = ROW({_exprs(_PHASES_FINISHED)})\n"
        " WHERE {_KEY} AND state = '{PENDING}' AND lease_token = %(token)s",
        "UPDATE idempotency_keys SET ({_names(_PHASES_FINISHED)}) = ROW({_exprs(_PHASES_FINISHED)})\n"
        " WHERE {_KEY} AND state = '{PENDING}' AND (lease_token = %(token)s OR TRUE)",
        (I_CLAIMS + "::test_a_stale_owner_cannot_finish_over_the_new_owner",
         IDEM + "test_phases.py", IDEM + "test_store.py"),
    ),
    mutant(
        "store.advance-without-fence", "idempotency.store",
        "phases: each phase commits with a compare-and-set on the fencing token",
        "idempotency/store.py",
        "       locked_until = clock_timestamp() + %(lease)s, updated_at = now()\n"
        " WHERE {_KEY} AND state = '{PENDING}' AND lease_token = %(token)s",
        "       locked_until = clock_timestamp() + %(lease)s, updated_at = now()\n"
        " WHERE {_KEY} AND state = '{PENDING}' AND (lease_token = %(token)s OR TRUE)",
        (I_CLAIMS, IDEM + "test_phases.py", IDEM + "test_store.py"),
    ),
    mutant(
        "store.take-over-live-lease", "idempotency.store",
        "phases: a retry takes a pending key over only once its lease has run out",
        "idempotency/store.py",
        "   AND (locked_until IS NULL OR locked_until <= clock_timestamp())\n{_CLAIM_RETURNING}",
        "   AND TRUE\n{_CLAIM_RETURNING}",
        (I_CLAIMS, IDEM + "test_phases.py", IDEM + "test_store.py"),
    ),
    # --- idempotency: one request through the contract (flow.py, mixins.py) ----------------
    mutant(
        "flow.safe-bypass-deleted", "idempotency.flow",
        "safe methods (GET, HEAD, OPTIONS) need no key and run as the tenant",
        "idempotency/flow.py",
        "    if request.method in SAFE_METHODS:\n        tenant_id = get_tenant()",
        "    if False:\n        tenant_id = get_tenant()",
        (I_CLAIMS, IDEM + "test_contract.py", IDEM + "test_decorator.py"),
    ),
    mutant(
        "mixins.safe-bypass-deleted", "idempotency.flow",
        "safe methods need no key; opted-out safe methods run without a tenant",
        "idempotency/mixins.py",
        "        if request.method in flow.SAFE_METHODS:\n            return super()._run_as_tenant",
        "        if False:\n            return super()._run_as_tenant",
        (I_CLAIMS, IDEM + "test_contract.py", TENANCY + "test_views.py"),
        equivalent="a tenant-scoped safe method then goes through flow.respond's own safe-method "
        "path, which runs it as the tenant and renders it there too (only an APIException "
        "after a write in a GET would commit instead of rolling back: nothing documented)",
    ),
    mutant(
        "flow.optional-key-outside-tenant", "idempotency.flow",
        "a view with an optional key runs as the tenant without one",
        "idempotency/flow.py",
        "        with tenant_context(tenant_id, using=app_alias()):\n            return view()",
        "        if True:\n            return view()",
        (IDEM + "test_contract.py",),
    ),
    # --- idempotency: phases -------------------------------------------------------------
    mutant(
        "phases.lease-lost-ignored", "idempotency.phases",
        "a stale owner whose phase commit fails the fencing token stops (LeaseLost)",
        "idempotency/phases.py",
        "                    raise LeaseLost\n                ctx.recovery_point = outcome.name",
        "                    pass\n                ctx.recovery_point = outcome.name",
        (I_CLAIMS + "::test_a_stale_owner_whose_phase_commit_fails_the_token_stops_and_its_writes_roll_back",
         IDEM + "test_phases.py"),
    ),
    # --- outbox: consumers ------------------------------------------------------------------
    mutant(
        "consumer.offset-on-commit", "outbox.consumers",
        "a consumer batch's handler writes and its offset advance commit in one transaction",
        "outbox/consumers.py",
        "            store.advance_offset(worker, consumer.name, partition, position)\n"
        "            return BatchResult(handled=done, full=len(messages) == limit)",
        "            transaction.on_commit(lambda: store.advance_offset(\n"
        "                worker, consumer.name, partition, position), using=worker)\n"
        "            return BatchResult(handled=done, full=len(messages) == limit)",
        (O_CLAIMS, OUTBOX + "test_consumers.py", OUTBOX + "test_ordering.py"),
    ),
    mutant(
        "consumer.attempts-reset", "outbox.consumers",
        "a failing message is retried, then parked after MAX_ATTEMPTS",
        "outbox/consumers.py",
        "attempts = (offset.attempts if done == 0 else 0) + 1",
        "attempts = 1",
        (OUTBOX + "test_consumers.py",),
    ),
    mutant(
        "consumer.park-late", "outbox.consumers",
        "a failing message is parked after MAX_ATTEMPTS attempts (not one more)",
        "outbox/consumers.py",
        "        if attempts >= max_attempts:",
        "        if attempts > max_attempts:",
        (OUTBOX + "test_consumers.py",),
    ),
    mutant(
        "consumer.failure-skips-message", "outbox.consumers",
        "no offset advanced past an unhandled message",
        "outbox/consumers.py",
        "        store.advance_offset(worker, consumer.name, partition, position, head_failure)",
        "        store.advance_offset(worker, consumer.name, partition, message.position,\n"
        "                             head_failure)",
        (OUTBOX + "test_consumers.py",),
    ),
    mutant(
        "consumer.wrong-tenant", "outbox.consumers",
        "handle runs under the message's tenant context",
        "outbox/consumers.py",
        "                with tenant_context(tenant_id, using=alias):\n"
        "                    for message in group:",
        "                with tenant_context(messages[0].tenant_id, using=alias):\n"
        "                    for message in group:",
        (OUTBOX + "test_consumers.py",),
    ),
    mutant(
        "consumer.full-batch-jumps-fence", "outbox.consumers",
        "a reader moves past the fence only when its batch was not full",
        "outbox/consumers.py",
        "            if len(messages) < limit and batch.passed > position:",
        "            if batch.passed > position:",
        (O_CLAIMS, OUTBOX + "test_consumers.py", OUTBOX + "test_ordering.py",
         OUTBOX + "test_fence.py"),
    ),
    mutant(
        "consumer.idle-never-advances", "outbox.consumers",
        "a consumer of a rare topic still moves past what it does not read (retention)",
        "outbox/consumers.py",
        "            if offset.stale and batch.passed > offset.position:",
        "            if False:",
        (OUTBOX + "test_consumers.py", OUTBOX + "test_retention.py", OUTBOX + "test_fence.py"),
    ),
    mutant(
        "consumer.read-as-app-role", "outbox.consumers",
        "the stream is read on the system alias (every tenant's messages)",
        "outbox/consumers.py",
        "        batch = store.read_batch(\n            system,",
        "        batch = store.read_batch(\n            app,",
        (OUTBOX + "test_consumers.py",),
    ),
    mutant(
        "consumer.lock-blocks", "outbox.consumers",
        "workers share partitions without a leader: a held partition is skipped",
        "outbox/store.py",
        "   FOR UPDATE SKIP LOCKED\n",
        "   FOR UPDATE\n",
        (OUTBOX + "test_consumers.py", OUTBOX + "test_failover.py"),
    ),
    # --- outbox: the stream reader -----------------------------------------------------------
    mutant(
        "reader.passed-at-fence", "outbox.stream",
        "nothing below the fence can still appear; the fence itself may",
        "outbox/stream.py",
        "        return self.fence - 1",
        "        return self.fence",
        (OUTBOX + "test_fence.py", OUTBOX + "test_consumers.py", OUTBOX + "test_ordering.py"),
    ),
    mutant(
        "reader.envelope-id-text", "outbox.stream",
        "the envelope carries the message id receivers de-duplicate by",
        "outbox/stream.py",
        '        data["message_id"] = str(self.message_id)',
        '        data["message_id"] = str(uuid.uuid4())',
        (OUTBOX + "test_receivers.py", OUTBOX + "test_relay.py", OUTBOX + "test_schema.py"),
    ),
    # --- outbox: the relay ---------------------------------------------------------------------
    mutant(
        "relay.xid-across-send", "outbox.relay",
        "no relay holds a database transaction open across broker I/O",
        "outbox/relay.py",
        "        try:\n            with _relay_spans(self.name, batch.messages):\n",
        "        _held = __import__('django.db').db.transaction.atomic(using=self.alias)\n"
        "        _held.__enter__()\n"
        "        with connections[self.alias].cursor() as _c:\n"
        "            _c.execute('SELECT 1 FROM consumer_offsets WHERE name = %s FOR UPDATE',"
        " [self.offset_name])\n"
        "        try:\n            with _relay_spans(self.name, batch.messages):\n",
        (O_CLAIMS, OUTBOX + "test_relay.py"),
        more=(Edit("outbox/relay.py",
                   "        if self._broker_failures:\n            logger.info(",
                   "        _held.__exit__(None, None, None)\n"
                   "        if self._broker_failures:\n            logger.info("),),
    ),
    mutant(
        "relay.locked-row-across-send", "outbox.relay",
        "no relay holds a database transaction open across broker I/O (the issue's edit: "
        "a SELECT ... FOR UPDATE held while sending)",
        "outbox/relay.py",
        "        try:\n"
        "            with _relay_spans(self.name, batch.messages):\n"
        "                if self.transport.reads_envelopes:\n"
        "                    self.transport.send_envelopes(batch.messages)  # type: ignore[arg-type]\n"
        "                else:\n"
        "                    self.transport.send(batch.messages)  # type: ignore[arg-type]\n",
        "        try:\n"
        "            with __import__('django.db').db.transaction.atomic(using=self.alias):\n"
        "                connections[self.alias].cursor().execute(\n"
        "                    'SELECT 1 FROM consumer_offsets WHERE name = %s FOR UPDATE',\n"
        "                    [self.offset_name])\n"
        "                if self.transport.reads_envelopes:\n"
        "                    self.transport.send_envelopes(batch.messages)\n"
        "                else:\n"
        "                    self.transport.send(batch.messages)\n",
        (O_CLAIMS, OUTBOX + "test_relay.py"),
    ),
    mutant(
        "relay.failed-send-advances", "outbox.relay",
        "if the broker fails, the offset stays put and the batch is sent again",
        "outbox/relay.py",
        "            self._position = None  # re-read the offset and renew the lease next time",
        "            store.advance_leased(self.alias, self.offset_name, self.owner, position,\n"
        "                                 batch.messages[-1].id)\n"
        "            self._position = None",
        (OUTBOX + "test_relay.py", O_OUTAGE),
    ),
    mutant(
        "relay.advance-without-cas", "outbox.relay",
        "a relay that lost its lease cannot move the offset (compare-and-set)",
        "outbox/store.py",
        " WHERE name = %s AND partition = 0 AND last_id = %s AND lease_owner = %s",
        " WHERE name = %s AND partition = 0 AND (last_id = %s OR TRUE) AND (lease_owner = %s OR TRUE)",
        (OUTBOX + "test_rewind.py", OUTBOX + "test_failover.py", OUTBOX + "test_relay.py"),
    ),
    mutant(
        "relay.lease-ignored", "outbox.relay",
        "one relay works at a time: a running lease keeps the others waiting",
        "outbox/store.py",
        "   AND (lease_owner = %s OR lease_until IS NULL OR lease_until < now())",
        "   AND (lease_owner = %s OR TRUE)",
        (OUTBOX + "test_failover.py", OUTBOX + "test_relay.py"),
    ),
    mutant(
        "relay.heartbeat-too-slow", "outbox.relay",
        "the lease is renewed every quarter of its length, whatever the batch in flight does",
        "outbox/relay.py",
        "            while not self._done.wait(self._lease / 4):",
        "            while not self._done.wait(self._lease * 4):",
        (OUTBOX + "test_failover.py", OUTBOX + "test_relay.py"),
    ),
    mutant(
        "relay.sends-after-losing-lease", "outbox.relay",
        "a relay that lost its lease while reading does not send",
        "outbox/relay.py",
        "        if self._heartbeat is None or self._heartbeat.lost.is_set():\n"
        "            self._position = None  # another relay took over while this one read\n"
        "            return False",
        "        if self._heartbeat is None:\n"
        "            self._position = None  # another relay took over while this one read\n"
        "            return False",
        (OUTBOX + "test_failover.py", OUTBOX + "test_relay.py", OUTBOX + "test_rewind.py"),
        equivalent="the relay then sends one batch that another relay also sends: a duplicate, "
        "which at-least-once delivery allows and receivers drop; its compare-and-set still "
        "keeps it from moving the offset",
    ),
    # --- outbox: receivers ----------------------------------------------------------------------
    mutant(
        "receivers.no-dedup", "outbox.receivers",
        "each receiver handles each message once (duplicates skipped by message id)",
        "outbox/receivers.py",
        "        if not store.record_received(alias, message.tenant_id, receiver, message.message_id):",
        "        if not store.record_received(alias, message.tenant_id, receiver, message.message_id)"
        " and False:",
        (OUTBOX + "test_receivers.py", O_CLAIMS),
    ),
    mutant(
        "receivers.check-then-insert", "outbox.receivers",
        "concurrent duplicates of one message: one receiver runs, the other skips",
        "outbox/store.py",
        "        cursor.execute(_RECORD_RECEIVED, [tenant_id, receiver, message_id])\n"
        "        return int(cursor.rowcount) == 1",
        "        cursor.execute('SELECT 1 FROM outbox_received WHERE tenant_id = %s AND '\n"
        "                       'receiver = %s AND message_id = %s', [tenant_id, receiver, message_id])\n"
        "        seen = cursor.fetchone() is not None\n"
        "        cursor.execute(_RECORD_RECEIVED, [tenant_id, receiver, message_id])\n"
        "        return not seen",
        (O_CLAIMS, OUTBOX + "test_receivers.py"),
    ),
    mutant(
        "receivers.signature-unchecked", "outbox.signing",
        "with SIGNING_KEYS set, a receiver refuses an envelope the relay did not sign or that was "
        "altered, before the handler runs and before anything is written",
        "outbox/signing.py",
        "    if not keys:\n        return\n",
        "    if not keys or True:\n        return\n",
        (OUTBOX + "test_signing.py",),
    ),
    # --- outbox: RabbitMQ (publisher confirms) -----------------------------------------------
    mutant(
        "rabbitmq.confirms-not-awaited", "outbox.transports",
        "on RabbitMQ the relay advances only past a batch RabbitMQ confirmed whole; a nack "
        "keeps the offset and the batch is sent again",
        "outbox/transports.py",
        '            outcome.wait(self._connection.connection, float(options.get("confirm_timeout", 30)))',
        "            pass",
        (O_RABBITMQ,),
    ),
    mutant(
        "rabbitmq.unconfirmed-connection-used", "outbox.transports",
        "the transport refuses to publish to a RabbitMQ without confirm_publish",
        "outbox/transports.py",
        "            if not connection.connection.confirm_publish:\n                raise ConfigurationError(_NO_CONFIRMS)",
        "            if False:\n                raise ConfigurationError(_NO_CONFIRMS)",
        (O_RABBITMQ,),
    ),
    mutant(
        "rabbitmq.transient-queue-used", "outbox.celery",
        "a queue a RabbitMQ restart loses is a check error (outbox.E111) and the transport "
        "refuses it",
        "outbox/celery.py",
        "    if not queue.durable:\n",
        "    if False:\n",
        (O_RABBITMQ,),
    ),
    mutant(
        "rabbitmq.E110-missing", "outbox.celery",
        "RabbitMQ without publisher confirms is a check error (outbox.E110); relay_outbox "
        "does not start",
        "outbox/celery.py",
        '    if not options.get("confirm_publish"):',
        "    if False:",
        (O_RABBITMQ,),
    ),
    # --- outbox: Django's Tasks framework -------------------------------------------------------
    mutant(
        "tasks.receiver-record-skipped", "outbox.django_tasks",
        "a receiver task handles each message once (its record in outbox_received drops "
        "duplicates), as the message's tenant",
        "outbox/django_tasks.py",
        "        handled, _ = receive(message, lambda m: (hold(), func(m))[1], receiver=name, using=using)",
        "        handled, _ = True, func(message)",
        (O_TASKS,),
    ),
    mutant(
        "tasks.batch-not-atomic", "outbox.django_tasks",
        "on django-tasks-db a batch is enqueued in one transaction: whole or not at all",
        "outbox/django_tasks.py",
        "        with transaction.atomic(using=database):\n            for message, task in zip(messages, tasks, strict=True):",
        "        if database:\n            for message, task in zip(messages, tasks, strict=True):",
        (O_TASKS,),
    ),
    mutant(
        "tasks.requeue-takes-live-tasks", "outbox.django_tasks",
        "requeue_outbox_tasks never takes a task a live receiver holds",
        "outbox/django_tasks.py",
        "            rows.select_for_update(skip_locked=True)\n",
        "            rows\n",
        (O_TASKS,),
    ),
    mutant(
        "tasks.no-retry", "outbox.django_tasks",
        "a failing receiver task is retried (a new task per attempt), then parked",
        "outbox/django_tasks.py",
        "        _enqueue_again(task, envelope, attempt + 1, pause)\n",
        "        pass\n",
        (O_TASKS,),
    ),
    mutant(
        "tasks.signature-unchecked", "outbox.django_tasks",
        "with SIGNING_KEYS set, a receiver task refuses an envelope that does not verify",
        "outbox/django_tasks.py",
        "        signing.check(envelope, by=by)\n",
        "        pass\n",
        (O_TASKS,),
    ),
    # --- outbox: loops ---------------------------------------------------------------------------
    mutant(
        "loops.sigterm-mid-batch", "outbox.consumers",
        "SIGTERM stops a loop after the current batch (committed, nothing lost)",
        "outbox/loops.py",
        "                    signal.Signals(signum).name)\n        stop.set()",
        "                    signal.Signals(signum).name)\n        raise SystemExit(0)",
        (O_CLAIMS, O_RELAY_SIGTERM),
    ),
    mutant(
        "commands.relay-once-sends-nothing", "outbox.commands",
        "relay_outbox --once relays what is ready and says how many messages it sent",
        "outbox/management/commands/relay_outbox.py",
        "                    sent = relay.drain()",
        "                    sent = 0",
        (OUTBOX + "test_relay.py", O_CLAIMS),
    ),
    # --- the documented beat schedule ------------------------------------------------------------
    mutant(
        "tasks.outbox-reap-renamed", "outbox.tasks",
        "the beat schedule's task outbox.reap exists in a worker that imports outbox.tasks",
        "outbox/tasks.py",
        '@shared_task(name="outbox.reap", ignore_result=True)',
        '@shared_task(name="outbox.reap_outbox", ignore_result=True)',
        (OUTBOX + "test_tasks.py", O_BEAT),
    ),
    mutant(
        "tasks.key-reaper-renamed", "outbox.tasks",
        "the beat schedule's task idempotency.tasks.reap_expired_keys exists",
        "idempotency/tasks.py",
        '@shared_task(name="idempotency.tasks.reap_expired_keys")',
        '@shared_task(name="idempotency.tasks.reap_keys")',
        (IDEM + "test_reaper.py", O_BEAT),
    ),
    mutant(
        "tasks.reap-reports-nothing", "outbox.tasks",
        "the reap task returns how many messages and receiver records it deleted",
        "outbox/tasks.py",
        '    return {"messages": result.messages, "received": result.received}',
        '    return {"messages": 0, "received": 0}',
        (OUTBOX + "test_tasks.py", O_CLAIMS),
    ),
    # --- tenancy ---------------------------------------------------------------------------------
    mutant(
        "context.outer-not-restored", "tenancy.context",
        "contexts nest: leaving an inner one restores the outer tenant",
        "tenancy/context.py",
        "        if switch and not outermost and not connection.needs_rollback:",
        "        if False:",
        (TENANCY + "test_context.py",),
    ),
    mutant(
        "context.session-level-set", "tenancy.context",
        "the tenant is set transaction-locally, never for the session",
        "tenancy/context.py",
        "    return f\"SET LOCAL {GUC} = '{value}'\"",
        "    return f\"SET {GUC} = '{value}'\"",
        (TENANCY + "test_context.py", TENANCY + "test_isolation.py"),
    ),
    mutant(
        "context.bigint-range-unchecked", "tenancy.context",
        "a tenant id outside PostgreSQL's bigint range is refused (ValueError)",
        "tenancy/context.py",
        "    if not _BIGINT_MIN <= tenant_id <= _BIGINT_MAX:",
        "    if False:",
        (TENANCY + "test_context.py",),
    ),
    mutant(
        "db.cross-tenant-guard-open", "tenancy.db",
        "cross-tenant jobs refuse an alias that row-level security confines",
        "tenancy/db.py",
        "    confined = [table for table in tables if facts[table].rls_active]",
        "    confined = []",
        (TENANCY + "test_routing.py", OUTBOX + "test_relay.py", IDEM + "test_reaper.py"),
    ),
    mutant(
        "checks.E011-missing", "tenancy.checks",
        "manage.py check refuses a superuser as the app alias (tenancy.E011)",
        "tenancy/checks.py",
        "    role = role_facts(alias)\n    if role.superuser:\n        yield checks.Error(\n"
        '            f"Database {alias!r} connects as {role.name!r}, a superuser: row-level',
        "    role = role_facts(alias)\n    if False:\n        yield checks.Error(\n"
        '            f"Database {alias!r} connects as {role.name!r}, a superuser: row-level',
        (T_CLAIMS, TENANCY + "test_roles.py"),
    ),
    mutant(
        "checks.E015-missing", "tenancy.checks",
        "manage.py check refuses a superuser as the system alias (tenancy.E015)",
        "tenancy/checks.py",
        "    role = role_facts(alias)\n    if role.superuser:\n        yield checks.Error(\n"
        '            f"Database {alias!r} connects as {role.name!r}, a superuser. The system',
        "    role = role_facts(alias)\n    if False:\n        yield checks.Error(\n"
        '            f"Database {alias!r} connects as {role.name!r}, a superuser. The system',
        (T_CLAIMS, TENANCY + "test_roles.py"),
    ),
    mutant(
        "checks.E010-crashes", "tenancy.checks",
        "a database that cannot be inspected is an error of the check (tenancy.E010), not a crash",
        "tenancy/checks.py",
        "        except DatabaseError as exc:\n            found = [",
        "        except KeyError as exc:\n            found = [",
        (T_CLAIMS, TENANCY + "test_roles.py"),
    ),
    mutant(
        "checks.E012-missing", "tenancy.checks",
        "manage.py check refuses an app alias with BYPASSRLS (tenancy.E012)",
        "tenancy/checks.py",
        "    if role.bypassrls:\n        yield checks.Error(",
        "    if False:\n        yield checks.Error(",
        (T_CLAIMS, TENANCY + "test_roles.py"),
    ),
]
