"""An optional health view for orchestrators' HTTP probes.

Route it where only the orchestrator reaches it::

    from outbox import health_view
    urlpatterns += [path("healthz/outbox", health_view)]

``GET`` answers 200 with ``{"status": "ok", ...}`` when the outbox is moving,
503 with the problems when it is not (:func:`outbox.health.check`), and 503
when the database cannot be asked (or the aliases are misconfigured).
``?reader=NAME`` (repeatable) checks only those readers, e.g. the consumer a
pod runs.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_safe


@require_safe
def health_view(request: HttpRequest) -> JsonResponse:
    from outbox.health import check

    try:
        verdict = check(readers=request.GET.getlist("reader"))
    except (DatabaseError, ImproperlyConfigured) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return JsonResponse({"status": "unhealthy", "problems": [first]}, status=503)
    readers = [
        {
            "reader": r.name, "partition": r.partition, "behind": r.behind,
            "lag_seconds": r.lag.total_seconds() if r.lag else 0.0,
            **({"lease_seconds": r.lease_left} if r.is_relay else {}),
        }
        for r in verdict.readers
    ]
    body = {"status": "ok" if verdict.ok else "unhealthy", "problems": verdict.problems,
            "readers": readers}
    return JsonResponse(body, status=200 if verdict.ok else 503)
