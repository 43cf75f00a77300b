"""Idempotency keys for Django REST framework views, stored in PostgreSQL.

``from idempotency import IdempotentViewMixin`` is the usual entry point; the
state machine behind it (:mod:`idempotency.core`) has no DRF import and serves
plain Django views through :func:`idempotent`, and Celery tasks or other code
through :func:`execute`. Requests that call other systems run as
:class:`Phases` programs.

Everything listed in ``__all__`` is the public surface; other modules are
the implementation.
"""

from typing import TYPE_CHECKING

from django_idempotency_outbox import __version__
from django_idempotency_outbox.exports import lazy_exports

__all__ = [
    "Finish",
    "IdempotencyError",
    "IdempotentRequest",
    "IdempotentViewMixin",
    "InvalidKey",
    "LeaseLost",
    "Outcome",
    "PhaseContext",
    "Phases",
    "RecoveryPoint",
    "RequestRefused",
    "Result",
    "Retry",
    "StoredResponse",
    "UnknownRecoveryPoint",
    "__version__",
    "canonical_path",
    "execute",
    "fingerprint",
    "idempotent",
    "parse_key",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "IdempotentViewMixin": "idempotency.mixins",
        "idempotent": "idempotency.decorators",
        "execute": "idempotency.core",
        "parse_key": "idempotency.core",
        "fingerprint": "idempotency.fingerprints",
        "canonical_path": "idempotency.fingerprints",
        "IdempotentRequest": "idempotency.core",
        "Outcome": "idempotency.core",
        "Result": "idempotency.core",
        "StoredResponse": "idempotency.core",
        "Phases": "idempotency.phases",
        "PhaseContext": "idempotency.phases",
        "RecoveryPoint": "idempotency.phases",
        "Finish": "idempotency.phases",
        "Retry": "idempotency.phases",
        "IdempotencyError": "idempotency.exceptions",
        "InvalidKey": "idempotency.exceptions",
        "LeaseLost": "idempotency.exceptions",
        "RequestRefused": "idempotency.exceptions",
        "UnknownRecoveryPoint": "idempotency.exceptions",
    },
)

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from idempotency.core import (
        IdempotentRequest,
        Outcome,
        Result,
        StoredResponse,
        execute,
        parse_key,
    )
    from idempotency.decorators import idempotent
    from idempotency.exceptions import (
        IdempotencyError,
        InvalidKey,
        LeaseLost,
        RequestRefused,
        UnknownRecoveryPoint,
    )
    from idempotency.fingerprints import canonical_path, fingerprint
    from idempotency.mixins import IdempotentViewMixin
    from idempotency.phases import Finish, PhaseContext, Phases, RecoveryPoint, Retry
