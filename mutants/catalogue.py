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
        "        if not found.locked:\n            return Result(Outcome.IN_PROGRESS)",
        "        if found.locked is None:\n            return Result(Outcome.IN_PROGRESS)",
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
        "    if request.method in SAFE_METHODS:\n        tenant_id = view.tenant()",
        "    if False:\n        tenant_id = view.tenant()",
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
        "        with tenant_context(tenant_id, using=app_alias()):\n            return view.run()",
        "        if True:\n            return view.run()",
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
        "            return BatchResult(handled=done, full=not batch.complete)",
        "            transaction.on_commit(lambda: store.advance_offset(\n"
        "                worker, consumer.name, partition, position), using=worker)\n"
        "            return BatchResult(handled=done, full=not batch.complete)",
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
        "        store.advance_offset(worker, consumer.name, partition,\n"
        "                             batch.position_after(offset.position, done + 1), head_failure)",
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
        "consumer.full-batch-jumps-fence", "outbox.stream",
        "a reader moves past what it read only when its batch was not full",
        "outbox/stream.py",
        "        if count == len(self.messages) and self.complete:",
        "        if count == len(self.messages):",
        (O_CLAIMS, OUTBOX + "test_consumers.py", OUTBOX + "test_ordering.py",
         OUTBOX + "test_fence.py"),
    ),
    mutant(
        "consumer.idle-never-advances", "outbox.consumers",
        "a consumer of a rare topic still moves past what it does not read (retention)",
        "outbox/consumers.py",
        "            if offset.stale and moved != offset.position:",
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
    mutant(
        "store.lease-unpinned", "outbox.store",
        "a search_path a worker-role borrower leaves in a pooled session stops no relay",
        "outbox/store.py",
        "        execute_pinned(cursor, using, RELAY_LEASE.claim, lease)\n"
        "        row = cursor.fetchone()\n        if row is None:",
        "        cursor.execute(RELAY_LEASE.claim, lease)\n"
        "        row = cursor.fetchone()\n        if row is None:",
        ("tests/test_session_state.py",),
    ),
    # --- outbox: the fence per tenant (SQL; the harness migrates the scratch copy) -----------
    mutant(
        "fence.open-publisher-passed", "outbox.fence",
        "no committed message is skipped: a tenant with a publisher in flight is read only up to its bound",
        "outbox/sql/0008_tenant_fence.sql",
        "                  WHERE m.id > after AND m.id <= last_handed_out\n"
        "                    AND (NOT anyone_waiting\n",
        "                  WHERE m.id > after AND m.id <= last_handed_out\n"
        "                    AND (TRUE\n",
        (OUTBOX + "test_ordering.py", OUTBOX + "test_fence.py"),
    ),
    mutant(
        "fence.held-tenant-never-caught-up", "outbox.fence",
        "a held tenant's messages are read once its publisher has ended",
        "outbox/sql/0008_tenant_fence.sql",
        "                           AND m.id > h.upto::bigint AND m.id <= caught_up_to",
        "                           AND m.id > h.upto::bigint AND m.id <= h.upto::bigint",
        (OUTBOX + "test_fence.py",),
    ),
    mutant(
        "fence.session-locks-trusted", "outbox.fence",
        "a lock a session keeps after its transaction holds nothing back",
        "outbox/sql/0008_tenant_fence.sql",
        "        SELECT DISTINCT w.virtualtransaction, w.pid FROM locks AS w\n"
        "         WHERE w.locktype = 'relation' AND w.relation = 'outbox_messages'::regclass",
        "        SELECT DISTINCT w.virtualtransaction, w.pid FROM locks AS w",
        (OUTBOX + "test_fence.py",),
    ),
    mutant(
        "fence.marks-block", "outbox.fence",
        "a key held exclusively by someone else blocks no publisher",
        "outbox/sql/0008_tenant_fence.sql",
        "    IF NOT pg_try_advisory_xact_lock_shared(NEW.tenant_id) THEN\n"
        "        LOCK TABLE outbox_publishing_any_tenant IN ROW EXCLUSIVE MODE;\n"
        "    END IF;",
        "    PERFORM pg_advisory_xact_lock_shared(NEW.tenant_id);",
        (OUTBOX + "test_fence.py",),
    ),
    mutant(
        "fence.any-tenant-ignored", "outbox.fence",
        "a publisher marked for any tenant holds every tenant back at its bound",
        "outbox/sql/0008_tenant_fence.sql",
        "    last_handed_out := least(last_handed_out, (waiting ->> '*')::bigint);",
        "",
        (OUTBOX + "test_fence.py",),
    ),
    mutant(
        "fence.forged-setting-trusted", "outbox.fence",
        "a forged transaction-local setting cannot let a reader pass an open publisher",
        "outbox/sql/0008_tenant_fence.sql",
        "    SELECT w.virtualtransaction, w.pid, t.tenant_id, coalesce(b.bound, 0)",
        "    SELECT w.virtualtransaction, w.pid, t.tenant_id, coalesce(b.bound, 281474976710655)",
        (OUTBOX + "test_fence.py",),
    ),
    mutant(
        "fence.explicit-id-allowed", "outbox.fence",
        "an insert that names its own id is refused",
        "outbox/sql/0008_tenant_fence.sql",
        "    IF NEW.id IS NOT NULL THEN\n        RAISE EXCEPTION",
        "    IF NEW.id IS NOT NULL THEN\n        RETURN NEW;\n        RAISE EXCEPTION",
        (OUTBOX + "test_fence.py",),
    ),
    mutant(
        "fence.tenant-from-setting", "outbox.fence",
        "a message's mark names the row's own tenant, whatever the session's setting says",
        "outbox/sql/0008_tenant_fence.sql",
        "    IF NOT pg_try_advisory_xact_lock_shared(NEW.tenant_id) THEN",
        "    IF NOT pg_try_advisory_xact_lock_shared(coalesce(nullif(current_setting("
        "'app.tenant_id', true), '')::bigint, 0)) THEN",
        (OUTBOX + "test_fence.py",),
    ),
    mutant(
        "retention.held-tenant-deleted", "outbox.retention",
        "retention never deletes a message a reader has not passed (a held tenant's included)",
        "outbox/retention.py",
        "    return min(r.position.floor for r in readers)",
        "    return min(r.position.last for r in readers)",
        (OUTBOX + "test_retention.py",),
    ),
    # --- outbox: the stream reader -----------------------------------------------------------
    mutant(
        "reader.held-tenant-passed", "outbox.stream",
        "a reader passes a tenant with a publisher in flight only up to that publisher's bound",
        "outbox/stream.py",
        "            upto = reach if bound is None else min(reach, bound)",
        "            upto = reach",
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
        " WHERE name = %s AND partition = 0 AND last_id = %s AND held = %s::jsonb AND lease_owner = %s",
        " WHERE name = %s AND partition = 0 AND (last_id = %s OR TRUE) AND (held = %s::jsonb OR TRUE)"
        " AND (lease_owner = %s OR TRUE)",
        (OUTBOX + "test_rewind.py", OUTBOX + "test_failover.py", OUTBOX + "test_relay.py"),
    ),
    mutant(
        "leases.running-lease-ignored", "django_idempotency_outbox.leases",
        "one relay (and one key reaper) works at a time: a running lease keeps the others waiting",
        "django_idempotency_outbox/leases.py",
        'f"   AND ({owner} = %(owner)s OR {until} IS NULL OR {until} < now())\\n"',
        'f"   AND ({owner} = %(owner)s OR TRUE)\\n"',
        (OUTBOX + "test_failover.py", OUTBOX + "test_relay.py", IDEM + "test_reaper.py"),
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
    # --- tenancy: pinned names (tests/tenancy/test_pinned_names.py) --------------------------
    mutant(
        "context.names-unpinned", "tenancy.context",
        "the tenant context pins its names: a temporary table of an earlier borrower captures nothing",
        "tenancy/context.py",
        '    pin = [search_path_sql(connection.alias)] if fresh else []',
        '    pin = []',
        (TENANCY + "test_pinned_names.py",),
    ),
    mutant(
        "context.pg-temp-not-last", "tenancy.context",
        "the pinned search_path names pg_temp last (unnamed, it is searched first)",
        "tenancy/context.py",
        "f\"SET LOCAL search_path = {', '.join(_quote(s) for s in schemas)}, pg_temp\"",
        "f\"SET LOCAL search_path = {', '.join(_quote(s) for s in schemas)}\"",
        (TENANCY + "test_pinned_names.py",),
    ),
    mutant(
        "context.pin-from-session", "tenancy.context",
        "the pinned search_path is derived from what the session started with, not what it was set to",
        "tenancy/context.py",
        '    b"SET LOCAL search_path TO DEFAULT; "\n',
        '    b""\n',
        (TENANCY + "test_pinned_names.py",),
    ),
    mutant(
        "store.peek-unpinned", "idempotency.store",
        "the replay's one-message read pins its names: a temporary idempotency_keys answers nothing",
        "idempotency/store.py",
        '            cursor.execute(f"{set_tenant_sql(request.tenant_id)}; {pin}; {prepare}{lookup}",',
        '            cursor.execute(f"{set_tenant_sql(request.tenant_id)}; SELECT 1; {prepare}{lookup}",',
        (TENANCY + "test_pinned_names.py",),
    ),
    mutant(
        "store.offset-lock-unpinned", "outbox.store",
        "a consumer's batch pins its names: it locks and advances its own offset row, never a temporary one",
        "outbox/store.py",
        "        execute_pinned(cursor, using, _LOCK_OFFSET.format(watch=watch),\n",
        "        cursor.execute(_LOCK_OFFSET.format(watch=watch),\n",
        (TENANCY + "test_pinned_names.py::test_a_consumer_batch_locks_and_advances_its_own_offset_row",),
    ),
    # --- SQL: the policies, FORCE (tests/tenancy/test_isolation.py, test_roles.py) --------------
    mutant(
        "rls.received-not-forced", "outbox.sql",
        "FORCE applies outbox_received's policy to the table's owner too",
        "outbox/sql/0002_outbox.sql",
        "ALTER TABLE outbox_received FORCE ROW LEVEL SECURITY;\n",
        "",
        (TENANCY + "test_isolation.py::test_force_applies_the_policy_to_the_tables_owner_too",
         TENANCY + "test_roles.py"),
    ),
    mutant(
        "rls.received-or-true", "outbox.sql",
        "outbox_received: a tenant sees and writes its own rows only",
        "outbox/sql/0007_verified_context_policy.sql",
        "ALTER POLICY outbox_received_tenant_isolation ON outbox_received\n"
        "    USING (tenant_id = (SELECT tenancy_current_tenant()))",
        "ALTER POLICY outbox_received_tenant_isolation ON outbox_received\n"
        "    USING (tenant_id = (SELECT tenancy_current_tenant()) OR true)",
        (TENANCY + "test_isolation.py", TENANCY + "test_roles.py"),
    ),
    mutant(
        "rls.keys-check-open", "idempotency.sql",
        "idempotency_keys: a tenant cannot write a key for another tenant (WITH CHECK)",
        "idempotency/sql/0007_verified_context_policy.sql",
        "    WITH CHECK (tenant_id = (SELECT tenancy_current_tenant()));",
        "    WITH CHECK (tenant_id = (SELECT tenancy_current_tenant()) OR true);",
        (TENANCY + "test_isolation.py",),
    ),
    mutant(
        "rls.failures-not-enabled", "outbox.sql",
        "outbox_consumer_failures: the worker role sees its message's tenant's failures only",
        "outbox/sql/0005_worker_role.sql",
        "ALTER TABLE outbox_consumer_failures ENABLE ROW LEVEL SECURITY;\n",
        "",
        (TENANCY + "test_isolation.py",),
    ),
    mutant(
        "db.policy-compared-loosely", "tenancy.db",
        "check tenancy.E014 reports a policy that is not exactly the installed one ('... OR true')",
        "tenancy/db.py",
        "    return qual in allowed and (check is None or check in allowed)",
        "    return qual is not None and 'tenancy_current_tenant()' in qual",
        (TENANCY + "test_roles.py",),
    ),
    # --- the privilege matrix, retention, received records ------------------------------------
    mutant(
        "privileges.app-on-offsets", "outbox.models",
        "the web role has no privilege on consumer_offsets",
        "outbox/models.py",
        '"consumer_offsets": {WORKER: ("SELECT", "INSERT", "UPDATE"), SYSTEM: ("SELECT",)},',
        '"consumer_offsets": {APP: ("SELECT", "UPDATE"), WORKER: ("SELECT", "INSERT", "UPDATE"),'
        ' SYSTEM: ("SELECT",)},',
        (TENANCY + "test_privileges.py::test_the_web_role_cannot_touch_shared_delivery_state",),
    ),
    mutant(
        "retention.unstarted-reader-ignored", "outbox.retention",
        "retention waits for a configured reader that has no offset row yet",
        "outbox/retention.py",
        "    if not readers or expected - present:",
        "    if not readers:",
        (OUTBOX + "test_retention.py",),
    ),
    mutant(
        "received.duplicate-runs", "outbox.store",
        "a receiver handles each message once, however often it arrives",
        "outbox/store.py",
        "        cursor.execute(_RECORD_RECEIVED, [tenant_id, receiver, message_id])\n"
        "        return int(cursor.rowcount) == 1",
        "        cursor.execute(_RECORD_RECEIVED, [tenant_id, receiver, message_id])\n"
        "        return True",
        (OUTBOX + "test_relay.py::test_receiver_handles_a_message_once_however_often_it_arrives",),
    ),
    mutant(
        "received.forgotten-at-once", "outbox.store",
        "receiver records are kept for RECEIVED_RETENTION before reap_outbox forgets them",
        "outbox/store.py",
        "         WHERE tenant_id = %s AND received_at < now() - make_interval(secs => %s)\n",
        "         WHERE tenant_id = %s AND received_at < now() + make_interval(secs => %s)\n",
        (OUTBOX + "test_retention.py::test_old_receiver_records_are_forgotten_in_bounded_batches",),
    ),
    # --- the demo as deployed (example_project, scripts/demo) -----------------------------------
    mutant(
        "example.schema-generated-concurrently", "example_project",
        "the shop's first concurrent /schema/ requests all answer 200 (one generation at a time)",
        "example_project/urls.py",
        "        with self._generating:\n",
        "        if True:\n",
        ("tests/example/test_schema.py",),
    ),
    mutant(
        "example.foreign-key-across-tenants", "example_project",
        "a shop order refers to its own tenant's product only, and another's looks missing",
        "example_project/shop/sql/0003_tenant_keys.sql",
        "    FOREIGN KEY (tenant_id, product_id) REFERENCES shop_product (tenant_id, id)",
        "    FOREIGN KEY (product_id) REFERENCES shop_product (id)",
        more=(Edit("example_project/shop/sql/0003_tenant_keys.sql",
                   "ALTER TABLE shop_product DROP CONSTRAINT shop_product_pkey, ADD PRIMARY KEY"
                   " (tenant_id, id);",
                   "ALTER TABLE shop_product ADD UNIQUE (tenant_id, id);"),),
        tests=("tests/example/test_shop_keys.py",),
    ),
    # --- nothing left in a session (tests/test_session_state.py) --------------------------------
    mutant(
        "store.key-lock-for-the-session", "idempotency.store",
        "the key's in-flight lock is transaction-level: a session holds no lock after a request",
        "idempotency/store.py",
        "ELSE pg_try_advisory_xact_lock(%(lock_id)s) END",
        "ELSE pg_try_advisory_lock(%(lock_id)s) END",
        ("tests/test_session_state.py::test_direct_connections_come_back_from_the_librarys_flows_holding_nothing",
         "tests/test_session_state.py::test_pooled_sessions_come_back_from_the_librarys_flows_holding_nothing"),
    ),
    mutant(
        "store.batch-setting-for-the-session", "outbox.store",
        "a consumer batch's settings are transaction-local: a session holds none after a batch",
        "outbox/store.py",
        "       set_config('client_connection_check_interval', '1000', true)",
        "       set_config('client_connection_check_interval', '1000', false)",
        ("tests/test_session_state.py::test_direct_connections_come_back_from_the_librarys_flows_holding_nothing",
         "tests/test_session_state.py::test_pooled_sessions_come_back_from_the_librarys_flows_holding_nothing"),
    ),
    # --- tenancy: no temporary objects for the app and worker roles (test_temporary.py) --------
    mutant(
        "privileges.temporary-kept-through-public", "tenancy.privileges",
        "migrate takes TEMPORARY away from the app and worker roles (they have it through PUBLIC)",
        "tenancy/privileges.py",
        '        f"REVOKE TEMPORARY {on} FROM PUBLIC;",\n',
        "",
        (TENANCY + "test_temporary.py",),
    ),
    mutant(
        "checks.E030-missing", "tenancy.checks",
        "check tenancy.E030 reports an app or worker role that can create temporary tables",
        "tenancy/checks.py",
        "    if not holders:\n        return []\n    fix = ",
        "    if True:\n        return []\n    fix = ",
        (TENANCY + "test_temporary.py",),
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
    # --- tenancy: adoption (issue 19) -----------------------------------------------------------
    mutant(
        "databases.app-engine-django", "tenancy.layout",
        "manage.py test works with databases()'s aliases: the owner creates, migrates and flushes "
        "the test database",
        "tenancy/layout.py",
        '            "ENGINE": OWNER_ENGINE if kind == "owner" else ROLE_ENGINE,',
        '            "ENGINE": OWNER_ENGINE,',
        (TENANCY + "test_setup_databases.py",
         "tests/test_getting_started.py::test_the_getting_started_page_works_as_written_and_past_it"),
    ),
    mutant(
        "databases.user-in-url-accepted", "tenancy.layout",
        "a database URL that names a user or a password is refused",
        "tenancy/layout.py",
        '        if "@" in parts.netloc:\n            raise DatabaseURLError(_NO_USER)',
        '        if False:\n            raise DatabaseURLError(_NO_USER)',
        (TENANCY + "test_setup_databases.py",),
    ),
    mutant(
        "backend.own-test-signature", "tenancy.backends.postgresql",
        "the four aliases get one test database, created and dropped once (never the real one)",
        "tenancy/backends/postgresql/base.py",
        "        if owner is None:\n            return tuple(super().test_db_signature())",
        "        if owner is None or True:\n            return tuple(super().test_db_signature())",
        ("tests/test_getting_started.py::test_the_getting_started_page_works_as_written_and_past_it",),
    ),
    mutant(
        "backend.every-alias-flushes", "tenancy.backends.postgresql",
        "a TransactionTestCase on every alias flushes once, through the app alias",
        "tenancy/backends/postgresql/base.py",
        "                and self.connection.alias != tenancy_settings.APP_DATABASE):",
        "                and self.connection.alias != tenancy_settings.APP_DATABASE and False):",
        ("tests/test_getting_started.py::test_the_getting_started_page_works_as_written_and_past_it",),
    ),
    mutant(
        "backend.flush-as-the-role", "tenancy.backends.postgresql",
        "TransactionTestCase's flush runs through the owner (only it may TRUNCATE)",
        "tenancy/backends/postgresql/base.py",
        "        owner = _owner(self.connection)\n        if owner is None:\n"
        "            super().execute_sql_flush(sql_list)",
        "        owner = None\n        if owner is None:\n            super().execute_sql_flush(sql_list)",
        ("tests/test_getting_started.py::test_the_getting_started_page_works_as_written_and_past_it",),
    ),
    mutant(
        "provision.system-without-bypassrls", "tenancy.provision",
        "create_roles gives the system role BYPASSRLS, and no superuser",
        "tenancy/provision.py",
        '    "system": {"rolcanlogin": True, "rolsuper": False, "rolbypassrls": True,',
        '    "system": {"rolcanlogin": True, "rolsuper": False, "rolbypassrls": False,',
        (TENANCY + "test_setup_roles.py",),
    ),
    mutant(
        "provision.existing-role-not-altered", "tenancy.provision",
        "create_roles alters a role whose attributes differ from the design's",
        "tenancy/provision.py",
        "        differ = _attributes(kind, current)",
        "        differ: list[str] = []",
        (TENANCY + "test_setup_roles.py",),
    ),
    mutant(
        "provision.password-sent", "tenancy.provision",
        "create_roles never shows a password: --print's SQL carries a SCRAM verifier",
        "tenancy/provision.py",
        "                f\"PASSWORD '{scram_verifier(password.value)}';\",",
        "                f\"PASSWORD '{password.value}';\",",
        (TENANCY + "test_setup_roles.py",),
    ),
    mutant(
        "provision.not-idempotent", "tenancy.provision",
        "create_roles run again changes nothing and says so",
        "tenancy/provision.py",
        "        if current is None:\n            password = passwords(kind)",
        "        if True:\n            password = passwords(kind)",
        (TENANCY + "test_setup_roles.py",),
    ),
    mutant(
        "policies.library-apps-declared", "tenancy.policies",
        "makemigrations writes policies for your models, never in the library's apps",
        "tenancy/policies.py",
        "        and meta.app_label not in _library_apps()\n",
        "",
        (TENANCY + "test_setup_policies.py",),
    ),
    mutant(
        "policies.no-function-dependency", "tenancy.policies",
        "a migration that creates a policy depends on tenancy's migration that defines its functions",
        "tenancy/policies.py",
        "                needs = any(_declares(op) for op in migration.operations)",
        "                needs = False",
        (TENANCY + "test_setup_policies.py",),
    ),
    mutant(
        "policies.sql-open", "tenancy.policies",
        "the policy makemigrations writes compares tenant_id with tenancy_current_tenant()",
        "tenancy/sql/0002_tenant_isolation.sql",
        "                   ' USING (tenant_id = (SELECT tenancy_current_tenant()))'",
        "                   ' USING (true)'",
        (TENANCY + "test_setup_policies.py",),
    ),
    mutant(
        "policies.sql-not-forced", "tenancy.policies",
        "the policy's migration enables and forces row-level security",
        "tenancy/sql/0002_tenant_isolation.sql",
        "    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', tbl);",
        "",
        (TENANCY + "test_setup_policies.py",),
    ),
    mutant(
        "policies.sql-hand-written-lost", "tenancy.policies",
        "reversing the migration gives a taken-over hand-written policy back",
        "tenancy/sql/0002_tenant_isolation.sql",
        "    IF before->>'replaced' IS NOT NULL THEN\n        EXECUTE before->>'replaced';",
        "    IF false THEN\n        EXECUTE before->>'replaced';",
        (TENANCY + "test_setup_policies.py",),
    ),
    mutant(
        "privileges.worker-no-migrations-record", "tenancy.privileges",
        "makemigrations works through every alias: every role may read django_migrations",
        "tenancy/privileges.py",
        '    "django_migrations": {APP: ("SELECT",), WORKER: ("SELECT",), SYSTEM: ("SELECT",)},',
        '    "django_migrations": {APP: ("SELECT",), SYSTEM: ("SELECT",)},',
        (TENANCY + "test_setup_upgrade.py",),
    ),
    mutant(
        "privileges.apply-everything", "tenancy.privileges",
        "a second migrate (or grant_privileges) runs no statement",
        "tenancy/privileges.py",
        "            if grant.revoke_first and (has != set(grant.privileges) or grant.table in public):",
        "            if grant.revoke_first:",
        (TENANCY + "test_setup_upgrade.py",),
    ),
    mutant(
        "privileges.public-kept", "tenancy.privileges",
        "migrate takes back what PUBLIC was granted on the tables the matrix governs",
        "tenancy/privileges.py",
        "        public = {row[0] for row in cursor.fetchall()}",
        "        public: set[str] = set()",
        (TENANCY + "test_setup_upgrade.py",),
    ),
    mutant(
        "checks.migrate-stops-on-privileges", "tenancy.checks",
        "migrate as the owner does not stop on the privileges it is about to apply (tenancy.W027)",
        "tenancy/checks.py",
        "        if findings and owns_tables(aliases[0]):",
        "        if False:",
        (TENANCY + "test_setup_upgrade.py",),
    ),
    mutant(
        "checks.W028-missing", "tenancy.checks",
        "check warns about a table of yours the app role cannot touch (tenancy.W028)",
        "tenancy/checks.py",
        "    if not bare:\n        return []",
        "    if True:\n        return []",
        (TENANCY + "test_setup_docs.py",),
    ),
    mutant(
        "checks.E012-missing", "tenancy.checks",
        "manage.py check refuses an app alias with BYPASSRLS (tenancy.E012)",
        "tenancy/checks.py",
        "    if role.bypassrls:\n        yield checks.Error(",
        "    if False:\n        yield checks.Error(",
        (T_CLAIMS, TENANCY + "test_roles.py"),
    ),
    # --- the hot paths' statements (issue 22: prepared where not pooled; the relay's shortcuts)
    mutant(
        "statements.pooled-alias-prepares", "tenancy.statements",
        "a pooled alias never sees a prepared statement, and nothing is left in its sessions",
        "tenancy/statements.py",
        "    return isinstance(cursor.cursor, psycopg.ClientCursor) and not pooled(alias)",
        "    return isinstance(cursor.cursor, psycopg.ClientCursor)",
        (IDEM + "test_prepared.py", OUTBOX + "test_prepared_insert.py"),
    ),
    mutant(
        "context.pooler-unnoticed", "tenancy.context",
        "a pooler in front of an alias is noticed even when its settings do not say so",
        "tenancy/context.py",
        "        _behind_pooler[key] = server_pid is not None and server_pid != login_pid",
        "        _behind_pooler[key] = False",
        (IDEM + "test_prepared.py", OUTBOX + "test_prepared_insert.py"),
    ),
    mutant(
        "statements.deallocated-not-forgotten", "tenancy.statements",
        "statements someone deallocated are prepared again by the next message",
        "tenancy/statements.py",
        "    if isinstance(cause, psycopg.errors.InvalidSqlStatementName):\n",
        "    if False:\n",
        (IDEM + "test_prepared.py", OUTBOX + "test_prepared_insert.py"),
    ),
    mutant(
        "transports.template-unchecked", "outbox.transports",
        "a message template is used only if its holes are where Celery's steps put them",
        "outbox/transports.py",
        "        if {hole: text.count(hole) for hole in cls.EXPECTED} != cls.EXPECTED:\n            return None",
        "        if False:\n            return None",
        (OUTBOX + "test_relay_pipeline.py",),
    ),
    mutant(
        "relay.read-ahead-any-position", "outbox.relay",
        "a batch read ahead is used only by a round that starts where it was read from",
        "outbox/relay.py",
        "        if pending is None or after != position:",
        "        if pending is None:",
        (OUTBOX + "test_relay_pipeline.py",),
    ),
    mutant(
        "relay.read-ahead-connection-left", "outbox.relay",
        "the read-ahead thread closes its connection when the relay stops",
        "outbox/relay.py",
        "            self._pool.submit(_close, self._relay.alias).result()",
        "            pass",
        (OUTBOX + "test_relay_pipeline.py",),
        equivalent="the pool's thread ends at shutdown, and CPython frees its Django connection"
                   " with it (psycopg closes the session): the explicit close only makes that"
                   " not depend on reference counting",
    ),
    # --- the tests review's rows (the test that kills each is named with it) ---------------------
    mutant(
        "flow.lookup-before-input-guards", "idempotency.flow",
        "bad input (size, depth, text, path) is answered before anything is looked up",
        "idempotency/flow.py",
        "            inputs.check_size(request)\n",
        '            __import__("django.db").db.connections[app_alias()].cursor().execute('
        '"SELECT count(*) FROM idempotency_keys")\n            inputs.check_size(request)\n',
        (IDEM + "test_bad_input.py::test_bad_input_is_answered_before_any_statement_is_sent",),
    ),
    mutant(
        "mixins.scope-hook-ignored", "idempotency.mixins",
        "get_idempotency_scope() names the operation keys are unique in",
        "idempotency/mixins.py",
        "        return self.view.get_idempotency_scope()",
        "        return IdempotentViewMixin.get_idempotency_scope(self.view)",
        (IDEM + "test_contract.py::test_the_scope_hook_names_the_operation_keys_are_unique_in",),
    ),
    mutant(
        "mixins.principal-hook-ignored", "idempotency.mixins",
        "get_idempotency_principal() decides who is asking (part of the fingerprint)",
        "idempotency/mixins.py",
        "            str(request.method), path, self.get_idempotency_principal(), request.data",
        "            str(request.method), path, principal_of(getattr(request, 'user', None)),"
        " request.data",
        (IDEM + "test_contract.py::test_the_principal_hook_decides_who_is_asking",),
    ),
    mutant(
        "mixins.fingerprint-hook-ignored", "idempotency.mixins",
        "get_idempotency_fingerprint() decides what makes the same request",
        "idempotency/mixins.py",
        "        return self.view.get_idempotency_fingerprint()",
        "        return IdempotentViewMixin.get_idempotency_fingerprint(self.view)",
        (IDEM + "test_contract.py::test_the_fingerprint_hook_decides_what_makes_the_same_request",),
    ),
    mutant(
        "mixins.default-scope-without-module", "idempotency.mixins",
        "the default scope is <module>.<ViewClass>.<action>",
        "idempotency/mixins.py",
        '        return f"{cls.__module__}.{cls.__qualname__}.{action}"',
        '        return f"{cls.__qualname__}.{action}"',
        (IDEM + "test_contract.py::test_the_default_scope_is_module_view_class_and_action",),
    ),
    mutant(
        "phases.foreign-key-from-names", "idempotency.phases",
        "ctx.foreign_key differs for a key reused after it expired (not only per tenant, scope, key)",
        "idempotency/phases.py",
        'digest = hashlib.sha256(f"{self.request_id}\\x1f{name}".encode()).hexdigest()',
        'digest = hashlib.sha256(f"{self.tenant_id}\\x1f{self.scope}\\x1f{self.key}\\x1f{name}"'
        '.encode()).hexdigest()',
        (IDEM + "test_phases.py::test_foreign_keys_differ_per_scope_and_for_a_key_reused_after_it"
         "_expired",),
    ),
    mutant(
        "store.take-over-without-cas", "idempotency.store",
        "two completers never both run a key: the take-over is a compare-and-set on its token",
        "idempotency/store.py",
        " WHERE {_KEY} AND state = '{PENDING}' AND lease_token = %(token)s\n"
        "   AND (locked_until IS NULL OR locked_until <= clock_timestamp())\n{_CLAIM_RETURNING}",
        " WHERE {_KEY} AND state = '{PENDING}' AND lease_token >= 0 AND %(token)s >= 0\n"
        "{_CLAIM_RETURNING}",
        (IDEM + "test_completer.py::test_two_completers_that_found_the_same_key_run_it_once",),
    ),
    mutant(
        "leases.claim-unconditional", "django_idempotency_outbox.leases",
        "one key reaper at a time: a second, even racing the first for the lease, refuses",
        "django_idempotency_outbox/leases.py",
        '            f"   AND ({owner} = %(owner)s OR {until} IS NULL OR {until} < now())\\n"',
        '            f"   AND ({owner} = %(owner)s OR {until} IS NULL OR {until} < now() OR true)\\n"',
        (IDEM + "test_reaper.py::test_a_reaper_started_while_another_is_mid_run_refuses_naming_it",
         IDEM + "test_reaper.py::test_two_sessions_claiming_the_lease_at_once_take_turns_and_the"
         "_second_finds_it_held"),
    ),
    mutant(
        "leases.by-app-clock", "django_idempotency_outbox.leases",
        "leases (the key reaper's, the relay's) are set by the database clock, whatever the "
        "app's clock says",
        "django_idempotency_outbox/leases.py",
        '        expiry = "now() + make_interval(secs => %(seconds)s)"',
        '        expiry = "%(app_now)s::timestamptz + make_interval(secs => %(seconds)s)"',
        (I_CLAIMS + "::test_every_lease_and_horizon_of_the_keys_is_the_database_clocks",
         O_CLAIMS + "::test_every_lease_pause_and_retention_of_the_outbox_is_the_database_clocks"),
        more=(
            Edit("idempotency/store.py",
                 '        cursor.execute(LEASES.claim, {"owner": owner, "seconds": seconds, "name": name})',
                 '        cursor.execute(LEASES.claim, {"owner": owner, "seconds": seconds, "name": name,'
                 ' "app_now": __import__("django.utils.timezone").utils.timezone.now()})'),
            Edit("outbox/store.py",
                 '    lease = {"name": name, "owner": owner, "seconds": seconds}',
                 '    lease = {"name": name, "owner": owner, "seconds": seconds,'
                 ' "app_now": __import__("django.utils.timezone").utils.timezone.now()}'),
            Edit("outbox/store.py",
                 '                       {"name": name, "owner": owner, "seconds": seconds})',
                 '                       {"name": name, "owner": owner, "seconds": seconds,'
                 ' "app_now": __import__("django.utils.timezone").utils.timezone.now()})'),
        ),
    ),
    mutant(
        "store.stuck-by-app-clock", "idempotency.store",
        "STUCK_AFTER and GIVE_UP_AFTER are compared with the database clock",
        "idempotency/store.py",
        "    return unattended() & Q(created_at__lt=Now() - after)",
        '    return unattended() & Q(created_at__lt=__import__("django.utils.timezone").utils'
        '.timezone.now() - after)',
        (I_CLAIMS + "::test_every_lease_and_horizon_of_the_keys_is_the_database_clocks",),
    ),
    mutant(
        "store.abandoned-by-app-clock", "idempotency.store",
        "COMPLETE_AFTER is compared with the database clock",
        "idempotency/store.py",
        "        .filter(touched__lt=Now() - older_than)",
        '        .filter(touched__lt=__import__("django.utils.timezone").utils.timezone.now()'
        ' - older_than)',
        (I_CLAIMS + "::test_every_lease_and_horizon_of_the_keys_is_the_database_clocks",),
    ),
    mutant(
        "core.store-apart-from-the-writes", "idempotency.core",
        "the key, the view's writes and the stored answer commit in one transaction: a "
        "connection lost in the final store and COMMIT leaves nothing",
        "idempotency/core.py",
        '        with tracing.span("idempotency.store"):\n            if found.exists:',
        '        with connection.cursor() as c:\n            c.execute("COMMIT")\n'
        '            c.execute("BEGIN")\n'
        "            c.execute(\"SELECT set_config('app.tenant_id', %s, true)\","
        " [str(request.tenant_id)])\n"
        '        with tracing.span("idempotency.store"):\n            if found.exists:',
        (IDEM + "test_lost_connection.py::test_a_connection_lost_in_the_final_store_and_commit"
         "_leaves_nothing",),
    ),
    mutant(
        "consumer.backoff-not-doubling", "outbox.consumers",
        "a consumer's retry pause doubles from its retry_backoff up to its retry_backoff_max",
        "outbox/consumers.py",
        "        delay = backoff(attempts, consumer.retry_backoff, consumer.retry_backoff_max)",
        "        delay = backoff(1, consumer.retry_backoff, consumer.retry_backoff_max)",
        (OUTBOX + "test_consumers.py::test_the_retry_pause_doubles_up_to_its_maximum_while_the"
         "_partition_waits",),
    ),
    mutant(
        "consumer.offsets-made-by-the-batch", "outbox.consumers",
        "without its offset rows, run_batch answers locked and handles nothing",
        "outbox/consumers.py",
        "    with transaction.atomic(using=worker):\n        offset = store.lock_offset(",
        "    ensure_offsets(consumer)\n    with transaction.atomic(using=worker):\n"
        "        offset = store.lock_offset(",
        (OUTBOX + "test_consumers.py::test_without_its_offset_rows_a_batch_answers_locked_and"
         "_handles_nothing",),
    ),
    mutant(
        "consumer.partition-unlocked", "outbox.store",
        "a partition is taken by one consumer at a time; another takes it only once it is free",
        "outbox/store.py",
        " WHERE name = %s AND partition = %s\n   FOR UPDATE SKIP LOCKED\n",
        " WHERE name = %s AND partition = %s\n",
        (OUTBOX + "test_failover.py::test_a_consumer_killed_mid_batch_is_replaced_by_a_running_one"
         "_within_seconds",),
    ),
    mutant(
        "consumer.retry-by-app-clock", "outbox.store",
        "a consumer's retry pause is counted by the database clock",
        "outbox/store.py",
        "       attempts = %s, retry_at = now() + make_interval(secs => %s)",
        "       attempts = %s, retry_at = %s::timestamptz + make_interval(secs => %s)",
        (O_CLAIMS + "::test_every_lease_pause_and_retention_of_the_outbox_is_the_database_clocks",),
        more=(Edit("outbox/store.py",
                   "            position.last, position.json(), attempts, retry_in, name, partition,",
                   "            position.last, position.json(), attempts,"
                   ' __import__("django.utils.timezone").utils.timezone.now(), retry_in, name,'
                   " partition,"),),
    ),
    mutant(
        "retention.by-app-clock", "outbox.store",
        "RETENTION is counted by the database clock",
        "outbox/store.py",
        "           AND created_at < now() - make_interval(secs => %s)",
        "           AND created_at < %s::timestamptz - make_interval(secs => %s)",
        (O_CLAIMS + "::test_every_lease_pause_and_retention_of_the_outbox_is_the_database_clocks",),
        more=(Edit("outbox/store.py",
                   "        cursor.execute(_DELETE_PASSED, [upto, older_than, limit])",
                   "        cursor.execute(_DELETE_PASSED, [upto,"
                   ' __import__("django.utils.timezone").utils.timezone.now(), older_than,'
                   " limit])"),),
    ),
    mutant(
        "retention.counts-what-it-selected", "outbox.store",
        "two outbox reapers at once: each row is deleted once, and counted once",
        "outbox/store.py",
        "        cursor.execute(_DELETE_PASSED, [upto, older_than, limit])\n"
        "        return int(cursor.rowcount)",
        '        cursor.execute("SELECT count(*) FROM (SELECT 1 FROM outbox_messages WHERE id <= %s'
        " AND created_at < now() - make_interval(secs => %s) LIMIT %s) AS c\","
        " [upto, older_than, limit])\n"
        "        found = int(cursor.fetchone()[0])\n"
        "        cursor.execute(_DELETE_PASSED, [upto, older_than, limit])\n"
        "        return found",
        (OUTBOX + "test_retention.py::test_two_reapers_at_once_delete_each_row_once",),
    ),
    mutant(
        "retention.unbounded-batches", "outbox.retention",
        "retention deletes messages and receiver records in bounded batches",
        "outbox/retention.py",
        "            deleted = store.delete_passed_messages(alias, limit, retention, size)",
        "            deleted = store.delete_passed_messages(alias, limit, retention, size * 1000)",
        (OUTBOX + "test_retention.py::test_reaping_deletes_in_bounded_batches",
         OUTBOX + "test_retention.py::test_old_receiver_records_are_forgotten_in_bounded_batches"),
        more=(Edit("outbox/retention.py",
                   "            deleted = store.delete_received(alias, tenant_id, keep, size)",
                   "            deleted = store.delete_received(alias, tenant_id, keep, size * 1000)"),),
    ),
    mutant(
        "relay.rewind-by-app-clock", "outbox.relay",
        "a rewind is refused past RETENTION and RECEIVED_RETENTION by the database clock",
        "outbox/relay.py",
        "    now = store.database_now(alias)",
        '    now = __import__("django.utils.timezone").utils.timezone.now()',
        (O_CLAIMS + "::test_every_lease_pause_and_retention_of_the_outbox_is_the_database_clocks",),
    ),
    mutant(
        "transports.pipeline-errors-ignored", "outbox.transports",
        "a failure part-way through a batch (one LPUSH of several) raises: the batch goes again",
        "outbox/transports.py",
        "                    pipe.execute()",
        "                    pipe.execute(raise_on_error=False)",
        (OUTBOX + "test_redis_wire.py::test_a_failure_part_way_through_a_batch_raises_and_the"
         "_whole_batch_is_sent_again",),
    ),
    mutant(
        "receivers.retry-refused-dropped", "outbox.celery",
        "a retry Celery cannot send puts the message back on its queue instead of dropping it",
        "outbox/celery.py",
        "        raise Reject(rejected.reason, requeue=True) from exc",
        "        raise Reject(rejected.reason, requeue=False) from exc",
        (OUTBOX + "test_faults.py::test_a_retry_the_broker_refuses_puts_the_message_back_and_it_is"
         "_handled_once",
         OUTBOX + "test_receivers.py::test_a_retry_the_broker_cannot_take_puts_the_message_back"
         "_on_its_queue"),
    ),
    mutant(
        "conf.receiver-attempts-default", "outbox.conf",
        "RECEIVER_MAX_ATTEMPTS defaults to 10 (with 1 s doubling to 5 min)",
        "outbox/conf.py",
        "    RECEIVER_MAX_ATTEMPTS = Setting(10, integer(minimum=1))",
        "    RECEIVER_MAX_ATTEMPTS = Setting(12, integer(minimum=1))",
        (OUTBOX + "test_receivers.py::test_the_documented_defaults_retry_nine_times_doubling_from_a"
         "_second_then_park",),
    ),
    mutant(
        "commands.redrive-failure-exits-zero", "outbox.management",
        "outbox_parked --redrive exits non-zero when a message fails again",
        "outbox/management/commands/outbox_parked.py",
        "                if result.failed:\n",
        "                if False:\n",
        (OUTBOX + "test_consumers.py::test_the_redrive_command_exits_non_zero_when_a_message_fails"
         "_again",),
    ),
    mutant(
        "docs.partition-change-not-lowest", "docs",
        "the documented partition-change SQL starts every new partition at the lowest position",
        "docs/consumers.md",
        "  SELECT min(least(o.last_id, (SELECT min(h.upto::bigint)",
        "  SELECT max(least(o.last_id, (SELECT min(h.upto::bigint)",
        (OUTBOX + "test_consumers.py::test_the_documented_partition_change_starts_every_new"
         "_partition_at_the_lowest_position",),
    ),
    mutant(
        "privileges.project-tables-exact", "tenancy.privileges",
        "GRANT_PROJECT_TABLES only adds grants: nothing on your own tables is revoked",
        "tenancy/privileges.py",
        "    for rows, exact in ((library_tables(app_labels), True), (project_tables(app_labels), False)):",
        "    for rows, exact in ((library_tables(app_labels), True), (project_tables(app_labels), True)):",
        (TENANCY + "test_privileges.py::test_project_table_grants_only_add_and_keep_grants_made_by"
         "_hand",),
    ),
    mutant(
        "checks.worker-alias-unchecked", "tenancy.checks",
        "the checks E011 to E013 apply to the worker alias as to the app alias",
        "tenancy/checks.py",
        "            if alias in (tenancy_settings.APP_DATABASE, tenancy_settings.WORKER_DATABASE):",
        "            if alias == tenancy_settings.APP_DATABASE:",
        (T_CLAIMS,),
    ),
    mutant(
        "checks.W019-missing", "tenancy.checks",
        "check warns when WORKER_DATABASE is not in DATABASES (tenancy.W019)",
        "tenancy/checks.py",
        "    if worker_alias not in settings.DATABASES:",
        "    if False:",
        (T_CLAIMS,),
    ),
    mutant(
        "checks.E020-worker-missing", "tenancy.checks",
        "check refuses an app role that is also the worker role (tenancy.E020)",
        "tenancy/checks.py",
        '    for kind in ("worker", "system"):',
        '    for kind in ("system",):',
        (T_CLAIMS,),
    ),
    mutant(
        "checks.E021-missing", "tenancy.checks",
        "check refuses a tenant-isolated model routed away from a consumer's batch (tenancy.E021)",
        "tenancy/checks.py",
        "    errors.extend(_check_worker_routing(own))",
        "    pass",
        (T_CLAIMS,),
    ),
    mutant(
        "checks.E026-missing", "tenancy.checks",
        "check refuses an app alias that can read a key of the verified context (tenancy.E026)",
        "tenancy/checks.py",
        "        if verified.readable_keys(alias):",
        "        if False:",
        (TENANCY + "test_verified.py::test_an_app_alias_that_can_read_a_key_is_refused_with_e026",),
    ),
    # --- issue 21: each app declares what it owns; settings; public names; rolling deploys --
    mutant(
        "layers.outbox-needs-idempotency", "outbox.publishing",
        "outbox works installed without the idempotency app",
        "outbox/publishing.py",
        "from outbox import metrics, store\n",
        "from outbox import metrics, store\nimport idempotency.conf  # noqa: F401,E402\n",
        ("tests/test_layers.py",),
    ),
    mutant(
        "privileges.declarations-ignored", "tenancy.privileges",
        "each app's TABLE_PRIVILEGES (beside its models) are what migrate grants and check compares",
        "tenancy/privileges.py",
        "        if declared and config.label != \"tenancy\":",
        "        if False:",
        (TENANCY + "test_privileges.py",),
    ),
    mutant(
        "metrics.outbox-gauges-not-collected", "outbox.metrics",
        "a scrape reads the outbox's gauges (lag, held back, parked) from the database",
        "outbox/metrics.py",
        "    instruments()\n    add_collector(OutboxCollector)",
        "    instruments()",
        ("tests/shared/test_metrics.py",),
    ),
    mutant(
        "aliases.admin-database-ignored", "tenancy.aliases",
        "the admin's lists and the metrics' gauges read through TENANCY[\"ADMIN_DATABASE\"]",
        "tenancy/aliases.py",
        "    alias = using or tenancy_settings.ADMIN_DATABASE",
        "    alias = using",
        ("tests/shared/test_metrics.py",),
    ),
    mutant(
        "conf.removed-key-unknown", "django_idempotency_outbox.conf",
        "check names what replaces a removed setting (not a generic unknown key)",
        "django_idempotency_outbox/conf.py",
        "        return sorted(set(self.user_settings()) - set(self._declared) - set(self.removed))",
        "        return sorted(set(self.user_settings()) - set(self._declared))",
        ("tests/shared/test_conf.py",),
    ),
    mutant(
        "surface.submodule-shadows-function", "outbox",
        "from outbox import status is the function the docs call, not a module",
        "outbox/__init__.py",
        "from django_idempotency_outbox.exports import lazy_exports\n",
        "from django_idempotency_outbox.exports import lazy_exports\nfrom outbox import stream as status  # noqa: E402,F401\n",
        ("tests/shared/test_surface.py",),
    ),
    mutant(
        "conf.header-changed", "idempotency.conf",
        "the key is read from the Idempotency-Key header (the IETF draft's name)",
        "idempotency/conf.py",
        'HEADER = "Idempotency-Key"',
        'HEADER = "X-Idempotency-Key"',
        (IDEM + "test_openapi.py",),
    ),
    mutant(
        "consumers.default-attempts", "outbox.consumers",
        "a consumer parks a message after 5 attempts unless it sets max_attempts",
        "outbox/consumers.py",
        "    max_attempts: ClassVar[int] = 5",
        "    max_attempts: ClassVar[int] = 6",
        (OUTBOX + "test_consumers.py",),
    ),
    mutant(
        "consumers.attributes-unchecked", "outbox.consumers",
        "a consumer's batch size, attempts and backoff are refused by name when they are not numbers",
        "outbox/consumers.py",
        '    for attribute in ("batch_size", "max_attempts"):',
        '    for attribute in ():',
        (OUTBOX + "test_consumers.py",),
    ),
    mutant(
        "retention.named-relay-ignored", "outbox.retention",
        "retention waits for every relay that has run, whatever its name",
        "outbox/relay.py",
        '    found = sorted({name for name in names if name.startswith("relay:")})',
        '    found = [name for name in names if name == f"relay:{DEFAULT_NAME}"]',
        (OUTBOX + "test_retention.py",),
    ),
    mutant(
        "retention.waits-without-transport", "outbox.retention",
        'with OUTBOX["TRANSPORT"] = None retention waits for no relay',
        "outbox/retention.py",
        "    if outbox_settings.TRANSPORT is not None:\n        expected.update(",
        "    if True:\n        expected.update(",
        (OUTBOX + "test_retention.py",),
    ),
    mutant(
        "rolling.web-of-previous-release-cannot-publish", "outbox.sql",
        "a web process of the previous release keeps publishing against this release's schema",
        "outbox/sql/0008_tenant_fence.sql",
        "-- The previous release's readers, refused: they would pass the held tenants'",
        "ALTER TABLE outbox_messages ADD COLUMN producer text NOT NULL;\n"
        "-- The previous release's readers, refused: they would pass the held tenants'",
        ("tests/test_rolling_deploy.py",),
        more=(Edit(
            "outbox/store.py",
            "       (tenant_id, message_id, topic, key, aggregate_type, aggregate_id, payload, headers)\n"
            "VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonb)",
            "       (tenant_id, message_id, topic, key, aggregate_type, aggregate_id, payload, headers,"
            " producer)\nVALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonb, 'v2')",
        ),),
    ),
    mutant(
        "relay.send-in-transaction", "outbox.relay",
        "the relay sends with no transaction open (docs/outbox.md)",
        "outbox/relay.py",
        "            with _relay_spans(self.name, batch.messages):\n",
        "            with _relay_spans(self.name, batch.messages), __import__(\"django.db\").db"
        ".transaction.atomic(using=self.alias):\n"
        "                __import__(\"django.db\").db.connections[self.alias].cursor()"
        ".execute(\"SELECT 1\")\n",
        (O_CLAIMS + "::test_no_transaction_is_open_on_the_relays_session_while_it_sends",),
    ),
    mutant(
        "core.savepoint-before-lock", "idempotency.core",
        "a final 4xx keeps the key's lock until its answer is stored (the handler's savepoint"
        " opens after the lock)",
        "idempotency/core.py",
        "            (self.trailing if self.trail else self.held).append(sql)",
        "            self.held.append(sql)",
        (IDEM + "test_handler_savepoint.py",),
    ),
    mutant(
        "statements.cursor-keeps-its-connection", "tenancy.statements",
        "a connection Django closed is not kept in memory by the library's kept cursor",
        "tenancy/statements.py",
        "    kept = _cursors.get(connection)\n",
        "    kept = _cursors.get(connection.connection)\n",
        (IDEM + "test_prepared.py::test_a_closed_connection_is_not_kept_alive_by_the_kept_cursor",),
        more=(Edit("tenancy/statements.py",
                   "            kept = _cursors[connection] = connection.create_cursor()",
                   "            kept = _cursors[connection.connection] = connection.create_cursor()"),),
    ),
    mutant(
        "statements.result-type-change-fatal", "tenancy.statements",
        "a migration that changes a prepared statement's result type does not break open "
        "connections (their statements go as text)",
        "tenancy/statements.py",
        "    if isinstance(cause, psycopg.errors.FeatureNotSupported) and _sessions.get(session):",
        "    if False:",
        (IDEM + "test_prepared.py::test_a_column_whose_type_a_migration_changed_is_read_as_text"
         "_from_then_on",),
    ),
    mutant(
        "core.savepoint-text-unchecked", "idempotency.core",
        "the key's lock stays outside the handler's savepoint when a wrapper changes its text",
        "idempotency/core.py",
        "        if self.coalesce.trail:\n            # Not held",
        "        if False:\n            # Not held",
        (IDEM + "test_handler_savepoint.py::test_a_wrapper_that_changes_the_savepoints_text_still"
         "_leaves_the_lock_outside_it",),
    ),
    # --- issue 31: the claims without a proof (the `claims` stream) ---------------------------
    mutant(
        "references.plain-constraint", "tenancy.references",
        "a TenantForeignKey's constraint includes tenant_id: a tenant cannot refer to another "
        "tenant's row, and learns nothing of which ids exist",
        "tenancy/references.py",
        '''            f" FOREIGN KEY ({q(TENANT_COLUMN)}, {q(field.column)})"  # type: ignore[union-attr]
            f" REFERENCES {q(target.db_table)}"
            f" ({q(TENANT_COLUMN)}, {q(field.target_field.column)})"  # type: ignore[union-attr]''',
        '''            f" FOREIGN KEY ({q(field.column)})"  # type: ignore[union-attr]
            f" REFERENCES {q(target.db_table)}"
            f" ({q(field.target_field.column)})"  # type: ignore[union-attr]''',
        (TENANCY + "test_references.py",),
    ),
    mutant(
        "references.django-constraint-kept", "tenancy.references",
        "a TenantForeignKey has no constraint on its column alone (checked across tenants)",
        "tenancy/references.py",
        '''        kwargs["db_constraint"] = False  # the composite TenantReference takes its place''',
        '''        kwargs.setdefault("db_constraint", True)''',
        (TENANCY + "test_references.py",),
    ),
    mutant(
        "references.key-dropped-first", "tenancy.references",
        "a migration that drops the last reference to a model drops its key after the reference",
        "tenancy/references.py",
        '''        schema_editor.deferred_sql.append(super().remove_sql(model, schema_editor))
        return ""''',
        '''        return super().remove_sql(model, schema_editor)''',
        (TENANCY + "test_references.py::test_dropping_the_last_reference_drops_the_key_after_it",),
    ),
    mutant(
        "references.W047-missing", "tenancy.references",
        "check warns about a plain foreign key between tenant-isolated models (tenancy.W047)",
        "tenancy/references.py",
        "            if declares_policy(model) and _tenant_isolated(target) and _has_tenant(target):",
        "            if False:",
        (TENANCY + "test_references.py",),
    ),
    mutant(
        "environment.W049-missing", "tenancy.environment",
        "check names an exported PGPASSWORD that shadows the aliases' password file (tenancy.W049)",
        "tenancy/environment.py",
        '''    if not os.environ.get("PGPASSWORD"):''',
        '''    if True:''',
        (TENANCY + "test_environment.py",),
    ),
    mutant(
        "consumers.rls-bound-system-alias-used", "outbox.consumers",
        "run_consumers refuses, in one line, a system alias that row-level security confines",
        "outbox/consumers.py",
        "    require_cross_tenant_reader(system_alias())\n    for consumer in consumers:",
        "    for consumer in consumers:",
        (OUTBOX + "test_consumers.py::test_run_consumers_refuses_a_system_alias_confined_by_rls"
         "_and_handles_nothing",),
    ),
    mutant(
        "completer.rls-bound-alias-used", "idempotency.completer",
        "complete_idempotency_keys refuses, in one line, an alias that row-level security confines",
        "idempotency/completer.py",
        '''    require_cross_tenant(alias, ["idempotency_keys"], job="the completer")\n''',
        "",
        (IDEM + "test_completer.py::test_the_command_refuses_an_alias_confined_by_rls_and"
         "_completes_nothing",),
    ),
    mutant(
        "health.failing-head-unexplained", "outbox.health",
        "outbox_health says when a reader's head message keeps failing",
        "outbox/health.py",
        "    if reader.attempts:\n",
        "    if False:\n",
        (OUTBOX + "test_health.py::test_a_head_message_that_keeps_failing_is_named_as_what_holds"
         "_the_consumer",),
    ),
    mutant(
        "transports.first-trace-for-all", "outbox.transports",
        "while tracing is on, each message relayed to Redis carries its own trace context",
        "outbox/transports.py",
        "            if trace:\n                headers.update(item.trace_headers())\n"
        "            body = f\"[[{item.as_json(json_dumps)}],{json_dumps(kwargs)}",
        "            if trace:\n                headers.update(items[0].trace_headers())\n"
        "            body = f\"[[{item.as_json(json_dumps)}],{json_dumps(kwargs)}",
        ("tests/shared/test_tracing.py::test_the_trace_reaches_a_celery_receiver_through_the_task"
         "_headers",),
    ),
    mutant(
        "loops.database-pause-fixed", "outbox.loops",
        "a loop that lost the database retries after 1 s, doubled up to 30 s",
        "outbox/loops.py",
        "            pause = backoff(failures, DATABASE_BACKOFF, MAX_DATABASE_BACKOFF)",
        "            pause = DATABASE_BACKOFF",
        (OUTBOX + "test_backoff.py",),
    ),
    mutant(
        "relay.broker-pause-fixed", "outbox.relay",
        "a relay whose broker fails retries after 0.5 s, doubled up to 30 s",
        "outbox/relay.py",
        "            pause = backoff(\n                self._broker_failures,\n"
        "                BROKER_BACKOFF,\n                BROKER_BACKOFF_MAX,\n            )",
        "            pause = BROKER_BACKOFF",
        (OUTBOX + "test_backoff.py",),
    ),
    mutant(
        "consumers.lost-batch-counted-as-failure", "outbox.consumers",
        "a consumer loop whose connection is cut inside a batch reconnects and runs the batch "
        "again (the cut is not the message's failed attempt)",
        "outbox/consumers.py",
        "    except Exception as exc:\n        _raise_if_lost(alias, exc)\n",
        "    except Exception:\n        pass\n",
        (OUTBOX + "test_processes.py::test_the_consumer_loop_survives_losing_the_database_and"
         "_stops_on_sigterm",),
        more=(Edit("outbox/consumers.py",
                   "            _raise_if_lost(alias, exc)\n            return index, (message, exc)",
                   "            return index, (message, exc)"),),
    ),
    mutant(
        "consumers.vanished-host-unwatched", "outbox.consumers",
        "PostgreSQL ends the session of a consumer whose host vanished mid-batch after about "
        "lost_after (3 s), releasing its partition",
        "outbox/consumers.py",
        "partition, lost_after=consumer.lost_after)",
        "partition, lost_after=0)",
        (OUTBOX + "test_failover.py::test_a_consumer_whose_host_vanishes_mid_batch_is_cut_off"
         "_after_about_lost_after",),
    ),
    mutant(
        "conf.relay-lease-3-s", "outbox.conf",
        "a relay that died is replaced about a second after (RELAY_LEASE 1 s)",
        "outbox/conf.py",
        "    RELAY_LEASE = Setting(timedelta(seconds=1), seconds(allow_zero=False))",
        "    RELAY_LEASE = Setting(timedelta(seconds=3), seconds(allow_zero=False))",
        (OUTBOX + "test_failover.py::test_a_relay_killed_by_sigkill_is_replaced_by_a_waiting_one"
         "_within_seconds",),
    ),
    mutant(
        "conf.poll-interval-2-s", "outbox.conf",
        "a killed consumer's partition is taken by a running one at once (it polls every 0.05 s)",
        "outbox/conf.py",
        "    POLL_INTERVAL = Setting(0.05, seconds())",
        "    POLL_INTERVAL = Setting(2.0, seconds())",
        (OUTBOX + "test_failover.py::test_a_consumer_killed_mid_batch_is_replaced_by_a_running_one"
         "_within_seconds",),
    ),
    # --- modules the catalogue had none for (tests review, RM2) -------------------------------
    mutant(
        "fingerprints.keys-in-given-order", "idempotency.fingerprints",
        "the fingerprint's JSON sorts object keys: the same body in another key order is the "
        "same request",
        "idempotency/fingerprints.py",
        "            for index, name in enumerate(sorted(members, reverse=True)):",
        "            for index, name in enumerate(reversed(list(members))):",
        (IDEM + "test_properties.py",),
    ),
    mutant(
        "responses.replay-unmarked", "idempotency.responses",
        "a replay carries Idempotent-Replayed: true",
        "idempotency/responses.py",
        '''    response[REPLAYED_HEADER] = "true"\n''',
        "",
        (IDEM + "test_contract.py",),
    ),
    mutant(
        "inputs.stored-data-unbounded", "idempotency.inputs",
        "data a phases-mode key keeps to resume is refused past MAX_STORED_DATA (413 "
        "stored_data_too_large)",
        "idempotency/inputs.py",
        "    if len(text) > limit:  # ensure_ascii",
        "    if False:  # ensure_ascii",
        (IDEM + "test_bad_input.py",),
    ),
]
