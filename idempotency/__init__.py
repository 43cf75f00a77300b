"""Idempotency keys for Django REST framework views, stored in PostgreSQL.

``from idempotency import IdempotentViewMixin`` is the usual entry point; the
state machine behind it (:mod:`idempotency.core`) has no DRF import and serves
plain Django views through :func:`idempotency.decorators.idempotent`.
"""

from typing import Any

__all__ = ["IdempotentViewMixin", "idempotent"]


def __getattr__(name: str) -> Any:
    # Imported lazily: DRF must not be imported while Django loads its apps.
    if name == "IdempotentViewMixin":
        from idempotency.mixins import IdempotentViewMixin

        return IdempotentViewMixin
    if name == "idempotent":
        from idempotency.decorators import idempotent

        return idempotent
    raise AttributeError(f"module 'idempotency' has no attribute {name!r}")
