"""Finishing phases-mode requests that their clients abandoned.

Pending keys of ``completable`` programs whose lease ran out and that nobody
touched for ``COMPLETE_AFTER`` are run from their last recovery point with
the request data stored on the key, as a retry by the client would. Taking a
key over is a compare-and-set on its fencing token, so two completers (or a
completer and the client) never both run it; after ``COMPLETE_MAX_ATTEMPTS``
failed runs the key is finished with the abandoned answer and logged at
ERROR. docs/phases.md, "Abandoned requests: the completer".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta

from django_idempotency_outbox.durations import as_timedelta
from idempotency import metrics, phases, store
from idempotency.conf import COMPLETE_BATCH_SIZE, idempotency_settings
from idempotency.core import IdempotentRequest, Outcome, Verdict
from tenancy.aliases import app_alias, system_alias
from tenancy.db import require_cross_tenant

logger = logging.getLogger("idempotency")


@dataclass
class CompleteReport:
    found: int = 0
    completed: int = 0  # finished with a stored answer (success or definitive failure)
    failed: int = 0  # failed again, transiently: still pending, lease released
    skipped: int = 0  # taken by someone else meanwhile, or finished already
    gave_up: int = 0  # failed for the last time: finished with the "abandoned" answer
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def complete_abandoned_keys(
    *,
    older_than: timedelta | float | None = None,
    limit: int | None = None,
    using: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> CompleteReport:
    """Run the programs of abandoned pending keys to completion.

    Args:
        older_than: untouched for at least this long (``COMPLETE_AFTER``).
        limit: at most this many keys (100 unless given).
        using: the alias that finds keys across tenants (the system alias);
            the programs themselves run on ``TENANCY["APP_DATABASE"]``, as
            each key's tenant, under row-level security.
        progress: called with a line per key.
    """
    started = time.monotonic()
    alias = system_alias(using)
    require_cross_tenant(alias, ["idempotency_keys"], job="the completer")
    if older_than is None:
        window = idempotency_settings.COMPLETE_AFTER
    else:
        window = as_timedelta(older_than, "older_than", allow_zero=True)
    size = int(limit or COMPLETE_BATCH_SIZE)
    scopes = phases.completable_scopes()
    report = CompleteReport()
    if not scopes:
        metrics.upkeep("complete_keys")
        return report
    keys = store.abandoned_keys(alias, scopes, window, size)
    report.found = len(keys)
    for found in keys:
        tenant_id, scope, key = found.tenant_id, found.scope, found.key
        program = phases.program_for(scope)
        assert program is not None
        stored = found.request_data
        request = IdempotentRequest(
            tenant_id=tenant_id, scope=scope, key=key, fingerprint=found.fingerprint,
            method=found.method, path=found.path,
        )
        try:
            result = phases.execute(
                program,
                request,
                data=stored.get("data"),
                kwargs=stored.get("kwargs") or {},
                principal=stored.get("principal", ""),
                wait=0,
                using=app_alias(),
            )
        except Exception as exc:
            logger.warning("completer: %s/%s/%s failed again: %s", tenant_id, scope, key, exc)
            line = _failed(alias, program, request, report, f"failed again: {exc}")
        else:
            if result.outcome is Outcome.EXECUTED and result.verdict is not Verdict.UNSTORED:
                report.completed += 1
                line = f"completed with {result.value.status_code}"  # type: ignore[union-attr]
                logger.info("completer: finished %s/%s/%s, abandoned by its client: it answers "
                            "%d", tenant_id, scope, key,
                            result.value.status_code)  # type: ignore[union-attr]
            elif result.outcome is Outcome.EXECUTED:
                status = result.value.status_code  # type: ignore[union-attr]
                line = _failed(alias, program, request, report, f"failed again with {status}")
            else:
                report.skipped += 1
                line = f"skipped ({result.outcome.value})"
        if progress:
            progress(f"tenant {tenant_id} scope {scope} key {key!r}: {line}")
    report.seconds = time.monotonic() - started
    metrics.upkeep("complete_keys", report.completed + report.gave_up)
    return report


def _failed(alias: str, program: type[phases.Phases], request: IdempotentRequest,
            report: CompleteReport, line: str) -> str:
    """Count a failed run; give up on the key once it has failed ``COMPLETE_MAX_ATTEMPTS`` times."""
    limit = idempotency_settings.COMPLETE_MAX_ATTEMPTS
    runs = store.count_completer_failure(alias, request)
    if runs is None:  # finished meanwhile (a client's retry)
        report.skipped += 1
        return f"{line}; finished meanwhile"
    if runs < limit:
        report.failed += 1
        return f"{line} (attempt {runs} of {limit})"
    answer = phases.abandoned_answer()
    stopped_at = store.give_up(alias, request, answer, phases.ttl_of(program))
    if stopped_at is None:  # a client's retry holds it now: it decides
        report.failed += 1
        return f"{line} (attempt {runs} of {limit}; in use, not given up)"
    report.gave_up += 1
    logger.error(
        "completer: gave up on %s/%s/%s at recovery point %s after %d failed attempts; it now "
        "answers %d (idempotency_request_abandoned): check what of it took effect",
        request.tenant_id, request.scope, request.key, stopped_at, runs, answer.status_code,
    )
    return f"{line}; gave up after {runs} attempts at {stopped_at}: answers {answer.status_code}"
